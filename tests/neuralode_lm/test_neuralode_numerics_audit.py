"""The numerics audit's defects in the continuous-depth family, each against mathematics."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from neuralode_lm import (
    CausalODEHead,
    MaxStepsExceeded,
    MLPField,
    ModelConfigError,
    NonFiniteStateError,
    SolverConfig,
    as_field,
    build_model,
    solve,
)
from neuralode_lm.solvers import DEFAULT_MAX_NUM_STEPS, fixed_grid
from odelm.errors import OdelmError


def test_interpolated_adjoint_returns_the_requested_times_with_right_gradients() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 12), nn.Tanh(), nn.Linear(12, 4)).double()
    field = as_field(net)
    y0 = torch.randn(3, 4, dtype=torch.float64)
    t = torch.linspace(0.0, 1.0, 5, dtype=torch.float64)
    weights = torch.randn(5, 3, 4, dtype=torch.float64)

    def run(adjoint):
        net.zero_grad()
        y = y0.clone().requires_grad_()
        states, _ = solve(field, y, t, rtol=1e-9, atol=1e-9, backend="torchdyn", adjoint=adjoint)
        (states * weights).sum().backward()  # a loss on every requested time
        grads = torch.cat([y.grad.flatten()] + [p.grad.flatten() for p in net.parameters()])
        return states.detach(), grads

    direct_states, direct_grads = run(False)
    states, grads = run("interpolated")
    assert states.shape == (5, 3, 4)  # was 6+ rows: every internal step
    assert torch.allclose(states, direct_states, atol=1e-7)
    assert ((grads - direct_grads).norm() / direct_grads.norm()).item() < 1e-4


@pytest.mark.slow
def test_torchode_direct_gradients_are_right_for_a_relu_field() -> None:
    """torchode differentiated through its step-size controller by default (rel. error ~7
    here); the facade turns that off, so its gradients match the adjoint's."""
    torch.manual_seed(0)
    field = MLPField(16, 100).double()  # the default ReLU field
    y0 = torch.randn(64, 16, dtype=torch.float64)

    def gradients(adjoint):
        field.zero_grad()
        y = y0.clone().requires_grad_()
        states, _ = solve(
            field, y, [0.0, 1.0], rtol=1e-6, atol=1e-6, backend="torchode", adjoint=adjoint
        )
        states[-1].square().sum().backward()
        return torch.cat([y.grad.flatten()] + [p.grad.flatten() for p in field.parameters()])

    direct, adjoint = gradients(False), gradients(True)
    assert ((direct - adjoint).norm() / adjoint.norm()).item() < 1e-2


class Linear(nn.Module):
    def __init__(self, a: torch.Tensor) -> None:
        super().__init__()
        self.a = a

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return z @ self.a.T


def test_fixed_grid_steps_onto_every_requested_time_on_every_backend() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    y0 = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    t = torch.tensor([0.0, 0.35, 1.0], dtype=torch.float64)  # 0.35 is off the 0.25 lattice
    grid = fixed_grid(t, 0.25)
    # [0, 0.35] in 2 equal steps, [0.35, 1] in 3: every requested time is a grid point
    assert torch.allclose(
        grid,
        torch.tensor([0, 0.175, 0.35, 0.35 + 0.65 / 3, 0.35 + 1.3 / 3, 1.0], dtype=torch.float64),
    )
    # Euler by hand on that grid
    z, expected = y0, [y0]
    for start, end in itertools.pairwise(grid):
        z = z + (end - start) * z @ a.T
        if bool((t == end).any()):
            expected.append(z)
    expected = torch.stack(expected)
    for backend in ("torchdiffeq", "torchdyn", "torchode"):
        states, stats = solve(Linear(a), y0, t, method="euler", step_size=0.25, backend=backend)
        assert torch.allclose(states, expected, rtol=1e-12, atol=1e-12), backend
        assert stats.accepted_steps == 5, backend
    rk4 = [
        solve(Linear(a), y0, t, method="rk4", step_size=0.25, backend=b)[0]
        for b in ("torchdiffeq", "torchdyn")
    ]
    assert torch.allclose(rk4[0], rk4[1], rtol=1e-12, atol=1e-12)


class Stiff(nn.Module):
    """``dz/ds = -1e6 (z - cos s)``: explicit adaptive methods need ~1e5 steps on [0, 1]."""

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return -1e6 * (z - torch.cos(torch.as_tensor(s)).expand(z.shape[:-1]).unsqueeze(-1))


@pytest.mark.parametrize("backend", ["torchdiffeq", "torchdyn", "torchode"])
@pytest.mark.slow
def test_default_step_cap_stops_a_stiff_solve(backend: str) -> None:
    assert SolverConfig().max_num_steps == DEFAULT_MAX_NUM_STEPS
    with pytest.raises(MaxStepsExceeded) as info:
        solve(Stiff(), torch.zeros(2, 1, dtype=torch.float64), [0.0, 1.0], backend=backend)
    error = info.value
    message = str(error)
    assert f"max_num_steps={DEFAULT_MAX_NUM_STEPS}" in message and "NFE" in message
    assert "last step size" in message and "raise max_num_steps" in message
    assert error.nfe >= DEFAULT_MAX_NUM_STEPS and 0 < error.last_step_size < 1e-4
    assert isinstance(error, OdelmError)


def test_a_fixed_grid_over_the_cap_is_refused_before_solving() -> None:
    calls = []

    def field(s, z):
        calls.append(1)
        return -z

    with pytest.raises(MaxStepsExceeded, match="needs 2000 steps"):
        solve(field, torch.ones(1, 1), [0.0, 2.0], method="euler", step_size=1e-3)
    assert not calls
    states, _ = solve(
        field, torch.ones(1, 1), [0.0, 2.0], method="euler", step_size=1e-3, max_num_steps=None
    )
    assert abs(float(states[-1]) - (1 - 1e-3) ** 2000) < 1e-4


def test_non_finite_state_names_what_to_try() -> None:
    with pytest.raises(NonFiniteStateError) as info:
        solve(lambda s, z: z * torch.inf, torch.ones(1, 2), [0.0, 1.0])
    assert "learning rate" in str(info.value) and isinstance(info.value, OdelmError)


def _head_logits(head: CausalODEHead, hidden: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return head(hidden)[0]


def test_adaptive_causal_head_is_causal_within_tolerance_and_exactly_with_the_eval_option() -> None:
    """Changing later positions moves earlier logits through the shared step size (by about
    the tolerance); ``exact_causal_eval`` gives each position its own step control."""
    torch.manual_seed(0)
    solver = {"rtol": 1e-3, "atol": 1e-4}
    shared = CausalODEHead(8, 11, field_hidden=32, solver=solver).double().eval()
    exact = (
        CausalODEHead(8, 11, field_hidden=32, solver=solver, exact_causal_eval=True).double().eval()
    )
    exact.load_state_dict(shared.state_dict())
    hidden = torch.randn(2, 6, 8, dtype=torch.float64)
    changed = hidden.clone()
    changed[:, 3:] = 5 * torch.randn(2, 3, 8, dtype=torch.float64)  # only later positions
    moved = (_head_logits(shared, hidden) - _head_logits(shared, changed))[:, :3].abs().max()
    assert 1e-9 < moved.item() < 1e-2  # measured: not exact, but within the tolerance's scale
    exact_moved = (_head_logits(exact, hidden) - _head_logits(exact, changed))[:, :3].abs().max()
    assert exact_moved.item() <= 1e-12
    # the same solution to within the tolerance, and training keeps the configured solver
    assert torch.allclose(_head_logits(exact, hidden), _head_logits(shared, hidden), atol=1e-2)
    assert exact.eval_solver.backend == "torchode" and exact.solver.backend == "torchdiffeq"
    with pytest.raises(ValueError, match="exact_causal_eval"):
        CausalODEHead(8, 11, solver={"method": "bosh3"}, exact_causal_eval=True)
    with pytest.raises(ModelConfigError, match="reconstruction decoder"):
        build_model("ode-lstm", 11, reconstruction=True, exact_causal_eval=True)


def test_peak_memory_of_the_benchmarks_sees_one_known_allocation() -> None:
    from benchmarks.ode_heads import _peak_bytes

    size = 4 * 1000 * 1000  # one float32 tensor of a million elements
    peak = _peak_bytes(lambda: torch.ones(1000, 1000).sum())
    assert size <= peak < size + 2**20
