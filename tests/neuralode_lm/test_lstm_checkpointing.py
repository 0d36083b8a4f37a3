"""Gradient checkpointing of the LSTM family: with it on, a multi-layer ``nn.LSTM`` runs one
checkpointed layer at a time and gives the fused LSTM's outputs, final state and gradients."""

from __future__ import annotations

import warnings

import pytest
import torch

from neuralode_lm.models import LSTMLM, ODELSTM

IDS = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]).bool()


def _model(name: str, dropout: float) -> torch.nn.Module:
    torch.manual_seed(0)
    options = {"embed_dim": 8, "hidden_dim": 8, "n_layers": 3, "dropout": dropout}
    if name == "lstm":
        return LSTMLM(13, **options).train()
    solver = {"method": "rk4", "step_size": 0.5}
    return ODELSTM(13, field_hidden=8, solver=solver, **options).train()


def _run(model: torch.nn.Module, mask: torch.Tensor | None) -> tuple[list[torch.Tensor], dict]:
    model.zero_grad()
    torch.manual_seed(5)  # the same dropout masks both ways
    logits, aux = model(IDS, attention_mask=mask)
    (logits.square().mean() + sum(s.sum() for s in aux["state"])).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [logits.detach(), *aux["state"]], grads


# the padded path draws its dropout step by step (other masks, the same distribution)
CASES = {"unpadded": (None, 0.0), "dropout": (None, 0.3), "padded": (MASK, 0.0)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", ["lstm", "ode-lstm"])
def test_layer_by_layer_checkpointing_equals_the_fused_lstm(name, case):
    mask, dropout = CASES[case]
    model = _model(name, dropout)
    assert model.supports_gradient_checkpointing
    plain, plain_grads = _run(model, mask)
    recomputed: list[int] = []
    layer = model.encoder._layer
    model.encoder._layer = lambda *args: recomputed.append(args[0]) or layer(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames it
        model.gradient_checkpointing_enable()
    checkpointed, grads = _run(model, mask)
    assert recomputed == [0, 1, 2, 2, 1, 0]  # each layer, then again in the backward pass
    for a, b in zip(checkpointed, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert grads.keys() == plain_grads.keys()
    for key, grad in plain_grads.items():
        torch.testing.assert_close(grads[key], grad, rtol=0, atol=1e-6, msg=key)
    with torch.no_grad():  # no gradients: the fused LSTM, nothing recomputed
        recomputed.clear()
        model(IDS)
    assert recomputed == []
