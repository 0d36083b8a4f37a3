"""One solver facade over torchdiffeq, TorchDyn and torchode.

``solve(field, y0, t, ...)`` integrates ``dz/ds = field(s, z)`` from ``t[0]`` through every
time in ``t`` and returns the states ``[len(t), *y0.shape]`` with a :class:`SolverStats`.
The facade only translates names and options and watches the solve (function evaluations,
steps, a hard cap on steps, non-finite states); every number is computed by the backend
library. TorchDyn and torchode are optional: asking for one that is not installed raises an
error that says how to install it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from odelm.errors import OdelmError

__all__ = [
    "ADAPTIVE_METHODS",
    "BACKEND_METHODS",
    "FIXED_METHODS",
    "MaxStepsExceeded",
    "NonFiniteStateError",
    "SolverConfig",
    "SolverError",
    "SolverStats",
    "StepSizeUnderflowError",
    "solve",
]

FIXED_METHODS = frozenset({"euler", "midpoint", "rk4"})
ADAPTIVE_METHODS = frozenset({"dopri5", "dopri8", "bosh3", "adaptive_heun", "fehlberg2", "tsit5"})

# Facade name -> the backend's own name, for every (backend, method) pair the backend offers.
BACKEND_METHODS: dict[str, dict[str, str]] = {
    "torchdiffeq": {
        "dopri5": "dopri5",
        "dopri8": "dopri8",
        "bosh3": "bosh3",
        "adaptive_heun": "adaptive_heun",
        "fehlberg2": "fehlberg2",
        "euler": "euler",
        "midpoint": "midpoint",
        "rk4": "rk4",
    },
    "torchdyn": {
        "dopri5": "dopri5",
        "tsit5": "tsit5",
        "euler": "euler",
        "midpoint": "midpoint",
        "rk4": "rk4",
    },
    # torchode's "heun" is the adaptive Heun-Euler pair, torchdiffeq's "adaptive_heun".
    "torchode": {"dopri5": "dopri5", "tsit5": "tsit5", "adaptive_heun": "heun", "euler": "euler"},
}

ADJOINT_KINDS = ("direct", "backsolve", "interpolated")
_INSTALL_HINT = {
    "torchdyn": "pip install --no-deps torchdyn && pip install torchsde torchcde attrs "
    "(or `pip install odelm[torchdyn]` plus `--no-deps torchdyn`)",
    "torchode": "pip install torchode (or `pip install odelm[torchode]`)",
}


class SolverError(OdelmError, RuntimeError):
    """A solve stopped early; carries the NFE, step count and last step size when it did."""

    def __init__(
        self, message: str, *, nfe: int, steps: int, last_step_size: float | None, phase: str
    ) -> None:
        super().__init__(message)
        self.nfe = nfe
        self.steps = steps
        self.last_step_size = last_step_size
        self.phase = phase


class MaxStepsExceeded(SolverError):
    """The solver needed more steps than ``max_num_steps`` allows."""


class NonFiniteStateError(SolverError):
    """The state or the vector field became NaN or infinite during the solve."""


class StepSizeUnderflowError(SolverError):
    """The adaptive step size shrank to zero (below float resolution) with finite states."""


@dataclass
class SolverStats:
    """Counts for one solve; ``nfe_backward`` keeps growing while the backward pass runs.

    ``nfe_forward`` counts evaluations of the field (each on the whole batch of states)
    during the solve. ``nfe_backward`` counts field evaluations in the adjoint's backward
    solve, or, for direct backpropagation, the vector-Jacobian products autograd takes
    through the field's recorded evaluations. Steps are forward steps (accepted and
    rejected); with torchode, whose step control is per sample, they are the maximum over
    samples.
    """

    backend: str
    method: str
    adjoint: str
    nfe_forward: int = 0
    nfe_backward: int = 0
    accepted_steps: int | None = None
    rejected_steps: int | None = None


@dataclass(frozen=True)
class SolverConfig:
    """Solver options in one value, validated on construction; ``config.solve(f, y0, t)``."""

    method: str = "dopri5"
    rtol: float = 1e-3
    atol: float = 1e-4
    adjoint: bool | str = False
    backend: str = "torchdiffeq"
    step_size: float | None = None
    max_num_steps: int | None = None
    adjoint_method: str | None = None
    adjoint_rtol: float | None = None
    adjoint_atol: float | None = None

    def __post_init__(self) -> None:
        _validate_options(self)

    @classmethod
    def coerce(cls, value: SolverConfig | dict[str, Any] | None) -> SolverConfig:
        """A config from ``None`` (defaults), a dict of options, or a config."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise TypeError(
                    f"unknown solver option(s) {sorted(unknown)}; valid: "
                    f"{', '.join(cls.__dataclass_fields__)}"
                )
            return cls(**value)
        raise TypeError(
            f"solver must be a SolverConfig, a dict or None, got {type(value).__name__}"
        )

    @property
    def adjoint_kind(self) -> str:
        """``"direct"``, ``"backsolve"`` or ``"interpolated"``."""
        return _adjoint_kind(self.adjoint)

    def solve(
        self, field: Callable[..., torch.Tensor], y0: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, SolverStats]:
        """``solve(field, y0, t, **options)`` with this config's options."""
        return solve(field, y0, t, **self.__dict__)


def _adjoint_kind(adjoint: bool | str) -> str:
    if adjoint is False:
        return "direct"
    if adjoint is True:
        return "backsolve"
    if isinstance(adjoint, str) and adjoint in ADJOINT_KINDS:
        return adjoint
    raise ValueError(
        f"adjoint must be False, True or one of {', '.join(map(repr, ADJOINT_KINDS))}, "
        f"got {adjoint!r}"
    )


def _check_method(backend: str, method: str, what: str = "method") -> None:
    if method not in FIXED_METHODS | ADAPTIVE_METHODS:
        raise ValueError(
            f"unknown {what} {method!r}; valid: {', '.join(sorted(FIXED_METHODS | ADAPTIVE_METHODS))}"
        )
    if method not in BACKEND_METHODS[backend]:
        offering = [b for b, methods in BACKEND_METHODS.items() if method in methods]
        raise ValueError(
            f"backend {backend!r} has no {what} {method!r}; it offers "
            f"{', '.join(sorted(BACKEND_METHODS[backend]))}; backends with {method!r}: "
            f"{', '.join(offering)}"
        )


def _validate_options(cfg: SolverConfig) -> None:
    if cfg.backend not in BACKEND_METHODS:
        raise ValueError(
            f"unknown backend {cfg.backend!r}; valid: {', '.join(sorted(BACKEND_METHODS))}"
        )
    _check_method(cfg.backend, cfg.method)
    for name in ("rtol", "atol", "adjoint_rtol", "adjoint_atol"):
        value = getattr(cfg, name)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if cfg.method in FIXED_METHODS:
        if cfg.step_size is None:
            raise ValueError(
                f"fixed-grid method {cfg.method!r} needs step_size (e.g. step_size=0.25); "
                f"or pick an adaptive method: {', '.join(sorted(ADAPTIVE_METHODS))}"
            )
        if not cfg.step_size > 0:
            raise ValueError(f"step_size must be positive, got {cfg.step_size!r}")
    elif cfg.step_size is not None:
        raise ValueError(
            f"step_size applies to fixed-grid methods ({', '.join(sorted(FIXED_METHODS))}), "
            f"not to the adaptive {cfg.method!r}; use rtol/atol"
        )
    if cfg.max_num_steps is not None and not (
        isinstance(cfg.max_num_steps, int) and cfg.max_num_steps > 0
    ):
        raise ValueError(f"max_num_steps must be a positive int, got {cfg.max_num_steps!r}")
    kind = _adjoint_kind(cfg.adjoint)
    if cfg.adjoint_method is not None:
        _check_method(cfg.backend, cfg.adjoint_method, "adjoint_method")
        if cfg.backend != "torchdiffeq" and cfg.adjoint_method != cfg.method:
            raise ValueError(
                f"backend {cfg.backend!r} solves the adjoint with the forward method; "
                "adjoint_method may differ from method only with backend='torchdiffeq'"
            )
        if cfg.adjoint_method in FIXED_METHODS and cfg.method not in FIXED_METHODS:
            raise ValueError("a fixed-grid adjoint_method needs a fixed-grid method (step_size)")
    if kind != "direct" and cfg.backend == "torchdyn" and cfg.method in FIXED_METHODS:
        raise ValueError("TorchDyn's adjoints need an adaptive method (e.g. dopri5) here")
    if kind == "interpolated" and cfg.backend != "torchdyn":
        raise ValueError(
            "the interpolated adjoint is TorchDyn's; use backend='torchdyn' or adjoint=True"
        )


def _import_backend(backend: str) -> Any:
    try:
        if backend == "torchdiffeq":
            import torchdiffeq as module
        elif backend == "torchdyn":
            from torchdyn.core import ODEProblem
            from torchdyn.numerics import odeint
            from torchdyn.numerics.solvers.ode import str_to_solver

            module = SimpleNamespace(odeint=odeint, ODEProblem=ODEProblem, solver=str_to_solver)
        else:
            import torchode as module
    except ImportError as error:
        hint = _INSTALL_HINT.get(backend, "pip install torchdiffeq")
        raise ImportError(
            f"backend {backend!r} is not installed; install it with: {hint}"
        ) from error
    return module


class _Monitor:
    """Counts evaluations and steps of one solve and stops it when it goes wrong."""

    def __init__(self, stats: SolverStats, max_num_steps: int | None) -> None:
        self.stats = stats
        self.max_num_steps = max_num_steps
        self.phase = "forward"
        self.steps = 0
        self.last_dt: torch.Tensor | float | None = None
        self.last_running: torch.Tensor | None = None
        self.last_output: torch.Tensor | None = None
        self.previous_t: torch.Tensor | None = None

    def enter_backward(self) -> None:
        self.phase = "backward"
        self.steps = 0
        self.previous_t = None

    def count_vjp(self, grad: torch.Tensor) -> None:
        self.stats.nfe_backward += 1

    def on_eval(self, out: torch.Tensor) -> None:
        self.last_output = out
        if self.phase == "forward":
            self.stats.nfe_forward += 1
            if torch.is_grad_enabled() and out.requires_grad:
                out.register_hook(self.count_vjp)
        else:
            self.stats.nfe_backward += 1

    @property
    def nfe(self) -> int:
        return self.stats.nfe_forward if self.phase == "forward" else self.stats.nfe_backward

    def _last_dt(self) -> float | None:
        dt = self.last_dt
        if dt is None:
            return None
        if isinstance(dt, torch.Tensor):
            dt = dt.detach().abs()
            if self.last_running is not None and bool(self.last_running.any()):
                dt = dt[self.last_running]
            dt = float(dt.min()) if dt.numel() else None
        return dt

    def fail(self, kind: type[SolverError], reason: str) -> SolverError:
        dt = self._last_dt()
        return kind(
            f"{reason} ({self.phase} solve, step {self.steps}, NFE {self.nfe}, "
            f"last step size {dt if dt is None else f'{dt:.3g}'}); "
            + _ADVICE.get(kind, "see the backend's documentation"),
            nfe=self.nfe,
            steps=self.steps,
            last_step_size=dt,
            phase=self.phase,
        )

    def on_step(self, t: torch.Tensor, y: Any, dt: torch.Tensor) -> None:
        """Called before each step (accepted or rejected) with its start time and size."""
        self.steps += 1
        self.last_dt = dt
        if self.max_num_steps is not None and self.steps > self.max_num_steps:
            raise self.fail(MaxStepsExceeded, f"more than max_num_steps={self.max_num_steps} steps")
        states = y if isinstance(y, (tuple, list)) else (y,)
        t, dt = t.detach(), dt.detach()
        dt_ok = bool(torch.isfinite(dt)) and float(dt) != 0.0 and float(t + dt) != float(t)
        if not dt_ok or not all(bool(torch.isfinite(s).all()) for s in states):
            self.diagnose()

    def diagnose(self) -> None:
        """Raise the error that explains a bad step: non-finite values or a vanishing step."""
        out = self.last_output
        if out is not None and not bool(torch.isfinite(out).all()):
            raise self.fail(NonFiniteStateError, "the vector field returned non-finite values")
        dt = self.last_dt
        if dt is not None and not bool(torch.isfinite(torch.as_tensor(dt)).all()):
            raise self.fail(NonFiniteStateError, "the step size became non-finite")
        raise self.fail(StepSizeUnderflowError, "the step size underflowed to zero")

    def on_torchdyn_step(self, t: torch.Tensor, x: torch.Tensor, dt: torch.Tensor) -> None:
        """TorchDyn reports no step outcome: a step was accepted when the next starts later."""
        if self.previous_t is not None and self.phase == "forward":
            self._count_outcome(bool(t != self.previous_t))
        self.previous_t = t
        self.on_step(t, x, dt)

    def _count_outcome(self, accepted: bool) -> None:
        if self.stats.accepted_steps is None:
            self.stats.accepted_steps, self.stats.rejected_steps = 0, 0
        if accepted:
            self.stats.accepted_steps += 1
        else:
            self.stats.rejected_steps += 1


_ADVICE = {
    MaxStepsExceeded: "the dynamics may be stiff or the tolerances too tight: raise "
    "max_num_steps, loosen rtol/atol, or regularise the field (kinetic/Jacobian)",
    NonFiniteStateError: "the dynamics diverged: lower the learning rate, shorten the "
    "integration interval, or regularise the field",
    StepSizeUnderflowError: "the solver cannot meet rtol/atol: loosen them or use a "
    "fixed-grid method with step_size",
}


class _MonitoredField(nn.Module):
    """Calls the user's field with the user's state shape and reports each evaluation."""

    def __init__(
        self, field: Callable[..., torch.Tensor], monitor: _Monitor, shape: torch.Size
    ) -> None:
        super().__init__()
        self.field = field
        self.monitor = monitor
        self.shape = shape

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # torchode flattens the state to [rows, features] with one time per row; restore the
        # caller's shape so the field sees what it would see with the other backends.
        flat = x.shape != self.shape and x.dim() == 2 and x.numel() == math.prod(self.shape)
        if flat:
            out = self.field(t.reshape(self.shape[:-1]), x.reshape(self.shape)).reshape(x.shape)
        else:
            out = self.field(t, x)
        self.monitor.on_eval(out)
        return out

    # torchdiffeq callbacks, installed as attributes only where the method supports them
    def _accept(self, t0: torch.Tensor, y0: Any, dt: torch.Tensor) -> None:
        if self.monitor.phase == "forward":
            self.monitor._count_outcome(True)

    def _reject(self, t0: torch.Tensor, y0: Any, dt: torch.Tensor) -> None:
        if self.monitor.phase == "forward":
            self.monitor._count_outcome(False)


class _TorchDynSolverSpy:
    """A TorchDyn solver whose ``step`` reports to the monitor first."""

    def __init__(self, solver: nn.Module, monitor: _Monitor) -> None:
        self._solver = solver
        self._monitor = monitor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._solver, name)

    def step(self, f: Callable, x: torch.Tensor, t: torch.Tensor, dt: torch.Tensor, **kw: Any):
        self._monitor.on_torchdyn_step(t, x, dt)
        return self._solver.step(f, x, t, dt, **kw)


class _TorchodeStepSpy:
    """A torchode step method that records each step size (per sample) before stepping."""

    def __init__(self, method: nn.Module, monitor: _Monitor) -> None:
        self._method = method
        self._monitor = monitor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)

    def step(self, term: Any, running: torch.Tensor, y: torch.Tensor, t: torch.Tensor, dt, *a, **k):
        self._monitor.last_dt, self._monitor.last_running = dt, running
        return self._method.step(term, running, y, t, dt, *a, **k)


def _as_time(t: torch.Tensor | Sequence[float] | float, y0: torch.Tensor) -> torch.Tensor:
    if isinstance(t, (int, float)):
        t = [0.0, float(t)]
    t = torch.as_tensor(t, dtype=y0.dtype, device=y0.device)
    if t.dim() != 1 or t.numel() < 2:
        raise ValueError(
            f"t must be a 1-D tensor of at least two times [t0, ..., t1], got shape {tuple(t.shape)}"
        )
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"t must be finite, got {t.tolist()}")
    if float(t[-1] - t[0]) == 0.0:
        raise ValueError(
            f"the integration interval has zero length (t0 = t1 = {float(t[0])}); "
            "integrate over s in [0, S] with S > 0"
        )
    if not bool((t[1:] > t[:-1]).all()):
        raise ValueError(f"t must be strictly increasing, got {t.tolist()}")
    return t


def solve(
    field: Callable[..., torch.Tensor],
    y0: torch.Tensor,
    t: torch.Tensor | Sequence[float] | float,
    *,
    method: str = "dopri5",
    rtol: float = 1e-3,
    atol: float = 1e-4,
    adjoint: bool | str = False,
    backend: str = "torchdiffeq",
    step_size: float | None = None,
    max_num_steps: int | None = None,
    adjoint_method: str | None = None,
    adjoint_rtol: float | None = None,
    adjoint_atol: float | None = None,
) -> tuple[torch.Tensor, SolverStats]:
    """Integrate ``dz/ds = field(s, z)``, ``z(t[0]) = y0``; return ``(z(t), stats)``.

    Args:
        field: an ``nn.Module`` (or callable) ``field(s, z) -> dz/ds`` of ``z``'s shape; the
            adjoint needs an ``nn.Module`` so that it can find the parameters.
        y0: the initial state, any shape ``[..., D]``.
        t: strictly increasing times ``[t0, ..., t1]`` (a number ``S`` means ``[0, S]``).
        method: dopri5, dopri8, bosh3, adaptive_heun, fehlberg2, tsit5 (adaptive) or
            euler, midpoint, rk4 (fixed grid, need ``step_size``); backends offer subsets.
        rtol, atol: tolerances of adaptive methods (positive).
        adjoint: False for direct backpropagation, True (or "backsolve") for the adjoint
            method, "interpolated" for TorchDyn's interpolated adjoint.
        backend: "torchdiffeq" (default), "torchdyn" or "torchode". torchode controls the
            step size of every row of ``y0.reshape(-1, D)`` separately and calls the field
            with ``s`` of shape ``y0.shape[:-1]``; the others share one step size and a
            scalar ``s``.
        step_size: the step of fixed-grid methods.
        max_num_steps: the most steps (accepted and rejected) one solve may take; beyond
            it :class:`MaxStepsExceeded` is raised with the NFE and last step size.
        adjoint_method, adjoint_rtol, adjoint_atol: options of the backward solve
            (default: those of the forward solve).

    Returns:
        ``states`` of shape ``[len(t), *y0.shape]`` and the solve's :class:`SolverStats`
        (``nfe_backward`` is filled in by the backward pass).

    Raises:
        ValueError on bad options, ImportError for a missing optional backend,
        MaxStepsExceeded, NonFiniteStateError or StepSizeUnderflowError when the solve fails.
    """
    cfg = SolverConfig(
        method=method,
        rtol=rtol,
        atol=atol,
        adjoint=adjoint,
        backend=backend,
        step_size=step_size,
        max_num_steps=max_num_steps,
        adjoint_method=adjoint_method,
        adjoint_rtol=adjoint_rtol,
        adjoint_atol=adjoint_atol,
    )
    if not isinstance(y0, torch.Tensor) or not y0.is_floating_point():
        raise TypeError("y0 must be a floating-point tensor")
    if y0.dim() == 0 or y0.numel() == 0:
        raise ValueError(f"y0 must have a feature dimension and elements, got shape {y0.shape}")
    if not bool(torch.isfinite(y0).all()):
        raise NonFiniteStateError(
            "the initial state y0 has non-finite values (step 0, NFE 0)",
            nfe=0,
            steps=0,
            last_step_size=None,
            phase="forward",
        )
    if cfg.adjoint_kind != "direct" and not isinstance(field, nn.Module):
        raise TypeError("the adjoint needs the field to be an nn.Module (to find its parameters)")
    times = _as_time(t, y0)
    module = _import_backend(cfg.backend)
    stats = SolverStats(backend=cfg.backend, method=cfg.method, adjoint=cfg.adjoint_kind)
    monitor = _Monitor(stats, cfg.max_num_steps)
    wrapped = _MonitoredField(field, monitor, y0.shape)
    runner = {"torchdiffeq": _torchdiffeq, "torchdyn": _torchdyn, "torchode": _torchode}
    states = runner[cfg.backend](module, wrapped, y0, times, cfg, monitor)
    if not bool(torch.isfinite(states[-1]).all()):
        raise monitor.fail(NonFiniteStateError, "the final state is non-finite")
    monitor.enter_backward()
    return states, stats


def _torchdiffeq(
    module: Any,
    wrapped: _MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: _Monitor,
) -> torch.Tensor:
    fixed = cfg.method in FIXED_METHODS
    wrapped.callback_step = monitor.on_step
    wrapped.callback_step_adjoint = monitor.on_step
    if not fixed:
        wrapped.callback_accept_step = wrapped._accept
        wrapped.callback_reject_step = wrapped._reject
        monitor.stats.accepted_steps, monitor.stats.rejected_steps = 0, 0
    options = {"step_size": cfg.step_size} if fixed else {}
    try:
        if cfg.adjoint_kind == "direct":
            states = module.odeint(
                wrapped, y0, t, rtol=cfg.rtol, atol=cfg.atol, method=cfg.method, options=options
            )
        else:
            adjoint_method = cfg.adjoint_method or cfg.method
            states = module.odeint_adjoint(
                wrapped,
                y0,
                t,
                rtol=cfg.rtol,
                atol=cfg.atol,
                method=cfg.method,
                options=options,
                adjoint_method=adjoint_method,
                adjoint_rtol=cfg.adjoint_rtol or cfg.rtol,
                adjoint_atol=cfg.adjoint_atol or cfg.atol,
                adjoint_options=dict(options) if adjoint_method in FIXED_METHODS else {},
                adjoint_params=tuple(p for p in wrapped.parameters() if p.requires_grad),
            )
    except AssertionError as error:  # torchdiffeq's own checks, e.g. "underflow in dt"
        raise monitor.fail(StepSizeUnderflowError, f"torchdiffeq stopped: {error}") from error
    if fixed:
        monitor.stats.accepted_steps, monitor.stats.rejected_steps = monitor.steps, 0
    return states


def _fixed_grid(t: torch.Tensor, step_size: float) -> torch.Tensor:
    """torchdiffeq's grid: ``t0 + k * step_size`` up to ``t1``, plus the requested times."""
    n = math.ceil(float(t[-1] - t[0]) / step_size - 1e-9)
    grid = t[0] + torch.arange(n + 1, dtype=t.dtype, device=t.device) * step_size
    grid[-1] = t[-1]
    grid = torch.cat([grid, t]).unique(sorted=True)
    keep = torch.ones_like(grid, dtype=torch.bool)
    keep[1:] = (grid[1:] - grid[:-1]) > 1e-12 * max(1.0, float(t[-1].abs()))
    return grid[keep]


def _torchdyn(
    module: Any,
    wrapped: _MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: _Monitor,
) -> torch.Tensor:
    name = BACKEND_METHODS["torchdyn"][cfg.method]
    solver = _TorchDynSolverSpy(module.solver(name, y0.dtype), monitor)
    fixed = cfg.method in FIXED_METHODS
    span, save_at = (_fixed_grid(t, cfg.step_size), t) if fixed else (t, ())
    if cfg.adjoint_kind == "direct":
        tolerances = {} if fixed else {"atol": cfg.atol, "rtol": cfg.rtol}
        _, states = module.odeint(wrapped, y0, span, solver, save_at=save_at, **tolerances)
    else:
        problem = module.ODEProblem(
            wrapped,
            solver,
            atol=cfg.atol,
            rtol=cfg.rtol,
            sensitivity="adjoint" if cfg.adjoint_kind == "backsolve" else "interpolated_adjoint",
            atol_adjoint=cfg.adjoint_atol or cfg.atol,
            rtol_adjoint=cfg.adjoint_rtol or cfg.rtol,
        )
        _, states = problem.odeint(y0, span, save_at=save_at)
    if fixed:
        monitor.stats.accepted_steps, monitor.stats.rejected_steps = monitor.steps, 0
    else:
        monitor._count_outcome(True)  # the last step of a finished solve was accepted
    return states


def _torchode(
    module: Any,
    wrapped: _MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: _Monitor,
) -> torch.Tensor:
    features = y0.shape[-1]
    flat = y0.reshape(-1, features)
    rows = flat.shape[0]
    term = module.ODETerm(wrapped)
    methods = {"dopri5": module.Dopri5, "tsit5": module.Tsit5, "heun": module.Heun}
    methods["euler"] = module.Euler
    step_method = methods[BACKEND_METHODS["torchode"][cfg.method]](term=term)
    fixed = cfg.method in FIXED_METHODS
    if fixed:
        controller = module.FixedStepController()
        dt0 = torch.full((rows,), cfg.step_size, dtype=y0.dtype, device=y0.device)
    else:
        controller = module.IntegralController(atol=cfg.atol, rtol=cfg.rtol, term=term)
        dt0 = None
    spy = _TorchodeStepSpy(step_method, monitor)
    problem = module.InitialValueProblem(y0=flat, t_eval=t.expand(rows, -1).contiguous())
    if cfg.adjoint_kind == "direct":
        solver = module.AutoDiffAdjoint(spy, controller, max_steps=cfg.max_num_steps)
    else:
        solver = module.BacksolveAdjoint(term, spy, controller)
        solver.forward_adjoint.max_steps = cfg.max_num_steps
    solution = solver.solve(problem, dt0=dt0)
    status = solution.status
    if bool((status != 0).any()):
        monitor.steps = int(solution.stats["n_steps"].max())
        code = int(status.max())
        codes = module.status_codes
        if code == codes.REACHED_MAX_STEPS:
            raise monitor.fail(
                MaxStepsExceeded, f"more than max_num_steps={cfg.max_num_steps} steps"
            )
        if code == codes.INFINITE_NORM:
            raise monitor.fail(NonFiniteStateError, "the error norm became non-finite")
        if code == codes.REACHED_DT_MIN:
            raise monitor.fail(StepSizeUnderflowError, "the step size reached its minimum")
        raise monitor.fail(SolverError, f"torchode stopped with status {code}")
    n_steps, n_accepted = solution.stats["n_steps"], solution.stats["n_accepted"]
    monitor.stats.accepted_steps = int(n_accepted.max())
    monitor.stats.rejected_steps = int((n_steps - n_accepted).max())
    return solution.ys.transpose(0, 1).reshape(t.numel(), *y0.shape)
