"""One padding-mask convention across the library: ``attention_mask`` True on real tokens.

The harness's sentence batches reach a masked model through ``call_model`` unchanged, the
ODE Transformer encoder reads them as GPT-2 does, its attention equals torch's under the
negated ``key_padding_mask``, and the old ``padding_mask`` spelling is refused with a hint.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from experiments.data.batching import sentence_batch
from ode_transformer import ODETransformerConfig, ODETransformerEncoder
from ode_transformer.backbone import TokenInputError
from ode_transformer.layers import AttentionContext, MultiHeadSelfAttention
from odelm.contract import call_model

VOCAB = 23
SENTENCES = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]


def _encoder() -> ODETransformerEncoder:
    torch.manual_seed(3)
    config = ODETransformerConfig(
        vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_positions=16,
        block="rk2", dropout=0.0, attention_dropout=0.0, relu_dropout=0.0,
    )  # fmt: skip
    return ODETransformerEncoder(config).eval()


class _EncoderLM(nn.Module):
    """A masked LM over the encoder: the contract's ``accepts_attention_mask`` path."""

    is_causal = False
    accepts_attention_mask = True

    def __init__(self) -> None:
        super().__init__()
        self.encoder = _encoder()
        self.head = nn.Linear(16, VOCAB)

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.head(self.encoder(tokens, attention_mask)), {}


def test_the_harness_mask_reaches_the_encoder_unchanged_and_hides_the_padding():
    tokens, mask = sentence_batch(SENTENCES, pad_id=1, bos_id=0, side="right")
    model = _EncoderLM()
    with torch.no_grad():
        logits, _ = call_model(model, tokens, mask)
        alone, _ = model(tokens[1:, :4])
        other_pad, _ = call_model(model, tokens.masked_fill(~mask, 2), mask)
    assert mask[1].tolist() == [True] * 4 + [False] * 3  # True on real tokens
    torch.testing.assert_close(logits[1, :4], alone[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(other_pad[1, :4], logits[1, :4], rtol=0, atol=1e-6)


def test_attention_under_the_mask_is_torchs_under_the_negated_key_padding_mask():
    """The conversion at the boundary: ``attention_mask`` is ``~key_padding_mask``, number for
    number, against ``torch.nn.MultiheadAttention`` with the same weights."""
    torch.manual_seed(4)
    attention = MultiHeadSelfAttention(16, 2, causal=False).eval()
    reference = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(attention.qkv.weight)
        reference.in_proj_bias.copy_(attention.qkv.bias)
        reference.out_proj.weight.copy_(attention.out.weight)
        reference.out_proj.bias.copy_(attention.out.bias)
        _, mask = sentence_batch(SENTENCES, pad_id=1, bos_id=0, side="left")
        x = torch.randn(*mask.shape, 16)
        ours = attention(x, AttentionContext(attention_mask=mask))
        torchs, _ = reference(x, x, x, key_padding_mask=~mask, need_weights=False)
        unmasked = attention(x)
    torch.testing.assert_close(ours, torchs, rtol=0, atol=1e-6)
    assert (ours - unmasked).abs().max() > 1e-3  # the mask does act


def test_the_old_spelling_and_a_wrong_mask_are_refused_with_a_hint():
    tokens, mask = sentence_batch(SENTENCES, pad_id=1, bos_id=0)
    encoder = _encoder()
    with pytest.raises(TokenInputError, match=r"attention_mask=~padding_mask"):
        encoder(tokens, padding_mask=~mask)
    with pytest.raises(TokenInputError, match="True on real tokens"):
        encoder(tokens, mask.long())
    with pytest.raises(TokenInputError, match="all padding"):
        encoder(tokens, torch.zeros_like(mask))
