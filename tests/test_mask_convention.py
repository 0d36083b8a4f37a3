"""One padding-mask convention across the library: ``attention_mask`` True on real tokens.

The harness's sentence batches, the contract's ``call_model``, GPT-2 based models and the
ODE Transformer encoder all read the same mask without conversion, with the numbers of
the old ``padding_mask`` (True at padding) spelling, which is refused with a hint.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from experiments.data.batching import sentence_batch
from ode_transformer import ODETransformerConfig, ODETransformerEncoder
from ode_transformer.backbone import TokenInputError
from ode_transformer.layers import AttentionContext
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


def test_the_encoder_gives_the_numbers_of_the_old_padding_mask_exactly():
    """The old code masked keys with ``~padding_mask``; the attention mask is that tensor."""
    tokens, mask = sentence_batch(SENTENCES, pad_id=1, bos_id=0, side="right")
    encoder = _encoder()
    padding_mask = ~mask
    with torch.no_grad():
        new = encoder(tokens, attention_mask=mask)
        old = encoder.states(tokens, context=AttentionContext(attention_mask=~padding_mask))
        unmasked = encoder(tokens)
    assert torch.equal(new, old)
    assert (new[1, :4] - unmasked[1, :4]).abs().max() > 1e-4  # the mask does act


def test_the_old_spelling_and_a_wrong_mask_are_refused_with_a_hint():
    tokens, mask = sentence_batch(SENTENCES, pad_id=1, bos_id=0)
    encoder = _encoder()
    with pytest.raises(TokenInputError, match=r"attention_mask=~padding_mask"):
        encoder(tokens, padding_mask=~mask)
    with pytest.raises(TokenInputError, match="True on real tokens"):
        encoder(tokens, mask.long())
    with pytest.raises(TokenInputError, match="all padding"):
        encoder(tokens, torch.zeros_like(mask))
