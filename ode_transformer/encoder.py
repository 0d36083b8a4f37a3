"""A bidirectional ODE Transformer encoder with padding masks, for sequence-to-sequence users.

``hidden = encoder(tokens, padding_mask)`` maps ``[B, T]`` ids to ``[B, T, d_model]`` states;
no position attends to a padding key, so the states at real tokens do not depend on the
padding (its length or its ids) when sequences are right-padded.
"""

from __future__ import annotations

import torch
from torch import nn

from .lm import ODETransformerConfig, check_tokens, init_weights
from .stacks import build_stack


class ODETransformerEncoder(nn.Module):
    """Token + position embeddings, a bidirectional ODE Transformer stack, final LayerNorm."""

    is_causal = False

    def __init__(self, config: ODETransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_positions
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_positions, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=False)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.apply(init_weights)

    def block_modules(self) -> list[nn.Module]:
        """The per-layer modules, in depth order."""
        return list(self.stack.layers)

    def forward(
        self, tokens: torch.Tensor, padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states ``[B, T, d_model]``; ``padding_mask`` [B, T] is True at padding.

        States at padding positions are computed but meaningless; mask them downstream.
        """
        check_tokens(tokens, self.vocab_size, self.max_positions)
        if padding_mask is not None:
            if padding_mask.shape != tokens.shape or padding_mask.dtype != torch.bool:
                raise ValueError(
                    f"padding_mask must be a bool tensor of the tokens' shape {tuple(tokens.shape)}"
                    f" (True at padding), got {padding_mask.dtype} {tuple(padding_mask.shape)}"
                )
            if bool(padding_mask.all(dim=1).any()):
                raise ValueError("a sequence is all padding; every row needs at least one token")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        return self.norm(self.stack(x, padding_mask=padding_mask))
