"""TorchDyn behind the facade: ``odeint`` and ``ODEProblem`` with a step-reporting solver."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torchdyn.core import ODEProblem
from torchdyn.numerics import odeint
from torchdyn.numerics.solvers.ode import str_to_solver
from torchdyn.numerics.solvers.templates import DiffEqSolver

from ode_transformer.tableau import TABLEAUX, Tableau, rk_stage_values, weighted_sum

from .config import fixed_grid
from .monitor import MonitoredField, StepMonitor

if TYPE_CHECKING:
    from .config import SolverConfig


class _ReportingSolver:
    """A TorchDyn solver whose ``step`` reports to the monitor first.

    TorchDyn reports no step outcome: a step was accepted when the next one starts later.
    """

    def __init__(self, solver: nn.Module, monitor: StepMonitor) -> None:
        self._solver = solver
        self._monitor = monitor
        self._previous_t: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._solver, name)

    def step(self, f: Callable, x: torch.Tensor, t: torch.Tensor, dt: torch.Tensor, **kw: Any):
        if self._monitor.phase != "forward":
            self._previous_t = None
        elif self._previous_t is not None:
            self._monitor.record_outcome(bool(t != self._previous_t))
        self._previous_t = t
        self._monitor.on_step(t, x, dt)
        return self._solver.step(f, x, t, dt, **kw)


class _TableauStep(DiffEqSolver):
    """A TorchDyn fixed-step solver stepping by any tableau through the library's stage
    loop (the same arithmetic as TorchDyn's own ``Euler`` and ``Midpoint``); TorchDyn's
    ``RungeKutta4`` (1.0.6) evaluates ``k2, k3, k4`` at ``t + (0, 1/2, 1/2) dt``, right
    only for fields that ignore ``t``, so ``rk4`` is a tableau step here."""

    def __init__(self, tableau: Tableau, dtype: torch.dtype) -> None:
        super().__init__(order=tableau.order())
        self.dtype = dtype
        self.stepping_class = "fixed"
        self.rk = tableau  # not ``tableau``: TorchDyn reads that as its own (c, a, b, b_err)

    def step(self, f: Callable, x: torch.Tensor, t: torch.Tensor, dt: torch.Tensor, **kw: Any):
        tableau = self.rk
        values = rk_stage_values(tableau, lambda i, y: f(t + tableau.c[i] * dt, y), x, dt)
        return None, weighted_sum(x, tableau.b, values, dt), None


def _stepper(method: str, dtype: torch.dtype) -> nn.Module:
    """A tableau step for the fixed-grid names, else TorchDyn's adaptive solver."""
    if method in TABLEAUX:
        return _TableauStep(TABLEAUX[method], dtype)
    return str_to_solver(method, dtype)


def run(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: StepMonitor,
) -> torch.Tensor:
    """States at ``t``; steps, outcomes and evaluations reported to ``monitor``."""
    solver = _ReportingSolver(_stepper(cfg.method, y0.dtype), monitor)
    if cfg.fixed:  # TorchDyn steps through every point of the span and saves at ``t``
        _, states = odeint(field, y0, fixed_grid(t, cfg.step_size), solver, save_at=t)
        monitor.set_step_counts(monitor.steps, 0)
        return states
    if cfg.adjoint_kind == "direct":
        _, states = odeint(field, y0, t, solver, atol=cfg.atol, rtol=cfg.rtol)
    else:
        problem = ODEProblem(
            field,
            solver,
            atol=cfg.atol,
            rtol=cfg.rtol,
            sensitivity="adjoint" if cfg.adjoint_kind == "backsolve" else "interpolated_adjoint",
            atol_adjoint=cfg.adjoint_atol or cfg.atol,
            rtol_adjoint=cfg.adjoint_rtol or cfg.rtol,
        )
        if cfg.adjoint_kind == "backsolve":
            _, states = problem.odeint(y0, t)
        else:
            states = _interpolated_adjoint(problem, y0, t)
    monitor.record_outcome(True)  # the last step of a finished solve was accepted
    return states


def _interpolated_adjoint(problem: Any, y0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """TorchDyn's interpolated adjoint, one interval of ``t`` at a time.

    It returns every internal step of a solve, and its backward pass reads the gradient of
    the state at ``t[i]`` from output row ``i``, so it is right only for a single interval
    ``[t0, t1]``; chained over the intervals it gives exactly the requested times.
    """
    states = [y0]
    for start, end in itertools.pairwise(t):
        _, dense = problem.odeint(states[-1], torch.stack([start, end]))
        states.append(dense[-1])
    return torch.stack(states)
