"""PEFT LoRA on one model of every family, with the target modules docs/usage.md
names: adapters start as the identity and train."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import FAMILIES
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not

TARGETS = {
    "ode_transformer-rk4": ["qkv", "out", "fc1", "fc2"],
    "ode_transformer-macaron": ["qkv", "out", "fc1", "fc2"],
    "node-transformer-grid": ["qkv", "out", "fc1", "fc2"],
    "lstm": ["embedding", "head"],
    "ode-lstm": ["embedding", "field.net.0", "field.net.2", "proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "ode-gpt2": ["c_attn", "c_proj", "c_fc", "field.net.0", "field.net.2", "proj"],
    "reference-transformer": ["linear1", "linear2", "decoder"],
    "bigram": ["table"],
}
USAGE = ROOT / "docs" / "usage.md"


def test_the_docs_name_every_familys_targets():
    text = USAGE.read_text()
    for targets in TARGETS.values():
        assert str(targets).replace("'", '"') in text


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_lora_on_every_family(name):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    base = model(input_ids=ids).logits.detach()
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=TARGETS[name], lora_dropout=0.0)
    adapted = peft.get_peft_model(model, config)
    trainable = [(n, p) for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, _ in trainable)
    out = adapted(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.logits, base, rtol=0, atol=1e-6)  # LoRA starts at zero
    out.loss.backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for _, p in trainable)
