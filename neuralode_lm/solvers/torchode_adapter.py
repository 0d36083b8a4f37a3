"""torchode behind the facade: per-row step control on the flattened state ``[rows, D]``."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch
import torchode
from torch import nn
from torchode.interpolation import LinearInterpolation
from torchode.single_step_methods.runge_kutta import (
    ButcherTableau,
    ERKInterpolationData,
    ExplicitRungeKutta,
)

from ode_transformer.tableau import TABLEAUX, Tableau

from .config import fixed_grid
from .errors import MaxStepsExceeded, NonFiniteStateError, SolverError, StepSizeUnderflowError
from .monitor import MonitoredField, StepMonitor

if TYPE_CHECKING:
    from .config import SolverConfig

# torchode's step-method class per facade method ("Heun" is its adaptive Heun-Euler pair);
# every other fixed-grid method is a ``_TableauMethod``.
_STEP_METHODS = {"dopri5": "Dopri5", "tsit5": "Tsit5", "adaptive_heun": "Heun", "euler": "Euler"}


class _TableauMethod(ExplicitRungeKutta):
    """torchode's ``ExplicitRungeKutta`` of a tableau of ``TABLEAUX``, for fixed steps (no
    error estimate); readouts fall on step ends (``run``), interpolated linearly."""

    def __init__(self, term: torchode.ODETerm, tableau: Tableau) -> None:
        rows = [list(row[:i]) for i, row in enumerate(tableau.A)]
        zeros = [0.0] * tableau.stages
        coefficients = ButcherTableau.from_lists(
            c=list(tableau.c), a=rows, b=list(tableau.b), b_err=zeros
        )
        super().__init__(term, coefficients)
        self.order = tableau.order()

    def convergence_order(self) -> int:
        return self.order

    def build_interpolation(self, data: ERKInterpolationData) -> LinearInterpolation:
        return LinearInterpolation(data.t0, data.dt, data.y0, data.y1)


def _step_method(method: str, term: torchode.ODETerm) -> nn.Module:
    if method in _STEP_METHODS:
        return getattr(torchode, _STEP_METHODS[method])(term=term)
    return _TableauMethod(term, TABLEAUX[method])


class _ReportingStepMethod:
    """A torchode step method that hands each step size (per row) to the monitor first."""

    def __init__(self, method: nn.Module, monitor: StepMonitor) -> None:
        self._method = method
        self._monitor = monitor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)

    def step(self, term: Any, running: torch.Tensor, y: torch.Tensor, t: torch.Tensor, dt, *a, **k):
        self._monitor.note_step_size(dt, running)
        return self._method.step(term, running, y, t, dt, *a, **k)


def run(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: StepMonitor,
) -> torch.Tensor:
    """States at ``t``; evaluations, step sizes and step counts reported to ``monitor``."""
    flat = y0.reshape(-1, y0.shape[-1])
    term = torchode.ODETerm(field)
    method = _ReportingStepMethod(_step_method(cfg.method, term), monitor)
    if not cfg.fixed:
        controller = torchode.IntegralController(atol=cfg.atol, rtol=cfg.rtol, term=term)
        ys, accepted, rejected = _solve(term, method, controller, flat, t, None, cfg, monitor)
        monitor.set_step_counts(accepted, rejected)
        return ys.transpose(0, 1).reshape(t.numel(), *y0.shape)
    # torchode's fixed step interpolates readouts between steps; the facade's grid steps
    # onto every requested time instead: one solve per interval with its own equal steps.
    grid = fixed_grid(t, cfg.step_size)
    states, total = [flat], 0
    for start, end in itertools.pairwise(t):
        steps = int(((grid > start) & (grid <= end)).sum())
        # a hair longer than the interval / steps, so the last step is clipped onto ``end``
        dt = float(end - start) / steps * (1 + 8 * torch.finfo(y0.dtype).eps)
        dt0 = torch.full((flat.shape[0],), dt, dtype=y0.dtype, device=y0.device)
        span = torch.stack([start, end])
        ys, accepted, _ = _solve(
            term, method, torchode.FixedStepController(), states[-1], span, dt0, cfg, monitor
        )
        states.append(ys[:, -1])
        total += accepted
    monitor.set_step_counts(total, 0)
    return torch.stack(states).reshape(t.numel(), *y0.shape)


def _solve(
    term: Any,
    method: _ReportingStepMethod,
    controller: Any,
    flat: torch.Tensor,
    t: torch.Tensor,
    dt0: torch.Tensor | None,
    cfg: SolverConfig,
    monitor: StepMonitor,
) -> tuple[torch.Tensor, int, int]:
    """One torchode solve of ``flat`` at times ``t``: ``ys [rows, len(t), D]`` and the most
    accepted and rejected steps of any row."""
    if cfg.adjoint_kind == "direct":
        # torchode backpropagates through its step-size controller by default, which gives
        # wrong gradients for non-smooth fields (ReLU MLPs); torchdiffeq and TorchDyn do not.
        solver = torchode.AutoDiffAdjoint(
            method,
            controller,
            max_steps=cfg.max_num_steps,
            backprop_through_step_size_control=False,
        )
    else:
        solver = torchode.BacksolveAdjoint(term, method, controller)
        solver.forward_adjoint.max_steps = cfg.max_num_steps
    problem = torchode.InitialValueProblem(y0=flat, t_eval=t.expand(flat.shape[0], -1).contiguous())
    solution = solver.solve(problem, dt0=dt0)
    n_steps, n_accepted = solution.stats["n_steps"], solution.stats["n_accepted"]
    if bool((solution.status != 0).any()):
        monitor.steps = int(n_steps.max())
        raise _failure(int(solution.status.max()), cfg, monitor)
    return solution.ys, int(n_accepted.max()), int((n_steps - n_accepted).max())


def _failure(code: int, cfg: SolverConfig, monitor: StepMonitor) -> SolverError:
    codes = torchode.status_codes
    if code == codes.REACHED_MAX_STEPS:
        return monitor.fail(MaxStepsExceeded, f"more than max_num_steps={cfg.max_num_steps} steps")
    if code == codes.INFINITE_NORM:
        return monitor.fail(NonFiniteStateError, "the error norm became non-finite")
    if code == codes.REACHED_DT_MIN:
        return monitor.fail(StepSizeUnderflowError, "the step size reached its minimum")
    return monitor.fail(SolverError, f"torchode stopped with status {code}")
