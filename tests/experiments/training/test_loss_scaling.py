"""``16-mixed`` with the adjoint: the GradScaler needs an overflowed scaled
gradient to reach the parameters so it can skip the step and lower its scale; the solver's
monitor lets such a backward solve through instead of stopping the run. The forward solve,
and backward solves without a loss scaler, still raise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from neuralode_lm.solvers import NonFiniteStateError, solve
from neuralode_lm.solvers.monitor import _loss_scaling, loss_scaling

ADAPTIVE = {"method": "dopri5", "adjoint": True}
FIXED = {"method": "rk4", "step_size": 0.25, "adjoint": True}


class Field(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y)


def _scaled_step(config: dict[str, Any], scaling: bool, loss_factor: float = 1e10) -> Any:
    torch.manual_seed(0)
    field = Field()
    optimizer = torch.optim.SGD(field.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # the scaled loss overflows
    before = [p.detach().clone() for p in field.parameters()]
    states, _ = solve(field, torch.randn(3, 4), torch.tensor([0.0, 1.0]), config)
    with loss_scaling(scaling):
        scaler.scale(states[-1].pow(2).sum() * loss_factor).backward()
    scaler.step(optimizer)
    scaler.update()
    unchanged = all(torch.equal(a, p) for a, p in zip(before, field.parameters(), strict=True))
    return SimpleNamespace(scale=scaler.get_scale(), unchanged=unchanged, field=field)


@pytest.mark.parametrize("config", [ADAPTIVE, FIXED], ids=["dopri5", "rk4"])
def test_an_overflowed_scaled_adjoint_gradient_skips_the_step(config: dict[str, Any]) -> None:
    step = _scaled_step(config, scaling=True)
    assert step.unchanged and step.scale == 2.0**126  # skipped, and the scale halved
    assert not all(bool(torch.isfinite(p.grad).all()) for p in step.field.parameters())


@pytest.mark.parametrize("config", [ADAPTIVE, FIXED], ids=["dopri5", "rk4"])
def test_without_a_loss_scaler_a_non_finite_backward_solve_still_raises(
    config: dict[str, Any],
) -> None:
    with pytest.raises(NonFiniteStateError, match="backward solve"):
        _scaled_step(config, scaling=False)


def test_finite_gradients_are_the_same_bits_under_loss_scaling() -> None:
    grads = []
    for scaling in (False, True):
        torch.manual_seed(0)
        field = Field()
        states, _ = solve(field, torch.randn(3, 4), torch.tensor([0.0, 1.0]), ADAPTIVE)
        with loss_scaling(scaling):
            states[-1].pow(2).sum().backward()
        grads.append([p.grad.clone() for p in field.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_the_forward_solve_still_raises_under_loss_scaling() -> None:
    class Exploding(Field):
        def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return y * torch.inf

    with loss_scaling(), pytest.raises(NonFiniteStateError, match="forward solve"):
        solve(Exploding(), torch.ones(2, 4), torch.tensor([0.0, 1.0]), FIXED)
    assert _loss_scaling == [False]


@pytest.mark.parametrize("scaler", [None, torch.amp.GradScaler("cpu")])
def test_the_task_backward_runs_under_loss_scaling_exactly_when_lightning_scales(
    scaler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.reference import BigramLM
    from experiments.training.config import OptimConfig
    from experiments.training.task import LMTask

    task = LMTask(BigramLM(5), OptimConfig())
    seen = []
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=scaler))
    monkeypatch.setattr(LMTask, "trainer", property(lambda self: trainer))
    lightning = next(c for c in LMTask.__mro__[1:] if "backward" in vars(c))  # LightningModule
    monkeypatch.setattr(
        lightning, "backward", lambda self, loss, *a, **k: seen.append(_loss_scaling[0])
    )
    task.backward(torch.zeros(()))
    assert seen == [scaler is not None] and _loss_scaling == [False]
