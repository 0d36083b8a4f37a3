"""The solver options, spelled once in [`SolverConfig`][neuralode_lm.SolverConfig] and validated on
construction.

Also the facade's two rules that hold for every backend: the default step cap
(``DEFAULT_MAX_NUM_STEPS``) and the fixed-grid readout rule (``fixed_grid``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ode_transformer.tableau import METHODS

from .errors import SolverConfigError, UnknownSolverOptionError

__all__ = [
    "ADAPTIVE_METHODS",
    "ADJOINT_KINDS",
    "ADJOINT_NORMS",
    "BACKEND_METHODS",
    "DEFAULT_MAX_NUM_STEPS",
    "FIXED_METHODS",
    "SolverConfig",
    "fixed_grid",
]

FIXED_METHODS = frozenset(METHODS)
"""Fixed-grid names: the consistent tableaux of the one registry
([`ode_transformer.METHODS`][ode_transformer.METHODS], from ``TABLEAUX``): ``rk4`` is the classic
RK4 on every backend, ``rk4_38`` the 3/8 rule (torchdiffeq's own ``rk4``)."""
ADAPTIVE_METHODS = frozenset({"dopri5", "dopri8", "bosh3", "adaptive_heun", "fehlberg2", "tsit5"})

# The facade's method names each backend offers (adapters translate the few that differ).
# Every backend steps every fixed-grid method, a tableau (torchdiffeq's ``TableauSolver``,
# TorchDyn's ``_TableauStep``, torchode's ``_TableauMethod``), beside its adaptive ones.
BACKEND_METHODS: dict[str, frozenset[str]] = {
    "torchdiffeq": frozenset({"dopri5", "dopri8", "bosh3", "adaptive_heun", "fehlberg2"})
    | FIXED_METHODS,
    "torchdyn": frozenset({"dopri5", "tsit5"}) | FIXED_METHODS,
    "torchode": frozenset({"dopri5", "tsit5", "adaptive_heun"}) | FIXED_METHODS,
}

ADJOINT_KINDS = ("direct", "backsolve", "interpolated")
ADJOINT_NORMS = ("mixed", "seminorm")
"""Error norms of the adjoint's backward solve: torchdiffeq's default (the largest RMS of
the state, the adjoint state and the parameter gradients) or the seminorm (Kidger et al.
2021), which leaves the parameter gradients out of step-size control: the same gradients
within tolerance, usually with fewer backward steps."""

# A healthy solve of a trained NODE-LM head takes tens of steps; a stiff or diverging field
# can take millions. The cap turns such a solve into a MaxStepsExceeded error in seconds.
DEFAULT_MAX_NUM_STEPS = 1000


@dataclass(frozen=True)
class SolverConfig:
    """How to solve: method, tolerances, gradients, backend and limits.

    Attributes:
        method: dopri5, dopri8, bosh3, adaptive_heun, fehlberg2, tsit5 (adaptive) or
            a fixed-grid tableau of ``FIXED_METHODS`` (euler, midpoint, rk2, rk3, rk4
            (classic), rk4_38 (3/8 rule); need ``step_size``); backends offer subsets
            (``BACKEND_METHODS``).
        rtol, atol: tolerances of adaptive methods (positive).
        adjoint: False for direct backpropagation, True (or "backsolve") for the adjoint
            method, "interpolated" for TorchDyn's interpolated adjoint.
        backend: "torchdiffeq" (default), "torchdyn" or "torchode". torchode controls the
            step size of every row of ``y0.reshape(-1, D)`` separately and calls the field
            with ``s`` of shape ``y0.shape[:-1]``; the others share one step size and a
            scalar ``s``.
        step_size: the longest step of fixed-grid methods; see ``fixed_grid``.
        max_num_steps: the most steps (accepted and rejected) one solve may take, default
            ``DEFAULT_MAX_NUM_STEPS``; beyond it [`MaxStepsExceeded`][neuralode_lm.MaxStepsExceeded]
            is raised with the NFE and last step size. ``None`` removes the cap.
        adjoint_method, adjoint_rtol, adjoint_atol: options of the backward solve
            (default: those of the forward solve).
        adjoint_norm: the backward solve's error norm, ``"mixed"`` (torchdiffeq's default)
            or ``"seminorm"`` (``ADJOINT_NORMS``; torchdiffeq's adjoint with an
            adaptive method only).
    """

    method: str = "dopri5"
    rtol: float = 1e-3
    atol: float = 1e-4
    adjoint: bool | str = False
    backend: str = "torchdiffeq"
    step_size: float | None = None
    max_num_steps: int | None = DEFAULT_MAX_NUM_STEPS
    adjoint_method: str | None = None
    adjoint_rtol: float | None = None
    adjoint_atol: float | None = None
    adjoint_norm: str = "mixed"

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def coerce(
        cls, value: SolverConfig | dict[str, Any] | None = None, **options: Any
    ) -> SolverConfig:
        """A config from ``None`` (defaults), a dict of options or a config, with
        ``options`` overriding single fields."""
        if value is None:
            value = {}
        elif isinstance(value, cls):
            value = {field.name: getattr(value, field.name) for field in dataclasses.fields(cls)}
        elif not isinstance(value, dict):
            raise TypeError(
                f"solver must be a SolverConfig, a dict or None, got {type(value).__name__}"
            )
        merged = {**value, **options}
        unknown = set(merged) - {field.name for field in dataclasses.fields(cls)}
        if "steps" in unknown:
            raise UnknownSolverOptionError(
                "the solver's step setting is step_size (the longest step, e.g. "
                "step_size=0.25), not steps"
            )
        if unknown:
            raise UnknownSolverOptionError(
                f"unknown solver option(s) {sorted(unknown)}; valid: "
                f"{', '.join(field.name for field in dataclasses.fields(cls))}"
            )
        return cls(**merged)

    @property
    def adjoint_kind(self) -> str:
        """``"direct"``, ``"backsolve"`` or ``"interpolated"``."""
        return _adjoint_kind(self.adjoint)

    @property
    def fixed(self) -> bool:
        """Whether the method steps on a fixed grid (``step_size``) rather than adaptively."""
        return self.method in FIXED_METHODS


def fixed_grid(
    t: torch.Tensor, step_size: float, host: Sequence[float] | None = None
) -> torch.Tensor:
    """The grid of fixed-grid methods, the same for every backend.

    Each interval ``[t_i, t_{i+1}]`` between consecutive requested times is split into the
    fewest equal steps no longer than ``step_size``, so every requested time is a grid point
    and no backend interpolates a readout. "No longer" allows for rounding: the times (and a
    ``step_size`` read off them) are off by up to an ulp of the largest time, in float32 at
    least as times are often built in float32, so an interval within a few such ulps (at
    most a tenth of a step) of ``n * step_size`` takes ``n`` steps. A ``step_size`` read off
    a float32 ``torch.linspace`` thus steps once per interval, as the user meant.

    ``host``: the values of ``t`` as the host knows them (each exactly ``t``'s), so that the
    grid is built on ``t``'s device without reading ``t`` back (no host sync); without it
    the times are read back once.
    """
    return grid_marks(t, step_size, host)[0]


def grid_marks(
    t: torch.Tensor, step_size: float, host: Sequence[float] | None = None
) -> tuple[torch.Tensor, list[int]]:
    """``fixed_grid(t, step_size, host)`` and the index in it of each time of ``t``."""
    values = list(host) if host is not None else t.tolist()  # the one read of the times
    ulp = _time_ulp(values, t.dtype)
    pieces, marks = [t[:1]], [0]
    for i, (start, end) in enumerate(itertools.pairwise(values)):
        steps = _interval_steps(start, end, step_size, ulp, t.dtype)
        piece = torch.linspace(start, end, steps + 1, dtype=t.dtype, device=t.device)
        piece[-1] = t[i + 1]
        pieces.append(piece[1:])
        marks.append(marks[-1] + steps)
    return torch.cat(pieces), marks


def grid_steps(
    t: torch.Tensor | Sequence[float], step_size: float, dtype: torch.dtype | None = None
) -> int:
    """The number of steps of ``fixed_grid(t, step_size)``, counted without building it (a
    tiny ``step_size`` is refused before a huge grid is allocated). ``t`` may be the times'
    values on the host, of ``dtype`` (default: float32)."""
    if isinstance(t, torch.Tensor):
        values, dtype = t.tolist(), t.dtype
    else:
        values, dtype = list(t), dtype or torch.float32
    ulp = _time_ulp(values, dtype)
    return sum(_interval_steps(a, b, step_size, ulp, dtype) for a, b in itertools.pairwise(values))


def rounded(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` on the host (no tensor, so no sync): the value a
    tensor of ``dtype`` made from it holds."""
    code = {torch.float32: "f", torch.float16: "e"}.get(dtype)
    if dtype == torch.float64 or not math.isfinite(value):
        return float(value)
    if code is None:  # bfloat16: a CPU tensor, never a device's
        return float(torch.tensor(value, dtype=dtype))
    try:
        return float(struct.unpack(code, struct.pack(code, value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def _time_ulp(values: Sequence[float], dtype: torch.dtype) -> float:
    """The rounding of the times: an ulp of the largest, in float32 at least."""
    eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)
    return eps * max(abs(values[0]), abs(values[-1]))


def _interval_steps(
    start: float, end: float, step_size: float, ulp: float, dtype: torch.dtype
) -> int:
    """The fewest equal steps no longer than ``step_size`` (up to rounding, see
    ``fixed_grid``) from ``start`` to ``end``, whose difference is taken in ``dtype``."""
    ratio = abs(rounded(end - start, dtype)) / step_size  # the adjoint runs t1 -> t0
    slack = min(0.1, max(1e-12 * ratio, 2 * (1 + ratio) * ulp / step_size))
    return max(1, math.ceil(ratio - slack))


def _adjoint_kind(adjoint: bool | str) -> str:
    if adjoint is False:
        return "direct"
    if adjoint is True:
        return "backsolve"
    if isinstance(adjoint, str) and adjoint in ADJOINT_KINDS:
        return adjoint
    raise SolverConfigError(
        f"adjoint must be False, True or one of {', '.join(map(repr, ADJOINT_KINDS))}, "
        f"got {adjoint!r}"
    )


def _check_method(backend: str, method: str, what: str = "method") -> None:
    known = FIXED_METHODS | ADAPTIVE_METHODS
    if method not in known:
        raise SolverConfigError(f"unknown {what} {method!r}; valid: {', '.join(sorted(known))}")
    if method not in BACKEND_METHODS[backend]:
        offering = [name for name, methods in BACKEND_METHODS.items() if method in methods]
        raise SolverConfigError(
            f"backend {backend!r} has no {what} {method!r}; it offers "
            f"{', '.join(sorted(BACKEND_METHODS[backend]))}; backends with {method!r}: "
            f"{', '.join(offering)}"
        )


def _validate(cfg: SolverConfig) -> None:
    if cfg.backend not in BACKEND_METHODS:
        raise SolverConfigError(
            f"unknown backend {cfg.backend!r}; valid: {', '.join(sorted(BACKEND_METHODS))}"
        )
    _check_method(cfg.backend, cfg.method)
    for name in ("rtol", "atol", "adjoint_rtol", "adjoint_atol"):
        value = getattr(cfg, name)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise SolverConfigError(f"{name} must be a positive number, got {value!r}")
    if cfg.fixed:
        if cfg.step_size is None:
            raise SolverConfigError(
                f"fixed-grid method {cfg.method!r} needs step_size (e.g. step_size=0.25); "
                f"or pick an adaptive method: {', '.join(sorted(ADAPTIVE_METHODS))}"
            )
        if not cfg.step_size > 0:
            raise SolverConfigError(f"step_size must be positive, got {cfg.step_size!r}")
    elif cfg.step_size is not None:
        raise SolverConfigError(
            f"step_size applies to fixed-grid methods ({', '.join(sorted(FIXED_METHODS))}), "
            f"not to the adaptive {cfg.method!r}; use rtol/atol"
        )
    steps = cfg.max_num_steps
    if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool)):
        raise SolverConfigError(f"max_num_steps must be a positive int or None, got {steps!r}")
    if steps is not None and steps <= 0:
        raise SolverConfigError(f"max_num_steps must be a positive int or None, got {steps!r}")
    kind = _adjoint_kind(cfg.adjoint)
    if cfg.adjoint_method is not None:
        _check_method(cfg.backend, cfg.adjoint_method, "adjoint_method")
        if cfg.backend != "torchdiffeq" and cfg.adjoint_method != cfg.method:
            raise SolverConfigError(
                f"backend {cfg.backend!r} solves the adjoint with the forward method; "
                "adjoint_method may differ from method only with backend='torchdiffeq'"
            )
        if cfg.adjoint_method in FIXED_METHODS and not cfg.fixed:
            raise SolverConfigError(
                "a fixed-grid adjoint_method needs a fixed-grid method (step_size)"
            )
    _check_adjoint_norm(cfg, kind)
    if kind != "direct" and cfg.backend == "torchdyn" and cfg.fixed:
        raise SolverConfigError("TorchDyn's adjoints need an adaptive method (e.g. dopri5) here")
    if kind == "interpolated" and cfg.backend != "torchdyn":
        raise SolverConfigError(
            "the interpolated adjoint is TorchDyn's; use backend='torchdyn' or adjoint=True"
        )


def _check_adjoint_norm(cfg: SolverConfig, kind: str) -> None:
    if cfg.adjoint_norm not in ADJOINT_NORMS:
        raise SolverConfigError(
            f"unknown adjoint_norm {cfg.adjoint_norm!r}; valid: {', '.join(ADJOINT_NORMS)}"
        )
    if cfg.adjoint_norm == "mixed":
        return
    if kind != "backsolve" or cfg.backend != "torchdiffeq" or cfg.fixed:
        raise SolverConfigError(
            "adjoint_norm='seminorm' controls the steps of torchdiffeq's adjoint backward "
            "solve: it needs adjoint=True, backend='torchdiffeq' and an adaptive method "
            f"(got adjoint={cfg.adjoint!r}, backend={cfg.backend!r}, method={cfg.method!r})"
        )
