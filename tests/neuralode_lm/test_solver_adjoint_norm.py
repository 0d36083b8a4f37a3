"""The adjoint's backward NFE, the seminorm adjoint, and a solver config built once per model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neuralode_lm import SolverConfig, SolverConfigError, build_model, solve
from neuralode_lm.solvers import config as solver_config

TOL = {"method": "dopri5", "rtol": 1e-7, "atol": 1e-9, "adjoint": True}


class CountingField(nn.Module):
    """A small tanh MLP field that counts its own evaluations."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 4))
        self.calls = 0

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return 2.0 * self.net(y)


def _gradients(norm: str) -> tuple[list[torch.Tensor], torch.Tensor, int, int]:
    """Parameter and initial-state gradients of ``|z(2)|^2``, the backward NFE and the
    field's own count of its evaluations during the backward pass."""
    field = CountingField().double()
    y0 = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y0.requires_grad_(True)
    states, stats = solve(field, y0, [0.0, 2.0], adjoint_norm=norm, **TOL)
    forward_calls = field.calls
    states[-1].pow(2).sum().backward()
    grads = [p.grad.clone() for p in field.parameters()]
    return grads, y0.grad.clone(), stats.nfe_backward, field.calls - forward_calls


def test_seminorm_gradients_equal_the_plain_adjoints_within_tolerance() -> None:
    plain, plain_y0, plain_nfe, _ = _gradients("mixed")
    semi, semi_y0, semi_nfe, _ = _gradients("seminorm")
    for a, b in zip(semi, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(semi_y0, plain_y0, rtol=1e-5, atol=1e-7)
    # the seminorm leaves the parameter gradients out of step control: fewer backward steps
    assert 0 < semi_nfe < plain_nfe


@pytest.mark.parametrize("norm", ["mixed", "seminorm"])
def test_backward_nfe_is_the_number_of_field_evaluations_in_the_backward_solve(
    norm: str,
) -> None:
    _, _, nfe_backward, counted = _gradients(norm)
    assert nfe_backward > 0
    assert nfe_backward == counted


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"adjoint_norm": "semi", "adjoint": True}, "unknown adjoint_norm 'semi'; valid: mixed"),
        ({"adjoint_norm": "seminorm"}, "needs adjoint=True"),
        ({"adjoint_norm": "seminorm", "adjoint": True, "backend": "torchdyn"}, "torchdiffeq"),
        (
            {"adjoint_norm": "seminorm", "adjoint": True, "method": "rk4", "step_size": 0.5},
            "adaptive method",
        ),
    ],
)
def test_bad_adjoint_norm_is_one_clear_line(options: dict, message: str) -> None:
    with pytest.raises(SolverConfigError, match=message) as error:
        SolverConfig(**options)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["ode-lstm", "node-transformer"])
def test_a_model_builds_its_solver_config_once_not_per_forward(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = {"d_model": 16, "n_heads": 2, "d_ff": 32} if name == "node-transformer" else {}
    if name == "ode-lstm":
        sizes = {"embed_dim": 8, "hidden_dim": 8, "field_hidden": 8}
    torch.manual_seed(0)
    model = build_model(name, 20, solver={"method": "dopri5", "adjoint": True}, **sizes).eval()
    tokens = torch.randint(0, 20, (2, 5))
    before, _ = model(tokens)
    built: list[object] = []
    original = solver_config._validate
    monkeypatch.setattr(solver_config, "_validate", lambda cfg: built.append(cfg) or original(cfg))
    torch.manual_seed(0)
    logits, _ = model(tokens)
    logits.sum().backward()
    assert built == []  # no SolverConfig was made (validated) in the forward or backward
    torch.testing.assert_close(logits, before)


@pytest.mark.slow
def test_result_records_the_adjoints_backward_nfe_only_where_training_used_it(
    tmp_path, tiny_config
) -> None:
    from experiments.training.config import parse_config
    from experiments.training.train import train

    node = {"family": "neuralode_lm", "name": "node-transformer", "d_model": 16, "d_ff": 32}
    results = {}
    for adjoint in (True, False):
        solver = {"method": "dopri5", "adjoint": adjoint}
        if adjoint:
            solver["adjoint_norm"] = "seminorm"
        config = tiny_config(
            tmp_path,
            f"adjoint-{adjoint}",
            trainer={"max_steps": 3, "val_every": 3, "checkpoint_every": 3},
            eval={"bleu_sentences": 0},
        )
        config["model"] = {**node, "n_heads": 2, "solver": solver}  # replaces the tiny model
        results[adjoint] = train(parse_config(config))
    assert results[True]["train_nfe_backward"] > 0
    assert "train_nfe_backward" not in results[False]


def test_seminorm_saving_is_a_registered_benchmark() -> None:
    from experiments.cli.bench import BENCHMARKS, resolve

    assert callable(resolve("seminorm-saving")) and "seminorm-saving" in BENCHMARKS
