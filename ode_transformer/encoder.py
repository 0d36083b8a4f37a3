"""A bidirectional ODE Transformer encoder with padding masks, for sequence-to-sequence users.

``hidden = encoder(tokens, attention_mask)`` maps ``[B, T]`` ids to ``[B, T, d_model]``
states; ``attention_mask`` is True on real tokens (the library's one mask convention, as in
[`odelm.contract`][odelm.contract]; pass ``~key_padding_mask`` for torch's). No position attends to
a padding key, so the states at real tokens do not depend on the padding (its length or its
ids) when sequences are right-padded.
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
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        padding_mask: object = None,
    ) -> torch.Tensor:
        """Hidden states ``[B, T, d_model]``; ``attention_mask`` [B, T] is True on real tokens.

        States at padding positions are computed but meaningless; mask them downstream.
        ``padding_mask`` (True at padding, the old spelling) is refused with the conversion.
        """
        if padding_mask is not None:
            raise TokenInputError(
                "padding_mask (True at padding) is now attention_mask (True on real tokens), "
                "the library's one mask convention: pass attention_mask=~padding_mask"
            )
        if attention_mask is not None:
            if attention_mask.shape != tokens.shape or attention_mask.dtype != torch.bool:
                raise TokenInputError(
                    "attention_mask must be a bool tensor of the tokens' shape "
                    f"{tuple(tokens.shape)} (True on real tokens), got {attention_mask.dtype} "
                    f"{tuple(attention_mask.shape)}"
                )
            if not bool(attention_mask.any(dim=1).all()):
                raise TokenInputError(
                    "a sequence is all padding; every row needs at least one token"
                )
        return self.states(tokens, context=AttentionContext(attention_mask=attention_mask))
