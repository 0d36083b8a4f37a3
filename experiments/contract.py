"""The one contract every language model in this library meets.

``logits, aux = model(tokens)`` with ``tokens`` a LongTensor ``[B, T]`` and ``logits`` a
float tensor ``[B, T, V]`` where ``logits[:, t]`` predicts ``tokens[:, t + 1]``. ``aux`` is a
dict of extras (for example ``{"nfe": 38}``). ``model.is_causal`` is True when
``logits[:, t]`` depends only on ``tokens[:, : t + 1]``; the harness refuses to call the
perplexity of a non-causal model a language-model perplexity unless asked.

Optional attributes the harness uses when present: ``vocab_size`` (int) and
``max_positions`` (the longest sequence the model accepts).
"""

from __future__ import annotations

from typing import Any

import torch

from odelm.errors import OdelmError


class ContractError(OdelmError, TypeError):
    """A model does not meet the model contract."""


def call_model(model: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run ``model(tokens)`` and check the result against the contract."""
    if not hasattr(model, "is_causal"):
        raise ContractError(
            f"{type(model).__name__} has no `is_causal` attribute; every model must say "
            "whether logits[:, t] depends only on tokens[:, :t+1]"
        )
    out = model(tokens)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise ContractError(
            f"{type(model).__name__}(tokens) must return (logits, aux_dict), got {type(out).__name__}"
        )
    logits, aux = out
    if logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        raise ContractError(
            f"{type(model).__name__} returned logits of shape {tuple(logits.shape)} for tokens "
            f"of shape {tuple(tokens.shape)}; expected [B, T, V] = [{tokens.shape[0]}, "
            f"{tokens.shape[1]}, vocab]"
        )
    return logits, aux
