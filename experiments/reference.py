"""A small reference model for the harness: a bigram language model.

``logits[:, t]`` depends on ``tokens[:, t]`` alone, so it is causal by construction, and its
maximum-likelihood table has a closed form (smoothed bigram counts), which lets tests check
the harness's perplexity against a number computed by hand.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from odelm.pretrained import PretrainedMixin


class BigramLM(PretrainedMixin, nn.Module):
    """``logits[b, t] = table[tokens[b, t]]``: the smallest model that meets the contract."""

    is_causal = True

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.table = nn.Embedding(vocab_size, vocab_size)
        nn.init.zeros_(self.table.weight)

    # A bigram reads only the previous token, so no real token's prediction ever sees
    # padding: it honours any attention mask without using it.
    accepts_attention_mask = True

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.table(tokens), {}

    @classmethod
    def from_counts(cls, ids: torch.Tensor, vocab_size: int, smoothing: float = 0.1) -> BigramLM:
        """The additively smoothed maximum-likelihood bigram model of a token stream."""
        counts = torch.full((vocab_size, vocab_size), smoothing, dtype=torch.float64)
        counts.index_put_(
            (ids[:-1], ids[1:]), torch.ones(ids.numel() - 1, dtype=torch.float64), accumulate=True
        )
        model = cls(vocab_size)
        with torch.no_grad():
            model.table.weight.copy_((counts / counts.sum(1, keepdim=True)).log().float())
        return model

    def block_modules(self) -> list[nn.Module]:
        return [self.table]
