"""torchdiffeq behind the facade: ``odeint`` / ``odeint_adjoint`` with step callbacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torchdiffeq

from .config import fixed_grid
from .errors import StepSizeUnderflowError
from .monitor import MonitoredField, StepMonitor

if TYPE_CHECKING:
    from .config import SolverConfig


def run(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: StepMonitor,
) -> torch.Tensor:
    """States at ``t``; steps, outcomes and evaluations reported to ``monitor``."""
    field.callback_step = monitor.on_step
    field.callback_step_adjoint = monitor.on_step
    if cfg.fixed:
        # torchdiffeq's own grid interpolates readouts between grid points; the facade's
        # grid steps onto every requested time instead (the same on every backend).
        options = {"grid_constructor": lambda func, y, times: fixed_grid(times, cfg.step_size)}
    else:
        options = {}
        monitor.set_step_counts(0, 0)
        field.callback_accept_step = lambda t0, y, dt: monitor.record_outcome(True)
        field.callback_reject_step = lambda t0, y, dt: monitor.record_outcome(False)
    try:
        if cfg.adjoint_kind == "direct":
            states = torchdiffeq.odeint(
                field, y0, t, rtol=cfg.rtol, atol=cfg.atol, method=cfg.method, options=options
            )
        else:
            adjoint_method = cfg.adjoint_method or cfg.method
            states = torchdiffeq.odeint_adjoint(
                field,
                y0,
                t,
                rtol=cfg.rtol,
                atol=cfg.atol,
                method=cfg.method,
                options=options,
                adjoint_method=adjoint_method,
                adjoint_rtol=cfg.adjoint_rtol or cfg.rtol,
                adjoint_atol=cfg.adjoint_atol or cfg.atol,
                adjoint_options=dict(options) if cfg.fixed else {},
                adjoint_params=tuple(p for p in field.parameters() if p.requires_grad),
            )
    except AssertionError as error:  # torchdiffeq's own checks, e.g. "underflow in dt"
        raise monitor.fail(StepSizeUnderflowError, f"torchdiffeq stopped: {error}") from error
    if cfg.fixed:
        monitor.set_step_counts(monitor.steps, 0)
    return states
