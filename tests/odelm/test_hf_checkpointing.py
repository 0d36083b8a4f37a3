"""Gradient checkpointing: ``gradient_checkpointing_enable()`` on every family with
layers, RK stages or vector fields (per layer for the stacks, per RK stage / field evaluation
for the blocks and fields, ``transformers``' own GPT-2 blocks) gives the gradients of the plain
backward pass."""

from __future__ import annotations

import warnings

import pytest
import torch

from odelm.hf import HuggingFaceError
from tests.support.families import FAMILIES

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not

WITHOUT = {"bigram"}  # a table: nothing to recompute
IDS = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])


def _gradients(model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    torch.manual_seed(5)  # the same dropout masks both ways
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - WITHOUT))
def test_checkpointed_gradients_equal_plain_ones(name):
    torch.manual_seed(0)
    model = FAMILIES[name]().train()
    assert model.supports_gradient_checkpointing and not model.is_gradient_checkpointing
    loss, plain = _gradients(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames it
        model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    checkpointed_loss, checkpointed = _gradients(model)
    assert checkpointed_loss == pytest.approx(loss, abs=1e-6)
    assert plain.keys() == checkpointed.keys()
    for key, grad in plain.items():
        torch.testing.assert_close(checkpointed[key], grad, rtol=0, atol=1e-6, msg=key)
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing


@pytest.mark.parametrize("name", sorted(WITHOUT))
def test_models_without_layers_say_so(name):
    model = FAMILIES[name]()
    assert not model.supports_gradient_checkpointing
    message = r"^BigramLM has no layers, RK stages or vector fields, so there is nothing to"
    with pytest.raises(HuggingFaceError, match=message), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()


def test_trainer_with_gradient_checkpointing(tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = FAMILIES["node-transformer-grid"]()
    data = [{"input_ids": torch.arange(1, 9), "labels": torch.arange(1, 9)} for _ in range(4)]
    args = TrainingArguments(
        str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        gradient_checkpointing=True,
        remove_unused_columns=False,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        Trainer(model=model, args=args, train_dataset=data).train()
    assert model.is_gradient_checkpointing


def _saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward pass (activation memory)."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids).loss.backward()
    return total


def test_checkpointing_keeps_fewer_activations():
    torch.manual_seed(0)
    model = FAMILIES["ode_transformer-rk4"]().train()
    ids = torch.randint(1, 20, (4, 32))
    plain = _saved_bytes(model, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()
    assert _saved_bytes(model, ids) < 0.5 * plain
