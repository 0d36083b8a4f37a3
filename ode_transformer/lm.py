"""A decoder-only language model built from ODE Transformer blocks.

Reading order: the model (embeddings -> stack -> final LayerNorm -> tied softmax, from
:class:`~ode_transformer.backbone.Backbone`), its incremental step with a key/value cache
in which every RK stage of every block keeps its own keys and values, generation (through
:mod:`ode_transformer.generation`), then saving and loading. The configuration lives in
:mod:`ode_transformer.config`. Meets the library's model contract:
``logits, aux = model(tokens)``, ``model.is_causal``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from odelm.errors import OdelmError

from . import generation
from .backbone import Backbone, init_weights
from .config import ODETransformerConfig
from .layers import AttentionContext, KVCache

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"


class PretrainedNotFoundError(OdelmError, FileNotFoundError):
    """A directory given to ``from_pretrained`` lacks ``config.json`` or ``model.pt``."""


class ODETransformerLM(Backbone):
    """Causal LM: token + position embeddings, an ODE Transformer stack, LayerNorm, softmax."""

    is_causal = True

    def __init__(self, config: ODETransformerConfig) -> None:
        super().__init__(config, causal=True)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(init_weights)
        if config.tie_embeddings:
            self.head.weight = self.token_embedding.weight

    def hidden_states(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final-LayerNorm states ``[B, T, d_model]``; with a ``cache`` the tokens continue
        the cached sequence (positions start at ``cache.position``), extending it in place."""
        if cache is None:
            return self.states(tokens)
        hidden = self.states(tokens, cache.position, AttentionContext(cache))
        cache.position += tokens.shape[1]
        return hidden

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Logits ``[B, T, V]`` where ``logits[:, t]`` predicts ``tokens[:, t + 1]`` (``cache``:
        see :meth:`hidden_states`); ``aux["nfe"]`` counts evaluations of ``F`` (DESIGN.md's definition)."""
        return self.head(self.hidden_states(tokens, cache)), {"nfe": self.stack.nfe}

    def init_cache(self) -> KVCache:
        """An empty key/value cache for :meth:`next_token_logits` (incremental decoding)."""
        return KVCache()

    def next_token_logits(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` at the last position only (the step generation needs)."""
        return self.head(self.hidden_states(tokens, cache)[:, -1])

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int, **options: Any) -> torch.Tensor:
        """Continue ``tokens`` [B, T]: :func:`ode_transformer.generation.generate` on this model
        (options: ``strategy``, ``num_beams``, ``temperature``, ``top_k``, ``top_p``,
        ``generator``, ``eos_id``, ``use_cache``, ``length_penalty``)."""
        return generation.generate(self, tokens, max_new_tokens, **options)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.pt`` (the state dict) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_FILE).write_text(json.dumps(self.config.to_dict(), indent=2))
        torch.save(self.state_dict(), directory / WEIGHTS_FILE)

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str = "cpu") -> ODETransformerLM:
        """Rebuild a model saved by :meth:`save_pretrained`."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise PretrainedNotFoundError(
                    f"{directory / name} not found; from_pretrained expects a directory written "
                    "by save_pretrained (config.json + model.pt)"
                )
        config = ODETransformerConfig.from_dict(json.loads((directory / CONFIG_FILE).read_text()))
        model = cls(config)
        state = torch.load(directory / WEIGHTS_FILE, map_location=map_location, weights_only=True)
        model.load_state_dict(state)
        return model
