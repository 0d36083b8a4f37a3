"""``solve``: check the inputs, watch the solve, hand it to the chosen backend's adapter."""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .config import FIXED_METHODS, SolverConfig, grid_steps, rounded
from .errors import MaxStepsExceeded, NonFiniteStateError, SolverConfigError
from .monitor import MonitoredField, SolverStats, StepMonitor, autocast_state, loss_scaled

__all__ = ["odeint", "solve"]

_INSTALL_HINT = {
    "torchdiffeq": "pip install torchdiffeq",
    "torchdyn": "pip install --no-deps torchdyn && pip install torchsde torchcde attrs "
    "(or `pip install odelm[torchdyn]` plus `--no-deps torchdyn`)",
    "torchode": "pip install torchode (or `pip install odelm[torchode]`)",
}


def solve(
    field: Callable[..., torch.Tensor],
    y0: torch.Tensor,
    t: torch.Tensor | Sequence[float] | float,
    config: SolverConfig | dict[str, Any] | None = None,
    **options: Any,
) -> tuple[torch.Tensor, SolverStats]:
    """Integrate ``dz/ds = field(s, z)``, ``z(t[0]) = y0``; return ``(z(t), stats)``.

    Defaults differ from ``torchdiffeq.odeint``: rtol 1e-3 / atol 1e-4 (torchdiffeq: 1e-7 /
    1e-9), tolerances for training language models rather than for reference solutions, and
    a step cap of ``DEFAULT_MAX_NUM_STEPS``. [`odeint`][neuralode_lm.odeint] has torchdiffeq's
    signature and defaults.

    Args:
        field: an ``nn.Module`` (or callable) ``field(s, z) -> dz/ds`` of ``z``'s shape; the
            adjoint needs an ``nn.Module`` so that it can find the parameters.
        y0: the initial state, any shape ``[..., D]``.
        t: strictly increasing times ``[t0, ..., t1]`` (a number ``S`` means ``[0, S]``).
        config: a [`SolverConfig`][neuralode_lm.SolverConfig] (or a dict of its options, or None for
            defaults).
        options: single [`SolverConfig`][neuralode_lm.SolverConfig] options (``method``, ``rtol``,
            ``atol``, ``adjoint``, ``backend``, ``step_size``, ``max_num_steps``, ...) overriding
            ``config``'s; see [`SolverConfig`][neuralode_lm.SolverConfig] for their meaning.

    Returns:
        ``states`` of shape ``[len(t), *y0.shape]`` and the solve's
        [`SolverStats`][neuralode_lm.SolverStats] (``nfe_backward`` is filled in by the backward
        pass). Fixed-grid methods step onto every time in ``t`` (``fixed_grid``); adaptive
        methods read out at ``t`` as the backend does (to within the tolerances).

    Raises:
        SolverConfigError: (a ValueError) on bad options.
        ImportError: for a missing optional backend.
        SolverError: MaxStepsExceeded, NonFiniteStateError or StepSizeUnderflowError when
            the solve fails.
    """
    if isinstance(config, SolverConfig) and not options:
        cfg = config  # a model builds (and validates) its config once, at construction
    else:
        cfg = SolverConfig.coerce(config, **options)
    if not isinstance(y0, torch.Tensor) or not y0.is_floating_point():
        raise TypeError("y0 must be a floating-point tensor")
    if y0.dim() == 0 or y0.numel() == 0:
        raise ValueError(f"y0 must have a feature dimension and elements, got shape {y0.shape}")
    stats = SolverStats(backend=cfg.backend, method=cfg.method, adjoint=cfg.adjoint_kind)
    monitor = StepMonitor(stats, cfg.max_num_steps)
    # torchdiffeq: the forward solve's checks stay on the device and are read back once,
    # after it (``StepMonitor.defer``; an adaptive solve that goes wrong stops in
    # torchdiffeq's own checks first, and the checks kept here then explain it)
    on_device = cfg.backend == "torchdiffeq"
    monitor.defer = on_device
    y0_bad = torch.isfinite(y0).all().logical_not()
    if on_device:
        monitor.check_later(y0_bad, NonFiniteStateError, _Y0_NON_FINITE, steps=0, nfe=0)
    elif bool(y0_bad):
        raise monitor.fail(NonFiniteStateError, _Y0_NON_FINITE)
    if cfg.adjoint_kind != "direct" and not isinstance(field, nn.Module):
        raise TypeError("the adjoint needs the field to be an nn.Module (to find its parameters)")
    autocast = autocast_state(y0.device.type)
    half = y0.dtype if y0.dtype in (torch.float16, torch.bfloat16) else None
    evaluate_in = half if autocast is None and not cfg.fixed else None
    if half is not None and (autocast is not None or evaluate_in is not None):
        # mixed precision, or a half-precision model's adaptive solve: the state stays fp32
        y0 = y0.float()
    times, host = _as_time(t, y0)
    if cfg.fixed and cfg.max_num_steps is not None:
        steps = grid_steps(host, cfg.step_size, times.dtype)  # type: ignore[arg-type]  # fixed has one
        if steps > cfg.max_num_steps:
            raise monitor.fail(
                MaxStepsExceeded,
                f"step_size={cfg.step_size} needs {steps} steps, more than "
                f"max_num_steps={cfg.max_num_steps}",
            )
    adapter = _adapter(cfg.backend)
    where = {"host_t": host} if on_device else {}  # torchdiffeq grids on the host's times
    if autocast is None:
        monitored = MonitoredField(field, monitor, y0.shape, evaluate_in=evaluate_in)
        states = adapter.run(monitored, y0, times, cfg, monitor, **where)
        if evaluate_in is not None:
            states = states.to(evaluate_in)
    else:  # mixed precision: the field under autocast, the solver outside (MonitoredField)
        with torch.autocast(autocast[0], enabled=False):
            monitored = MonitoredField(field, monitor, y0.shape, autocast)
            states = adapter.run(monitored, y0, times, cfg, monitor, **where)
    final_bad = torch.isfinite(states[-1]).all().logical_not()
    if on_device:
        nfe, steps = stats.nfe_forward, monitor.steps
        monitor.check_later(final_bad, NonFiniteStateError, _FINAL_NON_FINITE, steps, nfe)
        monitor.flush()  # a fixed grid's one read back to the host
    elif bool(final_bad):
        raise monitor.fail(NonFiniteStateError, _FINAL_NON_FINITE)
    if cfg.adjoint_kind != "direct" and isinstance(field, nn.Module):
        states = loss_scaled(states, field)  # under a GradScaler, an overflow skips the step
    monitor.enter_backward()
    return states, stats


def odeint(
    func: Callable[..., torch.Tensor],
    y0: torch.Tensor,
    t: torch.Tensor | Sequence[float],
    rtol: float = 1e-7,
    atol: float = 1e-9,
    method: str | None = None,
    options: dict[str, Any] | None = None,
    *,
    backend: str = "torchdiffeq",
    adjoint: bool | str = False,
    return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, SolverStats]:
    """``torchdiffeq.odeint``'s signature and defaults over [`solve`][neuralode_lm.solve]'s
    backends.

    Returns the states ``[len(t), *y0.shape]`` (and the [`SolverStats`][neuralode_lm.SolverStats]
    with ``return_stats=True``). ``method=None`` is dopri5; ``options`` takes torchdiffeq's
    ``step_size`` and ``max_num_steps`` (no step cap unless given, as in torchdiffeq); a
    fixed-grid method without ``step_size`` steps onto the times ``t``, as torchdiffeq's
    does. Unlike torchdiffeq, ``y0`` is one tensor and ``t`` strictly increasing;
    ``adjoint=True`` is ``odeint_adjoint`` (``func`` an ``nn.Module``); method names are the
    library's: ``rk4`` is the classic RK4, torchdiffeq's ``rk4`` (the 3/8 rule) is ``rk4_38``.
    """
    options = dict(options or {})
    unknown = set(options) - set(_ODEINT_OPTIONS)
    if unknown:
        raise SolverConfigError(
            f"odeint option(s) {sorted(unknown)} are not supported; supported: "
            f"{', '.join(_ODEINT_OPTIONS)} (use torchdiffeq.odeint for the others)"
        )
    method = method or "dopri5"
    options.setdefault("max_num_steps", None)
    if method in FIXED_METHODS and options.get("step_size") is None:
        times = torch.as_tensor(t)
        options["step_size"] = float((times[1:] - times[:-1]).max()) if times.numel() > 1 else 1.0
    states, stats = solve(
        func,
        y0,
        t,
        rtol=rtol,
        atol=atol,
        method=method,
        backend=backend,
        adjoint=adjoint,
        **options,
    )
    return (states, stats) if return_stats else states


_ODEINT_OPTIONS = ("step_size", "max_num_steps")


def _adapter(backend: str) -> Any:
    """The adapter module of ``backend`` (importing it imports the backend library)."""
    try:
        return importlib.import_module(f"{__package__}.{backend}_adapter")
    except ImportError as error:
        raise ImportError(
            f"backend {backend!r} is not installed; install it with: {_INSTALL_HINT[backend]}"
        ) from error


_Y0_NON_FINITE = "the initial state y0 has non-finite values"
_FINAL_NON_FINITE = "the final state is non-finite"


def _as_time(
    t: torch.Tensor | Sequence[float] | float, y0: torch.Tensor
) -> tuple[torch.Tensor, list[float]]:
    """The times on ``y0``'s device and in its dtype, and their values on the host, checked.

    A number ``S`` (``[0, S]``) or a sequence of numbers is known on the host: it is checked
    and later gridded there, with no read back from the device (``[0, S]`` is also made on
    the device, not copied from the host). A tensor is read back once."""
    if isinstance(t, (int, float)):
        times = torch.zeros(2, dtype=y0.dtype, device=y0.device)
        times[1] = float(t)  # a fill on the device, not a copy from the host
        host = [0.0, rounded(float(t), y0.dtype)]
    else:
        on_host = not isinstance(t, torch.Tensor)
        times = torch.as_tensor(t, dtype=y0.dtype, device=y0.device)
        if times.dim() != 1 or times.numel() < 2:
            raise SolverConfigError(
                "t must be a 1-D tensor of at least two times [t0, ..., t1], got shape "
                f"{tuple(times.shape)}"
            )
        host = [rounded(float(v), y0.dtype) for v in t] if on_host else times.tolist()  # type: ignore[union-attr]
    if not all(math.isfinite(v) for v in host):
        raise SolverConfigError(f"t must be finite, got {host}")
    if not all(b > a for a, b in itertools.pairwise(host)):
        if len(host) == 2 and host[1] - host[0] == 0.0:
            raise SolverConfigError(
                f"the integration interval has zero length (t0 = t1 = {host[0]}); "
                "integrate over s in [0, S] with S > 0"
            )
        raise SolverConfigError(f"t must be strictly increasing, got {host}")
    return times, host
