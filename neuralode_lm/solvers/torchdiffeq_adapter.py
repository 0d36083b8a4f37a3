"""torchdiffeq behind the facade: ``odeint`` / ``odeint_adjoint`` with step callbacks.

Adaptive methods go to ``torchdiffeq.odeint`` / ``odeint_adjoint`` by name. A fixed-grid
method is a tableau of ``ode_transformer.TABLEAUX`` stepped by one solver class,
``TableauSolver`` (torchdiffeq's ``FixedGridODESolver`` parameterised by a tableau, as
torchode's ``ExplicitRungeKutta(term, tableau)``), built here for each solve: torchdiffeq's solver
registry is never written to, so ``odeint`` cannot be asked for it by name, and
``tableau_odeint`` is ``torchdiffeq.odeint`` with the solver built directly. The adjoint of
every fixed-grid solve is ``FixedGridAdjoint``: torchdiffeq's backsolve adjoint, step for
step, with these solves.

``NATIVE``: one name keeps torchdiffeq's own step function so that its numbers stay those
of every earlier run: ``rk4_38`` is torchdiffeq's ``rk4`` (the 3/8 rule by
``rk4_alt_step_func``, whose rounding differs from the stage loop's). ``euler`` and
``midpoint`` by ``TableauSolver`` do torchdiffeq's ``euler`` and ``midpoint`` arithmetic
bit for bit (``tests/ode_transformer/test_tableau_methods.py``). ``rk4`` is the classic RK4 everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torchdiffeq
from torchdiffeq._impl.misc import (
    Perturb,
    _all_adjoint_callback_names,
    _all_callback_names,
    _check_inputs,
    _flat_to_shape,
    _null_callback,
    _PerturbFunc,
)
from torchdiffeq._impl.solvers import FixedGridODESolver

from ode_transformer.tableau import TABLEAUX, Tableau, rk_stage_values, weighted_sum

from .config import fixed_grid, grid_marks
from .errors import StepSizeUnderflowError
from .monitor import MonitoredField, StepMonitor

if TYPE_CHECKING:
    from .config import SolverConfig

__all__ = ["NATIVE", "FixedGridAdjoint", "TableauSolver", "run", "tableau_odeint"]

NATIVE = {"rk4_38": "rk4"}
"""Facade names that torchdiffeq steps with its own solver (facade name -> torchdiffeq name)."""

Solve = Callable[..., torch.Tensor]
"""``solve(func, y0, t, options) -> states``: one fixed-grid solve (tensor or tuple ``y0``)."""


class TableauSolver(FixedGridODESolver):
    """torchdiffeq's fixed-grid solver stepping by any explicit tableau through the library's
    one stage loop (``rk_stage_values``); ``TableauSolver(tableau, func=..., y0=..., ...)``
    takes ``FixedGridODESolver``'s options after the tableau."""

    def __init__(self, tableau: Tableau, **options: Any) -> None:
        super().__init__(**options)
        self.tableau = tableau
        self.order = tableau.order()

    def integrate_on(self, grid: torch.Tensor, marks: list[int]) -> torch.Tensor:
        """``integrate``'s states at ``grid[marks]``, with the grid and the marks given:
        the same steps and the same states (each requested time is a grid point, where
        ``integrate``'s readout is the step's end state), without ``integrate``'s reads of
        the times back to the host (its checks of the grid and its comparisons of grid
        and requested times: 3 syncs a step and 2 a solve on a GPU)."""
        solution = torch.empty(
            len(marks), *self.y0.shape, dtype=self.y0.dtype, device=self.y0.device
        )
        solution[0] = self.y0
        j = 1
        y0 = self.y0
        for i in range(len(grid) - 1):
            t0, t1 = grid[i], grid[i + 1]
            dt = t1 - t0
            self.func.callback_step(t0, y0, dt)
            dy, _ = self._step_func(self.func, t0, dt, t1, y0)
            y1 = y0 + dy
            while j < len(marks) and marks[j] == i + 1:
                solution[j] = y1
                j += 1
            y0 = y1
        return solution

    def _step_func(
        self,
        func: Callable[..., torch.Tensor],
        t0: torch.Tensor,
        dt: torch.Tensor,
        t1: torch.Tensor,
        y0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y1 - y0, f(t0, y0))``: one step of the tableau, as torchdiffeq's hook returns."""
        first = Perturb.NEXT if self.perturb else Perturb.NONE
        c = self.tableau.c

        def stage(i: int, y: torch.Tensor) -> torch.Tensor:
            return func(t0, y, perturb=first) if i == 0 else func(t0 + c[i] * dt, y)

        values = rk_stage_values(self.tableau, stage, y0, dt)
        return weighted_sum(None, self.tableau.b, values, dt), values[0]


def tableau_odeint(
    func: Callable[..., Any],
    y0: torch.Tensor | tuple[torch.Tensor, ...],
    t: torch.Tensor,
    tableau: Tableau,
    *,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    options: dict[str, Any] | None = None,
) -> Any:
    """``torchdiffeq.odeint(func, y0, t, method=<tableau>, options=options)``: torchdiffeq's
    own input handling (tuples, decreasing times, callbacks; ``_check_inputs`` takes the
    solver table as an argument, here a local one) and its fixed-grid loop, with a
    ``TableauSolver`` built directly instead of looked up in torchdiffeq's registry."""
    table = {tableau.name: TableauSolver}  # for _check_inputs' name and callback checks only
    shapes, func, y0, t, rtol, atol, _, options, _, _ = _check_inputs(
        func, y0, t, rtol, atol, tableau.name, options, None, table
    )
    solver = TableauSolver(tableau, func=func, y0=y0, rtol=rtol, atol=atol, **options)
    solution = solver.integrate(t)
    return solution if shapes is None else _flat_to_shape(solution, (len(t),), shapes)


def _on_host_grid(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    host_t: list[float],
    cfg: SolverConfig,
) -> torch.Tensor:
    """``tableau_odeint(field, y0, t, ...)`` on the facade's grid, its times known on the
    host (``host_t``, increasing): the same steps and states without a read back to the
    host (torchdiffeq's ``_check_inputs`` reads the times three times, ``integrate`` a few
    times a step)."""
    return _host_grid_solve(t, host_t, cfg)(_checked(field), y0, t, {})


def _checked(field: MonitoredField) -> Any:
    """``field`` as torchdiffeq's ``_check_inputs`` prepares it for one tensor ``y0`` and
    increasing times (its ``perturb`` argument and the callbacks; nothing else applies),
    without its reads of the times."""
    func = _PerturbFunc(field)
    for name in _all_callback_names:
        setattr(func, name, getattr(field, name, _null_callback))
    for name in _all_adjoint_callback_names:
        if hasattr(field, name):
            setattr(func, name, getattr(field, name))
    return func


def _host_grid_solve(t: torch.Tensor, host_t: list[float], cfg: SolverConfig) -> Solve:
    """The forward ``fixed_solve`` of a tableau on the grid of ``t`` built from ``host_t``
    (``TableauSolver.integrate_on``: no read back to the host)."""
    grid, marks = grid_marks(t, cfg.step_size, host_t)  # type: ignore[arg-type]  # fixed
    tableau = TABLEAUX[cfg.method]

    def solve(func: Any, y0: Any, t: torch.Tensor, options: dict[str, Any]) -> Any:
        solver = TableauSolver(
            tableau,
            func=func,
            y0=y0,
            rtol=cfg.rtol,
            atol=cfg.atol,
            grid_constructor=lambda func, y, times: grid,
        )
        return solver.integrate_on(grid, marks)

    return solve


def fixed_solve(method: str, rtol: float, atol: float) -> Solve:
    """The fixed-grid solve of a facade method name: torchdiffeq's own solver for the
    ``NATIVE`` names, else a ``TableauSolver`` of ``TABLEAUX[method]``."""
    if method in NATIVE:
        name = NATIVE[method]

        def native(func: Any, y0: Any, t: torch.Tensor, options: dict[str, Any]) -> Any:
            return torchdiffeq.odeint(
                func, y0, t, rtol=rtol, atol=atol, method=name, options=options
            )

        return native
    tableau = TABLEAUX[method]

    def by_tableau(func: Any, y0: Any, t: torch.Tensor, options: dict[str, Any]) -> Any:
        return tableau_odeint(func, y0, t, tableau, rtol=rtol, atol=atol, options=options)

    return by_tableau


class FixedGridAdjoint(torch.autograd.Function):
    """torchdiffeq's backsolve adjoint (``OdeintAdjointMethod``, step for step) with the
    forward and backward solves given as ``fixed_solve`` functions, so that any tableau has
    an adjoint without a registry entry. ``func`` is torchdiffeq's checked field."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        func: Any,
        y0: torch.Tensor,
        t: torch.Tensor,
        forward_solve: Solve,
        backward_solve: Solve,
        options: dict[str, Any],
        adjoint_options: dict[str, Any],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        ctx.func, ctx.backward_solve, ctx.adjoint_options = func, backward_solve, adjoint_options
        ctx.t_requires_grad = t.requires_grad
        with torch.no_grad():
            y = forward_solve(func, y0, t, options)
        ctx.save_for_backward(t, y, *params)
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        func, t_requires_grad = ctx.func, ctx.t_requires_grad
        t, y, *saved = ctx.saved_tensors
        params = tuple(saved)
        with torch.no_grad():
            aug_state = [torch.zeros((), dtype=y.dtype, device=y.device), y[-1], grad_y[-1]]
            aug_state.extend(torch.zeros_like(param) for param in params)

            def augmented_dynamics(t: torch.Tensor, y_aug: tuple[torch.Tensor, ...]) -> tuple:
                """``(-a df/dt, f, -a df/dy, -a df/dtheta)`` at ``(t, y)``, ``a`` the adjoint."""
                y, adj_y = y_aug[1], y_aug[2]
                with torch.enable_grad():
                    t_ = t.detach()
                    t = t_.requires_grad_(True)
                    y = y.detach().requires_grad_(True)
                    func_eval = func(t if t_requires_grad else t_, y)
                    vjp_t, vjp_y, *vjp_params = torch.autograd.grad(
                        func_eval, (t, y, *params), -adj_y, allow_unused=True, retain_graph=True
                    )
                vjp_t = torch.zeros_like(t) if vjp_t is None else vjp_t
                vjp_y = torch.zeros_like(y) if vjp_y is None else vjp_y
                vjp_params = [
                    torch.zeros_like(param) if vjp is None else vjp
                    for param, vjp in zip(params, vjp_params)
                ]
                return (vjp_t, func_eval, vjp_y, *vjp_params)

            for name, adjoint_name in zip(_all_callback_names, _all_adjoint_callback_names):
                if hasattr(func, adjoint_name):
                    setattr(augmented_dynamics, name, getattr(func, adjoint_name))

            time_vjps = torch.empty(len(t), dtype=t.dtype, device=t.device)
            for i in range(len(t) - 1, 0, -1):
                if t_requires_grad:
                    value = func(t[i], y[i]).reshape(-1).dot(grad_y[i].reshape(-1))
                    aug_state[0] -= value
                    time_vjps[i] = value
                solved = ctx.backward_solve(
                    augmented_dynamics,
                    tuple(aug_state),
                    t[i - 1 : i + 1].flip(0),
                    ctx.adjoint_options,
                )
                aug_state = [a[1] for a in solved]  # the state at t[i - 1]
                aug_state[1] = y[i - 1]  # the forward pass's state
                aug_state[2] += grad_y[i - 1]
            time_vjps[0] = aug_state[0]
        return (
            None,
            aug_state[2],
            time_vjps if t_requires_grad else None,
            None,
            None,
            None,
            None,
            *aug_state[3:],
        )


def run(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: StepMonitor,
    host_t: list[float] | None = None,
) -> torch.Tensor:
    """States at ``t``; steps, outcomes and evaluations reported to ``monitor``. ``host_t``:
    the values of ``t`` known on the host (checked, increasing), for a fixed grid built
    and stepped without reading the times back from the device."""
    field.callback_step = monitor.on_step
    field.callback_step_adjoint = monitor.on_step
    try:
        if not cfg.fixed:
            states = _adaptive(field, y0, t, cfg, monitor)
        elif host_t is not None and cfg.adjoint_kind == "direct" and cfg.method not in NATIVE:
            states = _on_host_grid(field, y0, t, host_t, cfg)
        else:
            states = _fixed(field, y0, t, cfg, host_t)
    except AssertionError as error:  # torchdiffeq's own checks, e.g. "underflow in dt"
        monitor.flush()  # a check kept on the device that failed first explains it better
        raise monitor.fail(StepSizeUnderflowError, f"torchdiffeq stopped: {error}") from error
    if cfg.fixed:
        monitor.set_step_counts(monitor.steps, 0)
    return states


def _adaptive(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    monitor: StepMonitor,
) -> torch.Tensor:
    """An adaptive solve by torchdiffeq's method of that name."""
    monitor.set_step_counts(0, 0)
    field.callback_accept_step = lambda t0, y, dt: monitor.record_outcome(True)
    field.callback_reject_step = lambda t0, y, dt: monitor.record_outcome(False)
    if cfg.adjoint_kind == "direct":
        return torchdiffeq.odeint(field, y0, t, rtol=cfg.rtol, atol=cfg.atol, method=cfg.method)
    return torchdiffeq.odeint_adjoint(
        field,
        y0,
        t,
        rtol=cfg.rtol,
        atol=cfg.atol,
        method=cfg.method,
        options={},
        adjoint_method=cfg.adjoint_method or cfg.method,
        adjoint_rtol=cfg.adjoint_rtol or cfg.rtol,
        adjoint_atol=cfg.adjoint_atol or cfg.atol,
        adjoint_options={"norm": "seminorm"} if cfg.adjoint_norm == "seminorm" else {},
        adjoint_params=_params(field),
    )


def _fixed(
    field: MonitoredField,
    y0: torch.Tensor,
    t: torch.Tensor,
    cfg: SolverConfig,
    host_t: list[float] | None = None,
) -> Any:
    """A fixed-grid solve on the facade's grid (``fixed_grid``: torchdiffeq's own grid would
    interpolate readouts between grid points; this one steps onto every requested time).
    An adjoint's forward solve of a tableau, its times known on the host (``host_t``), is
    prepared and stepped without reading them back (``_on_host_grid``)."""
    options = {"grid_constructor": lambda func, y, times: fixed_grid(times, cfg.step_size)}
    forward = fixed_solve(cfg.method, cfg.rtol, cfg.atol)
    if cfg.adjoint_kind == "direct":
        return forward(field, y0, t, options)
    adjoint_method = cfg.adjoint_method or cfg.method
    adjoint_rtol, adjoint_atol = cfg.adjoint_rtol or cfg.rtol, cfg.adjoint_atol or cfg.atol
    # torchdiffeq.odeint_adjoint's own preparation of the field, then its algorithm with the
    # fixed-grid solves of ``fixed_solve`` (torchdiffeq's own for NATIVE names)
    if host_t is not None and cfg.method not in NATIVE:
        func, forward = _checked(field), _host_grid_solve(t, host_t, cfg)
    else:
        _, func, y0, t, _, _, _, _, _, _ = _check_inputs(
            field, y0, t, cfg.rtol, cfg.atol, cfg.method, options, None, {cfg.method: TableauSolver}
        )
    backward = fixed_solve(adjoint_method, adjoint_rtol, adjoint_atol)
    return FixedGridAdjoint.apply(
        func, y0, t, forward, backward, options, dict(options), *_params(field)
    )


def _params(field: MonitoredField) -> tuple[torch.Tensor, ...]:
    return tuple(p for p in field.parameters() if p.requires_grad)
