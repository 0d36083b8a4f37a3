"""A decoder-only language model built from ODE Transformer blocks.

Reading order: the model (embeddings -> stack -> final LayerNorm -> tied softmax, from
``Backbone``), its incremental step with a key/value cache
in which every RK stage of every block keeps its own keys and values, generation (through
[`odelm.decoding`][odelm.decoding]). Saving and loading come from
[`odelm.pretrained.PretrainedMixin`][odelm.pretrained.PretrainedMixin] (``config.json`` +
``model.safetensors``); the configuration lives in ``ode_transformer.config``. Meets the library's
model contract: ``logits, aux = model(tokens)``, ``model.is_causal``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .backbone import Backbone, init_weights
from .config import ODETransformerConfig
from .layers import AttentionContext, KVCache


class ODETransformerLM(Backbone):
    """Causal LM: token + position embeddings, an ODE Transformer stack, LayerNorm, softmax."""

    is_causal = True

    def __init__(self, config: ODETransformerConfig) -> None:
        super().__init__(config, causal=True)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(init_weights)
        if config.tie_embeddings:
            self.head.weight = self.token_embedding.weight

    def hidden_states(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-LayerNorm states ``[B, T, d_model]``; with a ``cache`` the tokens continue
        the cached sequence (positions start at ``cache.position``), extending it in place.
        ``attention_mask`` (True on real tokens) covers the cached tokens and these."""
        if cache is None:
            return self.states(tokens, context=AttentionContext(None, attention_mask))
        hidden = self.states(tokens, cache.position, AttentionContext(cache, attention_mask))
        cache.position += tokens.shape[1]
        return hidden

    def features(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Final-LayerNorm states ``[B, T, d_model]``, which
        [`output_layer`][ode_transformer.ODETransformerLM.output_layer] maps to the logits, and
        ``aux`` (as [`forward`][ode_transformer.ODETransformerLM.forward]'s)."""
        return self.hidden_states(tokens), {"nfe": self.stack.nfe}

    @property
    def output_layer(self) -> nn.Linear:
        """The softmax layer: ``forward(tokens)`` is ``(output_layer(hidden), aux)`` of
        [`features`][ode_transformer.ODETransformerLM.features]."""
        return self.head

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """Logits ``[B, T, V]`` where ``logits[:, t]`` predicts ``tokens[:, t + 1]`` (``cache``,
        ``attention_mask``: see [`hidden_states`][ode_transformer.ODETransformerLM.hidden_states]);
        ``aux["nfe"]`` counts evaluations of ``F`` (DESIGN.md's definition)."""
        hidden = self.hidden_states(tokens, cache, attention_mask)
        return self.head(hidden), {"nfe": self.stack.nfe}

    def init_cache(self) -> KVCache:
        """An empty key/value cache for
        [`next_token_logits`][ode_transformer.ODETransformerLM.next_token_logits] (incremental
        decoding)."""
        return KVCache()

    def next_token_logits(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` at the last position only (the step generation needs)."""
        return self.head(self.hidden_states(tokens, cache)[:, -1])

    def generate(self, *args: Any, **options: Any) -> Any:
        """Continue ``tokens`` [B, T]: ``generate(tokens, max_new_tokens, strategy=...)`` is
        [`odelm.decoding.generate`][odelm.decoding.generate] on this model (options:
        ``strategy``, ``num_beams``, ``temperature``, ``top_k``, ``top_p``, ``generator``,
        ``eos_id``, ``use_cache``, ``length_penalty``); ``generate(input_ids, max_new_tokens=...,
        do_sample=..., num_beams=...)`` is Hugging Face's
        ([`odelm.hf.HuggingFaceLM.generate`][odelm.hf.model.HuggingFaceLM.generate])."""
        return super().generate(*args, **options)
