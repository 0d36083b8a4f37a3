"""The one contract every language model in this library meets, as ``typing.Protocol``s.

``logits, aux = model(tokens)`` with ``tokens`` a LongTensor ``[B, T]`` and ``logits`` a
float tensor ``[B, T, V]`` where ``logits[:, t]`` predicts ``tokens[:, t + 1]``. ``aux`` is a
dict of extras (for example ``{"nfe": 38}``). ``model.is_causal`` is True when
``logits[:, t]`` depends only on ``tokens[:, : t + 1]``; the harness refuses to call the
perplexity of a non-causal model a language-model perplexity unless asked
([`LanguageModel`][odelm.contract.LanguageModel]).

Optional attributes the harness uses when present: ``vocab_size`` (int),
``max_positions`` (the longest sequence the model accepts) and ``accepts_attention_mask``
([`MaskedLanguageModel`][odelm.contract.MaskedLanguageModel]): True when ``model(tokens,
attention_mask=mask)`` gives every real token the logits it would have unpadded. The library's one
mask convention is ``attention_mask [B, T]`` bool, **True on real tokens** (what ``torch``'s
``scaled_dot_product_attention`` and Hugging Face take; torch's ``key_padding_mask`` is its
negation). Padded sentence batches reach such a model with their mask; any other model
gets no mask, so it may see padding only after a sentence (right padding), where a causal
model cannot read it.

Optional stateful extension (truncated backpropagation through time,
[`StatefulLanguageModel`][odelm.contract.StatefulLanguageModel]): a model with ``supports_state =
True`` also accepts ``model(tokens, state=s)``, where ``s`` is the state returned by the previous
window of the same streams (``None`` starts fresh), and returns the state after its last token in
``aux["state"]`` (a tensor or a tuple of tensors). The harness uses it when the data config
asks for ``stateful`` batching, detaching the state between windows; a model without the
attribute is refused there.

Optional incremental decoding ([`CachedLanguageModel`][odelm.contract.CachedLanguageModel]):
``init_cache()`` and ``next_token_logits(new_tokens, cache)``, which
[`odelm.decoding`][odelm.decoding] uses when present.

Optional output-layer split ([`FeaturesLanguageModel`][odelm.contract.FeaturesLanguageModel]):
``output_layer`` (an ``nn.Linear``) and ``features(tokens) -> (hidden [B, T, D], aux)`` such that
``model(tokens)`` is ``(output_layer(hidden), aux)``. Mixed-precision training then fuses
the output layer with the loss, a block of rows at a time, instead of forming the logits
(``experiments.training.losses.linear_cross_entropy``); full-precision training and
evaluation call the model.

The protocols are structural: a model meets them by having the attributes, not by
inheriting from them; [`call_model`][odelm.contract.call_model] checks the contract at run time.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from odelm.errors import OdelmError


class LanguageModel(Protocol):
    """``logits, aux = model(tokens)``: ``[B, T]`` ids to ``[B, T, V]`` logits and extras."""

    is_causal: bool

    def __call__(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]: ...


class MaskedLanguageModel(LanguageModel, Protocol):
    """A model that hides padding: ``attention_mask [B, T]`` is True on real tokens."""

    accepts_attention_mask: bool

    def __call__(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...


class StatefulLanguageModel(LanguageModel, Protocol):
    """A model that carries a state between windows (``aux["state"]`` after the last token)."""

    supports_state: bool

    def __call__(
        self, tokens: torch.Tensor, state: Any = None
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...


class DecodingCache(Protocol):
    """The incremental-decoding cache of a
    [`CachedLanguageModel`][odelm.contract.CachedLanguageModel]."""

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search reorders its hypotheses)."""
        ...


class CachedLanguageModel(LanguageModel, Protocol):
    """A model that decodes incrementally: the logits after the cached sequence and the new
    tokens, extending the cache in place."""

    def init_cache(self) -> DecodingCache: ...

    def next_token_logits(self, new_tokens: torch.Tensor, cache: DecodingCache) -> torch.Tensor: ...


class FeaturesLanguageModel(LanguageModel, Protocol):
    """A model whose logits are a linear layer of its final states: ``model(tokens)`` is
    ``(output_layer(hidden), aux)`` with ``hidden, aux = features(tokens)``."""

    output_layer: torch.nn.Linear

    def features(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]: ...


class ContractError(OdelmError, TypeError):
    """A model does not meet the model contract."""


class PaddingSideError(OdelmError, ValueError):
    """Padding before a sentence reached a model that cannot mask it out."""


class StatelessModelError(ContractError):
    """Stateful batching was asked of a model that does not carry state between windows."""


def check_stateful(model: Any) -> None:
    """Refuse, in one line, a model without the stateful extension."""
    if not getattr(model, "supports_state", False):
        raise StatelessModelError(
            f"data.stateful is true but {type(model).__name__} does not carry state between "
            "windows (no `supports_state = True`); set data.stateful: false, or use a "
            "recurrent model (lstm, ode-lstm)"
        )


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without any): where
    the tensors fed to it are made."""
    parameters = model.parameters() if callable(getattr(model, "parameters", None)) else ()
    return next((p.device for p in parameters), torch.device("cpu"))


def detach_state(state: Any) -> Any:
    """A carried state cut from the graph of the window that produced it."""
    if isinstance(state, torch.Tensor):
        return state.detach()
    return type(state)(detach_state(s) for s in state)


def call_model(
    model: Any,
    tokens: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    stateful: bool = False,
    state: Any = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run ``model(tokens)`` (with ``attention_mask=mask`` where the model accepts one, or
    ``state=state`` when ``stateful``) and check the result against the contract."""
    if not hasattr(model, "is_causal"):
        raise ContractError(
            f"{type(model).__name__} has no `is_causal` attribute; every model must say "
            "whether logits[:, t] depends only on tokens[:, :t+1]"
        )
    if stateful:
        out = model(tokens, state=state)
    elif mask is not None and getattr(model, "accepts_attention_mask", False):
        out = model(tokens, attention_mask=mask)
    else:
        if mask is not None and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise PaddingSideError(
                f"left padding reached {type(model).__name__}, which takes no attention mask: "
                "the padding would tell it each sentence's length. Set data.padding_side: "
                "right (left padding needs a model with accepts_attention_mask, e.g. GPT-2)"
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
