"""``neuralode_lm.odeint`` against ``torchdiffeq.odeint``; fixed grids read off float32 times."""

from __future__ import annotations

import pytest
import torch
import torchdiffeq

import neuralode_lm
from neuralode_lm.solvers import SolverConfigError, SolverStats, fixed_grid, solve

A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]])


def spiral(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """torchdiffeq's ode_demo: ``dy/dt = (y ** 3) @ A``."""
    return (y**3) @ A


Y0 = torch.tensor([[2.0, 0.0]])
T = torch.linspace(0.0, 25.0, 1000)


@pytest.mark.slow
def test_odeint_equals_torchdiffeq_on_the_spiral_with_its_defaults() -> None:
    ours = neuralode_lm.odeint(spiral, Y0, T)
    reference = torchdiffeq.odeint(spiral, Y0, T)
    assert isinstance(ours, torch.Tensor) and ours.shape == (1000, 1, 2)
    assert float((ours - reference).abs().max()) <= 1e-6
    # solve's looser defaults (rtol 1e-3, atol 1e-4) are visibly another solution
    loose, _ = solve(spiral, Y0, T)
    assert float((loose - reference).abs().max()) > 1e-3


@pytest.mark.slow
def test_odeint_passes_tolerances_method_and_options_like_torchdiffeq() -> None:
    ours, stats = neuralode_lm.odeint(
        spiral, Y0, T, rtol=1e-5, atol=1e-6, method="bosh3", return_stats=True
    )
    reference = torchdiffeq.odeint(spiral, Y0, T, rtol=1e-5, atol=1e-6, method="bosh3")
    assert float((ours - reference).abs().max()) <= 1e-6
    assert isinstance(stats, SolverStats) and stats.method == "bosh3" and stats.nfe_forward > 0
    short = torch.linspace(0.0, 2.5, 101)  # torchdiffeq's rk4 is our rk4_38
    fixed = neuralode_lm.odeint(spiral, Y0, short, method="rk4_38", options={"step_size": 0.0125})
    on_t = neuralode_lm.odeint(spiral, Y0, short, method="rk4_38")
    halves = torchdiffeq.odeint(spiral, Y0, torch.linspace(0.0, 2.5, 201), method="rk4")
    assert float((fixed - halves[::2]).abs().max()) <= 1e-5  # grids equal to float32 noise
    assert float((on_t - torchdiffeq.odeint(spiral, Y0, short, method="rk4")).abs().max()) <= 1e-6
    assert float((on_t - fixed).abs().max()) > 1e-6


def test_odeint_refuses_options_it_does_not_translate() -> None:
    with pytest.raises(SolverConfigError, match=r"\['first_step'\] are not supported"):
        neuralode_lm.odeint(spiral, Y0, T, options={"first_step": 0.1})


def test_odeint_has_no_step_cap_unless_asked_like_torchdiffeq() -> None:
    def decay(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -y

    # solve's default cap is 1000 steps; torchdiffeq's (and odeint's) is none
    t = torch.linspace(0.0, 1.0, 1500)
    _, stats = neuralode_lm.odeint(decay, Y0, t, method="euler", return_stats=True)
    assert stats.accepted_steps == 1499
    with pytest.raises(neuralode_lm.MaxStepsExceeded, match="needs 1499 steps"):
        neuralode_lm.odeint(decay, Y0, t, method="euler", options={"max_num_steps": 500})


@pytest.mark.parametrize(("start", "end", "count"), [(0, 1, 1000), (0, 25, 1000), (3, 7, 333)])
@pytest.mark.slow
def test_a_step_size_read_off_a_float32_linspace_steps_once_per_interval(
    start: float, end: float, count: int
) -> None:
    t = torch.linspace(start, end, count)
    gaps = t[1:] - t[:-1]
    for step in {float(t[1] - t[0]), float(t[-1] - t[-2]), float(gaps.max()), float(gaps.min())}:
        assert fixed_grid(t, step).numel() == count
        assert fixed_grid(t, step / 3).numel() == 3 * (count - 1) + 1
        assert fixed_grid(t.double(), step).numel() == count  # float32 times in a float64 state
        assert fixed_grid(t, step * 0.8).numel() == 2 * (count - 1) + 1  # a longer gap: 2 steps


def test_rk4_with_the_spacing_of_a_float32_linspace_as_step_size_runs_the_meant_grid() -> None:
    """A float32 linspace's spacing as the step runs the meant grid: it once raised MaxStepsExceeded "needs 1424 steps" for a 999-step grid."""
    t = torch.linspace(0, 1, 1000)
    states, stats = solve(
        lambda s, z: -z, torch.ones(1, 2), t, method="rk4", step_size=float(t[1] - t[0])
    )
    assert stats.accepted_steps == 999 and stats.nfe_forward == 4 * 999
    assert float((states[-1] - torch.exp(torch.tensor(-1.0))).abs().max()) < 1e-6
