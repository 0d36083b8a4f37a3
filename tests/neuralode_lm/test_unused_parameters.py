"""Every trainable parameter gets a gradient in one training step: DDP's
unused-parameter check stops a run whose backward leaves a trainable parameter without one.
ODE-GPT2 reading a hidden ``layer`` below the last block never uses the blocks above it
nor the final norm; they are frozen."""

from __future__ import annotations

import pytest
import torch

from neuralode_lm import build_model

TINY_GPT2 = {"n_layer": 3, "n_embd": 16, "n_head": 2, "n_positions": 16}
RK4 = {"method": "rk4", "step_size": 0.5}


def _ungraded(model: torch.nn.Module) -> list[str]:
    tokens = torch.randint(0, 30, (2, 6))
    logits, aux = model(tokens)
    (logits.float().logsumexp(-1).mean() + aux.get("reg", 0.0)).backward()
    return [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]


@pytest.mark.parametrize("layer", [0, 1, 2, 3, -1])
def test_ode_gpt2_below_its_last_block_leaves_no_trainable_parameter_without_gradient(
    layer: int,
) -> None:
    model = build_model("ode-gpt2", 30, config=TINY_GPT2, layer=layer, field_hidden=8, solver=RK4)
    assert _ungraded(model) == []
    encoder = model.encoder.model
    used = layer % 4
    trainable = [any(p.requires_grad for p in block.parameters()) for block in encoder.h]
    assert trainable == [i < used for i in range(3)]
    assert encoder.ln_f.weight.requires_grad is (used == 3)
    assert encoder.wte.weight.requires_grad


def test_freeze_still_freezes_all_of_gpt2() -> None:
    model = build_model("ode-gpt2", 30, config=TINY_GPT2, layer=1, freeze=True, solver=RK4)
    assert not any(p.requires_grad for p in model.encoder.parameters())
    assert _ungraded(model) == []
