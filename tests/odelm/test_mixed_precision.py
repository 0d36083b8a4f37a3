"""``odelm.mixed_precision``: ``nn.Dropout`` bit for bit outside CPU mixed precision; inside
it, masks drawn 16 bits an element, with the keep rate, unbiasedness and gradient of
dropout; attention with bf16 products and an fp32 softmax."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from odelm.mixed_precision import Dropout, attention, dropout, keep_mask


def test_dropout_is_nn_dropout_bit_for_bit_in_full_precision() -> None:
    x = torch.randn(20, 36, 200, requires_grad=True)
    outputs, states = [], []
    for module in (nn.Dropout(0.2), Dropout(0.2)):
        torch.manual_seed(7)
        out = module(x)
        out.backward(torch.ones_like(out))
        outputs.append((out.detach(), x.grad.clone()))
        states.append(torch.get_rng_state())
        x.grad = None
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])
    assert torch.equal(states[0], states[1])  # the same draws from the generator
    assert torch.equal(Dropout(0.2).eval()(x), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_mixed_precision_masks_keep_at_the_rate_and_are_unbiased(dtype, p) -> None:
    mask, scale = keep_mask(torch.Size([400, 1000]), 1 - p, dtype)
    assert mask.dtype == dtype and set(mask.unique().tolist()) <= {0.0, 1.0}
    kept = mask.float().mean().item()
    assert abs(kept - (1 - p)) < 4 * (p * (1 - p) / mask.numel()) ** 0.5  # 4 sigma
    threshold = round((1 - p) * 2**16)
    assert scale == 2**16 / threshold and abs(threshold / 2**16 - (1 - p)) <= 2**-17


def test_mixed_precision_dropout_output_and_gradient() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 300).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = torch.get_rng_state()
        out = dropout(x, 0.1)
        assert not torch.equal(before, torch.get_rng_state())
    out.backward(torch.ones_like(out))
    kept = out != 0
    scale = 2**16 / round(0.9 * 2**16)
    expected = (x.detach().float() * scale).bfloat16()
    assert torch.equal(out.detach()[kept], expected[kept])
    assert torch.equal(x.grad[kept], torch.full_like(x.grad[kept], scale))
    assert x.grad[~kept].abs().sum() == 0 and 0.85 < kept.float().mean() < 0.95


def test_mixed_precision_attention_is_attention_with_low_precision_products() -> None:
    """The ode_transformer attention under CPU bf16 autocast: bf16 products, fp32 softmax;
    close to fp32 attention without dropout, and with dropout a fresh mask a call."""
    from ode_transformer.layers import MultiHeadSelfAttention

    torch.manual_seed(0)
    attention = MultiHeadSelfAttention(64, 2, attention_dropout=0.0)
    x = torch.randn(3, 10, 64)
    expected = attention(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = attention(x)
    assert mixed.dtype == torch.bfloat16
    assert torch.allclose(mixed.float(), expected, rtol=0.05, atol=0.05)
    attention.attention_dropout = 0.5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first, second = attention(x), attention(x)
    assert torch.isfinite(first).all() and not torch.equal(first, second)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # causal: a prefix sees only itself
        prefix, full = attention.eval()(x[:, :6]), attention(x)[:, :6]
    assert torch.allclose(prefix.float(), full.float(), rtol=0.02, atol=0.02)


def test_reference_encoder_layer_attention_under_mixed_precision() -> None:
    """The reference Transformer's layer: nn.TransformerEncoderLayer's self-attention in
    fp32, the mixed-precision attention (close to it) under CPU bf16 autocast."""
    from experiments.reference import WordLMTransformer

    torch.manual_seed(0)
    layer = WordLMTransformer(50, d_model=32, n_heads=2, d_ff=64).layers.layers[0].eval()
    x = torch.randn(3, 10, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(10)
    expected = nn.TransformerEncoderLayer._sa_block(layer, x, mask, None, is_causal=True)
    assert torch.equal(layer._sa_block(x, mask, None, is_causal=True), expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = layer._sa_block(x, mask, None, is_causal=True)
        reference = nn.TransformerEncoderLayer._sa_block(layer, x, mask, None, is_causal=True)
    assert mixed.dtype == torch.bfloat16
    assert torch.allclose(mixed.float(), reference.float(), rtol=0.05, atol=0.05)


def test_mixed_precision_attention_gradients_are_fp32_attentions() -> None:
    """fp32 scores forward, bf16 products backward: q, k, v's gradients those of fp32
    causal attention of the same bf16 inputs, to bf16 accuracy."""
    from odelm.mixed_precision import attention

    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 2, 9, 16, generator=generator).bfloat16() for _ in range(3)]
    upstream = torch.randn(2, 2, 9, 16, generator=generator)
    grads = []
    for mixed in (True, False):
        leaves = [t.clone().requires_grad_() for t in inputs]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            if mixed:
                out = attention(*leaves, causal=True).float()
            else:
                out = nn.functional.scaled_dot_product_attention(
                    *(t.float() for t in leaves), is_causal=True
                )
        out.backward(upstream)
        grads.append([t.grad.float().flatten() for t in leaves])
    for mixed, exact in zip(*grads):
        assert nn.functional.cosine_similarity(mixed, exact, 0) > 0.999


def test_cpu_mixed_precision_attention_compiles_as_one_graph():
    """``trainer.compile`` with bf16-mixed on a CPU: the attention traces whole under dynamo
    (no in-place op on the custom Function's output) and gives eager's output and gradients."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def loss(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, 0.0, True).float().square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled = torch.compile(loss, backend="eager", fullgraph=True)
    traced = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(eager, traced, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
