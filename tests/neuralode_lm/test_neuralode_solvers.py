"""The solver facade against mathematics: exact solutions, orders, adjoint gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from neuralode_lm import (
    MaxStepsExceeded,
    MLPField,
    NonFiniteStateError,
    SolverConfig,
    TimeConcatField,
    as_field,
    solve,
)

BACKENDS = ["torchdiffeq", "torchdyn", "torchode"]


class Linear(nn.Module):
    """``dz/ds = A z``; exact solution ``z(s) = expm(A s) z0``."""

    def __init__(self, a: torch.Tensor) -> None:
        super().__init__()
        self.a = nn.Parameter(a.clone())

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return z @ self.a.T


def _linear_problem(seed: int = 0) -> tuple[Linear, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(5, 5, generator=gen, dtype=torch.float64) * 0.6
    y0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    return Linear(a), y0, torch.tensor([0.0, 0.7, 1.5], dtype=torch.float64)


def _exact(field: Linear, y0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    a = field.a.detach()
    return torch.stack([y0 @ torch.linalg.matrix_exp(a * s).T for s in t])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dopri5_tight_tolerance_matches_matrix_exponential(backend: str) -> None:
    field, y0, t = _linear_problem()
    states, stats = solve(field, y0, t, rtol=1e-7, atol=1e-7, backend=backend)
    exact = _exact(field, y0, t)
    assert states.shape == (3, *y0.shape)
    assert torch.equal(states[0], y0)
    error = (states - exact).abs().max().item()
    assert error < 2e-6 * exact.abs().max().item()
    # a looser tolerance is measurably less accurate: the tolerance is really used
    loose, _ = solve(field, y0, t, rtol=1e-3, atol=1e-3, backend=backend)
    assert (loose - exact).abs().max().item() > 10 * error
    assert stats.nfe_forward > 0 and stats.accepted_steps > 0


def test_dopri5_nfe_is_two_plus_six_per_step() -> None:
    """torchdiffeq's dopri5: 2 evaluations pick the first step, then 6 per step (FSAL)."""
    field, y0, t = _linear_problem(1)
    _, stats = solve(field, y0, t, rtol=1e-6, atol=1e-6)
    assert stats.nfe_forward == 2 + 6 * (stats.accepted_steps + stats.rejected_steps)


@pytest.mark.parametrize(
    ("method", "order", "backend"),
    [("euler", 1, "torchdiffeq"), ("midpoint", 2, "torchdyn"), ("rk4", 4, "torchdiffeq")],
)
def test_fixed_grid_methods_converge_at_their_order(method: str, order: int, backend: str) -> None:
    field, y0, t = _linear_problem(2)
    exact = _exact(field, y0, t)[-1]
    errors = []
    for h in (0.1, 0.05):
        states, _ = solve(field, y0, t, method=method, step_size=h, backend=backend)
        errors.append((states[-1] - exact).abs().max().item())
    observed = math.log2(errors[0] / errors[1])
    assert abs(observed - order) < 0.3, (method, errors)


def test_same_problem_agrees_across_backends() -> None:
    torch.manual_seed(0)
    smooth = as_field(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 6)).double())
    y0 = torch.randn(8, 6, dtype=torch.float64)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    reference, _ = solve(smooth, y0, t, rtol=1e-12, atol=1e-12)
    # global error is a modest multiple of the local tolerance: allow 100x
    tol = 1e-8
    for backend in BACKENDS:
        states, _ = solve(smooth, y0, t, rtol=tol, atol=tol, backend=backend)
        assert ((states - reference).abs() <= 100 * tol * (1 + reference.abs())).all(), backend
    # a time-dependent field: torchode passes one time per row, the others a scalar
    timed = Timed(smooth)
    reference, _ = solve(timed, y0, t, rtol=1e-12, atol=1e-12)
    for backend in BACKENDS:
        states, _ = solve(timed, y0, t, rtol=tol, atol=tol, backend=backend)
        assert ((states - reference).abs() <= 100 * tol * (1 + reference.abs())).all(), backend


class Timed(nn.Module):
    """``f(s, z) = cos(3 s) g(s, z)``: smooth and time-dependent."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        factor = torch.cos(3 * torch.as_tensor(s)).expand(z.shape[:-1]).unsqueeze(-1)
        return factor * self.inner(s, z)


def test_time_concat_field_accepts_scalar_and_per_row_times() -> None:
    field = TimeConcatField(4, 6).double()
    z = torch.randn(3, 4, dtype=torch.float64)
    s = torch.tensor(0.3, dtype=torch.float64)
    per_row = field(s.expand(3), z)
    assert torch.allclose(field(s, z), per_row)
    column = torch.full((3, 1), 0.3, dtype=torch.float64)
    inner = torch.relu(field.inner(torch.cat([column, torch.relu(z)], -1)))
    expected = z + field.outer(torch.cat([column, inner], -1))
    assert torch.allclose(per_row, expected)


@pytest.mark.parametrize(
    ("backend", "adjoint"),
    [
        ("torchdiffeq", True),
        ("torchdyn", True),
        ("torchdyn", "interpolated"),
        ("torchode", True),
    ],
)
def test_adjoint_gradients_match_direct_backpropagation(backend: str, adjoint) -> None:
    torch.manual_seed(1)
    field = nn.Sequential(nn.Linear(4, 12), nn.Tanh(), nn.Linear(12, 4)).double()
    wrapped = as_field(field)
    y0 = torch.randn(6, 4, dtype=torch.float64)
    target = torch.randn(6, 4, dtype=torch.float64)
    t = torch.tensor([0.0, 1.0], dtype=torch.float64)

    def gradients(adj):
        field.zero_grad()
        y = y0.clone().requires_grad_()
        states, stats = solve(wrapped, y, t, rtol=1e-9, atol=1e-9, backend=backend, adjoint=adj)
        assert stats.nfe_backward == 0
        ((states[-1] - target) ** 2).sum().backward()
        assert stats.nfe_backward > 0
        grads = [y.grad] + [p.grad.clone() for p in field.parameters()]
        return torch.cat([g.flatten() for g in grads]), stats

    direct, direct_stats = gradients(False)
    adjoint_grads, adjoint_stats = gradients(adjoint)
    rel = (adjoint_grads - direct).norm() / direct.norm()
    assert rel.item() <= 1e-3
    assert adjoint_stats.adjoint != "direct" and direct_stats.adjoint == "direct"


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_cap_raises_with_nfe_and_step_size(backend: str) -> None:
    field, y0, t = _linear_problem(3)
    with pytest.raises(MaxStepsExceeded) as info:
        solve(field, y0 * 10, t, rtol=1e-10, atol=1e-10, backend=backend, max_num_steps=3)
    error = info.value
    assert error.nfe > 0 and error.last_step_size is not None and error.last_step_size > 0
    assert "max_num_steps=3" in str(error) and "NFE" in str(error)


class Exploding(nn.Module):
    """Finite until ``s = 0.5``, NaN after: the solve must stop and say where."""

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        late = (torch.as_tensor(s) > 0.5).expand(z.shape[:-1]).unsqueeze(-1)
        return torch.where(late, torch.full_like(z, torch.nan), -z)


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("torchdiffeq", {}),
        ("torchdyn", {}),
        ("torchode", {}),
        ("torchdiffeq", {"method": "euler", "step_size": 0.1}),
    ],
)
def test_non_finite_state_is_reported(backend: str, options: dict) -> None:
    y0 = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(NonFiniteStateError) as info:
        solve(Exploding(), y0, [0.0, 1.0], backend=backend, max_num_steps=1000, **options)
    assert info.value.nfe > 0
    assert "NFE" in str(info.value) and "step" in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"method": "dopri9"}, "dopri5"),
        ({"backend": "scipy"}, "torchdiffeq"),
        ({"backend": "torchode", "method": "dopri8"}, "offers"),
        ({"rtol": 0.0}, "rtol"),
        ({"atol": -1e-3}, "atol"),
        ({"method": "rk4"}, "step_size"),
        ({"step_size": 0.1}, "fixed-grid"),
        ({"adjoint": "interpolated"}, "torchdyn"),
        ({"adjoint": "sometimes"}, "adjoint"),
        ({"max_num_steps": 0}, "max_num_steps"),
    ],
)
def test_bad_options_are_explained(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        solve(MLPField(3), torch.zeros(2, 3), [0.0, 1.0], **options)


def test_bad_intervals_are_explained() -> None:
    with pytest.raises(ValueError, match="zero length"):
        solve(MLPField(3), torch.zeros(2, 3), [1.0, 1.0])
    with pytest.raises(ValueError, match="increasing"):
        solve(MLPField(3), torch.zeros(2, 3), [0.0, 1.0, 0.5])
    with pytest.raises(NonFiniteStateError):
        solve(MLPField(3), torch.full((2, 3), float("nan")), [0.0, 1.0])
    with pytest.raises(TypeError, match="solver option"):
        SolverConfig.coerce({"tolerance": 1e-3})


class _Riccati(nn.Module):
    """``dy/dt = theta y^2``: ``y(1) = y0 / (1 - theta y0)``, so ``dy(1)/dtheta = 1`` at
    ``theta = 1, y0 = 1/2``."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(1.0, dtype=torch.float64))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.theta * y**2


@pytest.mark.parametrize(
    ("method", "tolerance"), [("midpoint", 1e-3), ("rk4", 1e-6), ("rk4_38", 1e-6)]
)
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.slow
def test_fixed_grid_gradients_match_the_exact_one(
    method: str, tolerance: float, adjoint: bool
) -> None:
    """The adjoint's backward solve runs from t1 to t0 on the same fixed grid; a decreasing
    interval must take as many steps as the increasing one (it once took a single step,
    and the adjoint's gradient was 0.50 with midpoint instead of 1)."""
    field = _Riccati()
    y0 = torch.tensor([0.5], dtype=torch.float64)
    t = torch.tensor([0.0, 1.0], dtype=torch.float64)
    states, _ = solve(field, y0, t, method=method, step_size=0.01, adjoint=adjoint)
    states[-1].sum().backward()
    assert states[-1].item() == pytest.approx(1.0, abs=tolerance)
    assert field.theta.grad.item() == pytest.approx(1.0, abs=10 * tolerance)


def test_fixed_grid_counts_steps_on_decreasing_times() -> None:
    from neuralode_lm.solvers.config import fixed_grid, grid_steps

    forward = fixed_grid(torch.tensor([0.0, 1.0]), 0.1)
    backward = fixed_grid(torch.tensor([1.0, 0.0]), 0.1)
    assert len(forward) == len(backward) == 11
    assert torch.allclose(backward, forward.flip(0))
    assert grid_steps(torch.tensor([1.0, 0.0]), 0.1) == 10


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_a_solve_backpropagated_through_frees_its_graph(backend: str) -> None:
    """Each direct-backprop solve counts its backward evaluations with gradient hooks; once
    the step is done nothing of the solve may stay alive (a hook bound to the solve's
    monitor, which keeps the last output, made a cycle through the autograd graph that the
    collector could not free: every training step of an ODE head leaked its solve's graph)."""
    import gc

    from neuralode_lm.solvers.monitor import StepMonitor

    def live_monitors() -> int:
        gc.collect()
        return sum(type(item) is StepMonitor for item in gc.get_objects())

    torch.manual_seed(0)
    field = as_field(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4)))
    t = torch.tensor([0.0, 1.0])
    before = live_monitors()
    for _ in range(3):
        states, stats = solve(field, torch.randn(5, 4), t, backend=backend)
        states[-1].square().sum().backward()
        assert stats.nfe_backward > 0
    del states
    assert live_monitors() == before
