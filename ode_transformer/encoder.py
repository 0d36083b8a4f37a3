"""A bidirectional ODE Transformer encoder with padding masks, for sequence-to-sequence users.

``hidden = encoder(tokens, padding_mask)`` maps ``[B, T]`` ids to ``[B, T, d_model]`` states;
no position attends to a padding key, so the states at real tokens do not depend on the
padding (its length or its ids) when sequences are right-padded.
"""

from __future__ import annotations

import torch

from .backbone import Backbone, TokenInputError, init_weights
from .config import ODETransformerConfig
from .layers import AttentionContext


class ODETransformerEncoder(Backbone):
    """Token + position embeddings, a bidirectional ODE Transformer stack, final LayerNorm."""

    is_causal = False

    def __init__(self, config: ODETransformerConfig) -> None:
        super().__init__(config, causal=False)
        self.apply(init_weights)

    def forward(
        self, tokens: torch.Tensor, padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states ``[B, T, d_model]``; ``padding_mask`` [B, T] is True at padding.

        States at padding positions are computed but meaningless; mask them downstream.
        """
        if padding_mask is not None:
            if padding_mask.shape != tokens.shape or padding_mask.dtype != torch.bool:
                raise TokenInputError(
                    f"padding_mask must be a bool tensor of the tokens' shape {tuple(tokens.shape)}"
                    f" (True at padding), got {padding_mask.dtype} {tuple(padding_mask.shape)}"
                )
            if bool(padding_mask.all(dim=1).any()):
                raise TokenInputError(
                    "a sequence is all padding; every row needs at least one token"
                )
        return self.states(tokens, context=AttentionContext(padding_mask=padding_mask))
