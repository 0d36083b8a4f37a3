"""``solver_stats`` (``last_stats``) is one frozen type on both continuous-depth model kinds:
the ODE-head models (one solve per forward) and ``node-transformer`` (one per block)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from neuralode_lm import ForwardStats, NODETransformerLM, SolverStats, build_model

V = 12


def _models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "ode-lstm": build_model("ode-lstm", V, embed_dim=8, hidden_dim=8, field_hidden=8),
        "node-transformer": build_model(
            "node-transformer", V, d_model=16, n_heads=2, d_ff=32, max_positions=16, dropout=0.0
        ),
    }


@pytest.mark.parametrize("name", ["ode-lstm", "node-transformer"])
def test_both_model_kinds_report_one_frozen_stats_type(name: str) -> None:
    model = _models()[name].train()
    assert model.solver_stats == ForwardStats()  # nothing solved yet
    logits, aux = model(torch.randint(0, V, (2, 5)))
    stats = model.solver_stats
    holder = model.head if name == "ode-lstm" else model  # where the forward pass keeps it
    assert type(stats) is ForwardStats and stats is holder.last_stats
    assert all(isinstance(solve, SolverStats) for solve in stats.solves) and stats.solves
    assert stats.nfe_forward == aux["nfe"] > 0
    assert stats.nfe_backward == 0
    logits.sum().backward()
    assert stats.nfe_backward > 0  # read after backward: the counts grow in place
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.solves = ()  # type: ignore[misc]


def test_the_sums_are_over_solves() -> None:
    a = SolverStats("torchdiffeq", "rk4", "direct", 8, 4, 2, 0)
    b = SolverStats("torchdiffeq", "dopri5", "direct", 14, 7, None, None)
    assert ForwardStats((a, a)).nfe_forward == 16 and ForwardStats((a, a)).accepted_steps == 4
    assert ForwardStats((a, b)).nfe_backward == 11 and ForwardStats((a, b)).rejected_steps is None
    assert ForwardStats().accepted_steps is None and ForwardStats().nfe_forward == 0
    c = SolverStats("torchdiffeq", "dopri5", "backsolve", 10, 20, 3, 1)
    assert ForwardStats((c, c)).adjoint == "backsolve" and ForwardStats().adjoint == "direct"


def test_the_flagship_is_exported() -> None:
    assert NODETransformerLM.__module__ == "neuralode_lm.transformer"
    assert "NODETransformerLM" in __import__("neuralode_lm").__all__
