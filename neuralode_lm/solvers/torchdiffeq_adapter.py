"""torchdiffeq behind the facade: ``odeint`` / ``odeint_adjoint`` with step callbacks.

Method names are the library's: torchdiffeq's own ``rk4`` is the 3/8 rule, so the facade's
``rk4`` (the classic RK4) steps through the library's RK core, registered with torchdiffeq
under ``CLASSIC_RK4``, and the facade's ``rk4_38`` is torchdiffeq's ``rk4``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torchdiffeq
from torchdiffeq._impl.misc import Perturb
from torchdiffeq._impl.odeint import SOLVERS
from torchdiffeq._impl.solvers import FixedGridODESolver

from ode_transformer.tableau import TABLEAUX, rk_stage_values, weighted_sum

from .config import fixed_grid
from .errors import StepSizeUnderflowError
from .monitor import MonitoredField, StepMonitor

if TYPE_CHECKING:
    from .config import SolverConfig


CLASSIC_RK4 = "odelm_rk4"
"""The name under which torchdiffeq runs the library's classic RK4."""


class _TableauSolver(FixedGridODESolver):
    """A torchdiffeq fixed-grid solver stepping by the library's RK core (classic RK4)."""

    order = 4
    tableau = TABLEAUX["rk4"]

    def _step_func(
        self,
        func: Callable[..., torch.Tensor],
        t0: torch.Tensor,
        dt: torch.Tensor,
        t1: torch.Tensor,
        y0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y1 - y0, f(t0, y0))``: one classic RK4 step, as torchdiffeq's hook returns."""
        first = Perturb.NEXT if self.perturb else Perturb.NONE
        c = self.tableau.c

        def stage(i: int, y: torch.Tensor) -> torch.Tensor:
            return func(t0, y, perturb=first) if i == 0 else func(t0 + c[i] * dt, y)

        values = rk_stage_values(self.tableau, stage, y0, dt)
        return weighted_sum(None, self.tableau.b, values, dt), values[0]


SOLVERS.setdefault(CLASSIC_RK4, _TableauSolver)
_NAMES = {"rk4": CLASSIC_RK4, "rk4_38": "rk4"}
"""The facade's names that torchdiffeq spells differently."""


def run(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: StepMonitor,
) -> torch.Tensor:
    """States at ``t``; steps, outcomes and evaluations reported to ``monitor``."""
    method = _NAMES.get(cfg.method, cfg.method)
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
                field, y0, t, rtol=cfg.rtol, atol=cfg.atol, method=method, options=options
            )
        else:
            adjoint_method = cfg.adjoint_method or cfg.method
            adjoint_method = _NAMES.get(adjoint_method, adjoint_method)
            states = torchdiffeq.odeint_adjoint(
                field,
                y0,
                t,
                rtol=cfg.rtol,
                atol=cfg.atol,
                method=method,
                options=options,
                adjoint_method=adjoint_method,
                adjoint_rtol=cfg.adjoint_rtol or cfg.rtol,
                adjoint_atol=cfg.adjoint_atol or cfg.atol,
                adjoint_options=_adjoint_options(cfg, options),
                adjoint_params=tuple(p for p in field.parameters() if p.requires_grad),
            )
    except AssertionError as error:  # torchdiffeq's own checks, e.g. "underflow in dt"
        raise monitor.fail(StepSizeUnderflowError, f"torchdiffeq stopped: {error}") from error
    if cfg.fixed:
        monitor.set_step_counts(monitor.steps, 0)
    return states


def _adjoint_options(cfg: SolverConfig, options: dict[str, Any]) -> dict[str, Any]:
    """torchdiffeq's ``adjoint_options``: the forward grid, or the seminorm if asked for."""
    if cfg.fixed:
        return dict(options)
    return {"norm": "seminorm"} if cfg.adjoint_norm == "seminorm" else {}
