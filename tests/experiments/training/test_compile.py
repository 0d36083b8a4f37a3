"""``trainer.compile``: training steps go through ``torch.compile`` of the model's forward,
with the logits and gradients of the eager model, and checkpoints keep the model's keys."""

from __future__ import annotations

import pytest
import torch

from experiments.models.build import build_model
from experiments.training.compiled import CompiledModel, CompileUnsupportedError
from experiments.training.config import OptimConfig
from experiments.training.task import LMTask

V = 40
ODE_TRANSFORMER = {
    "family": "ode_transformer",
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
    "n_layers": 1,
    "block": "rk4",
    "attention_dropout": 0.0,
    "relu_dropout": 0.0,
}
NODE_GRID = {
    "family": "neuralode_lm",
    "name": "node-transformer",
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
    "solver": {"method": "rk4"},
    "steps": 2,
}


@pytest.mark.slow
@pytest.mark.parametrize("spec", [ODE_TRANSFORMER, NODE_GRID], ids=["rk4", "node-grid"])
def test_compiled_training_step_matches_eager(spec: dict) -> None:
    torch.manual_seed(0)
    model = build_model({**spec, "dropout": 0.0}, V).train()
    task = LMTask(model, OptimConfig(), compile=True).train()
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(1))
    compiled_loss, _ = task._loss(tokens)
    compiled_loss.backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    task.compiled = None  # the same task and weights, eager
    eager_loss, _ = task._loss(tokens)
    eager_loss.backward()
    assert torch.allclose(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for compiled, eager in zip(compiled_grads, (p.grad for p in model.parameters())):
        assert torch.allclose(compiled, eager, rtol=1e-4, atol=1e-6)
    eager_logits, _ = model(tokens)
    compiled_logits, _ = CompiledModel(model)(tokens)
    assert torch.allclose(compiled_logits, eager_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_task_keeps_the_model_keys_and_evaluates_eagerly() -> None:
    model = build_model(ODE_TRANSFORMER, V)
    task = LMTask(model, OptimConfig(), compile=True)
    assert all(key.startswith("model.") for key in task.state_dict())
    assert task.state_dict().keys() == LMTask(model, OptimConfig()).state_dict().keys()
    assert task.compiled.vocab_size == V and task.compiled.is_causal
    task.eval()
    assert task._training_model() is model  # validation never waits for a compile


def test_compile_refuses_adaptive_solvers_in_one_line() -> None:
    adaptive = build_model({**NODE_GRID, "solver": {"method": "dopri5"}, "steps": None}, V)
    with pytest.raises(CompileUnsupportedError, match="trainer.compile: false") as error:
        LMTask(adaptive, OptimConfig(), compile=True)
    assert "\n" not in str(error.value)
