"""``HuggingFaceLM``: the ``transformers.PreTrainedModel`` every library language model is (see
[`odelm.hf`][odelm.hf])."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from transformers import GenerationMixin
from transformers import PreTrainedModel as _PreTrainedModel
from transformers.cache_utils import Cache

from odelm.checkpointing import supports_checkpointing
from odelm.hf.auto import build, register
from odelm.hf.config import (
    CausalLMOutput,
    HuggingFaceError,
    LMOutput,
    OdelmCache,
    OdelmConfig,
    _PreTrainedConfig,
    config_class_for,
)
from odelm.hf.embeddings import EmbeddingsMixin
from odelm.hub import MODEL_TYPES
from odelm.invariance import rows_alone
from odelm.mixed_precision import emulated_products

HF_ONLY_KEYWORDS = frozenset(
    {
        "input_ids",
        "labels",
        "past_key_values",
        "use_cache",
        "return_dict",
        "inputs_embeds",
        "output_attentions",
        "output_hidden_states",
        "position_ids",
        "logits_to_keep",
    }
)
"""Keywords of a Hugging Face call that the library contract never uses: any of them (or a
``transformers`` ``Cache`` as ``cache=``) routes a call to the Hugging Face forward."""

LIBRARY_GENERATE_KEYWORDS = frozenset({"strategy", "eos_id", "generator"})


def _is_hf_call(args: tuple, kwargs: dict[str, Any]) -> bool:
    if len(args) > 1:
        return False
    if any(key in HF_ONLY_KEYWORDS for key in kwargs):
        return True
    return isinstance(kwargs.get("cache"), Cache)


def _dispatching(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` (the library's) behind the dispatcher described in the module docstring."""

    @functools.wraps(forward)
    def dispatch(self: HuggingFaceLM, *args: Any, **kwargs: Any) -> Any:
        if _is_hf_call(args, kwargs):  # model(input_ids=ids, ...) or model(ids, labels=ids)
            return self.hf_forward(*args, **kwargs)
        output = forward(self, *args, **kwargs)
        if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], dict):
            return LMOutput(*output)
        return output

    library = inspect.signature(forward)
    parameters = list(library.parameters.values())
    variadic = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    parameters = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    present = {p.name for p in parameters}
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
        for name in ("input_ids", "attention_mask", "labels", "past_key_values", "use_cache")
        + ("return_dict",)
        if name not in present
    ]
    keywords = variadic or [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    dispatch.__signature__ = library.replace(  # type: ignore[attr-defined]
        parameters=parameters + extra + keywords[:1]
    )
    dispatch.__wrapped_library_forward__ = forward  # type: ignore[attr-defined]
    return dispatch


class HuggingFaceLM(EmbeddingsMixin, _PreTrainedModel, GenerationMixin):
    """The ``transformers`` side of every library language model (see the module docstring).

    Subclasses set ``input_embeddings_name`` / ``output_embeddings_name`` (dotted attribute
    paths) for ``get_input_embeddings``, ``get_output_embeddings`` and
    ``resize_token_embeddings``; tied weights are found from the modules themselves.
    """

    base_model_prefix = ""
    main_input_name = "input_ids"
    accepts_loss_kwargs = False
    _supports_cache_class = True
    _is_stateful = False
    input_embeddings_name: ClassVar[str | None] = "token_embedding"
    output_embeddings_name: ClassVar[str | None] = "head"
    batch_invariant: bool | None = None
    """Adaptive solves in a Hugging Face call (forward, ``generate``, ``pipeline``, lm-eval)
    step each sequence (node-transformer) or position (the ODE heads) on its own, so a score
    does not depend on the batch around it ([`odelm.invariance`][odelm.invariance]): None
    (the default) in evaluation mode, True always, False never (one shared solve per batch,
    training's way). Fixed-grid models are batch-invariant anyway."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__ and not hasattr(
            cls.__dict__["forward"], "__wrapped_library_forward__"
        ):
            cls.forward = _dispatching(cls.__dict__["forward"])  # type: ignore[method-assign]
        architecture = f"{cls.__module__}:{cls.__qualname__}"
        if architecture in MODEL_TYPES:
            register(architecture, cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        hf_class = config_class_for(f"{type(self).__module__}:{type(self).__qualname__}")
        _PreTrainedModel.__init__(self, hf_class())

    @property
    def supports_gradient_checkpointing(self) -> bool:  # type: ignore[override]
        """True where a layer, RK stage or vector field can be recomputed in the backward pass
        ([`odelm.checkpointing`][odelm.checkpointing]; GPT-2's blocks are ``transformers``'
        own): ``gradient_checkpointing_enable()`` switches it on."""
        return supports_checkpointing(self)

    def gradient_checkpointing_enable(self, *args: Any, **kwargs: Any) -> None:
        """``transformers``' switch, or one line saying why a model without layers, stages or
        fields (the bigram) has nothing to recompute."""
        if not self.supports_gradient_checkpointing:
            raise HuggingFaceError(
                f"{type(self).__name__} has no layers, RK stages or vector fields, so there is "
                "nothing to recompute: train it without gradient checkpointing"
            )
        super().gradient_checkpointing_enable(*args, **kwargs)

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Whether gradient checkpointing is on in any module."""
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())

    # ``self.config`` is the transformers config; assigning a library config wraps it.
    @property  # type: ignore[override]
    def config(self) -> OdelmConfig:
        config = self.__dict__["_hf_config"]
        vocab = self.__dict__.get("vocab_size")
        if isinstance(vocab, int) and config.__dict__.get("vocab_size") != vocab:
            config.vocab_size = vocab
        return config

    @config.setter
    def config(self, value: Any) -> None:
        if not isinstance(value, _PreTrainedConfig):
            architecture = f"{type(self).__module__}:{type(self).__qualname__}"
            wrapped = config_class_for(architecture)(
                architecture=architecture, family=self._family()
            )
            wrapped.__dict__["library_config"] = value
            old = self.__dict__.get("_hf_config")
            if old is not None:
                for key in ("_attn_implementation_internal", "_experts_implementation_internal"):
                    if key in old.__dict__:
                        wrapped.__dict__[key] = old.__dict__[key]
            vocab = getattr(value, "vocab_size", None) or self.__dict__.get("vocab_size")
            if isinstance(vocab, int):
                wrapped.vocab_size = vocab
            value = wrapped
        self.__dict__["_hf_config"] = value

    def _family(self) -> str:
        module = type(self).__module__
        return "reference" if module == "experiments.reference" else module.split(".")[0]

    @property
    def library_config(self) -> Any:
        """The model's frozen library config (``model.config.library_config``)."""
        return self.config.__dict__.get("library_config")

    # --- the Hugging Face forward ----------------------------------------------------------------

    def _library_forward(self) -> Callable[..., Any]:
        forward = type(self).forward
        return functools.partial(getattr(forward, "__wrapped_library_forward__", forward), self)

    def _library_parameters(self) -> set[str]:
        return set(inspect.signature(self._library_forward()).parameters)

    def _takes_padding_mask(self) -> bool:
        """Whether the library forward takes ``attention_mask`` (every family's does: padding
        hidden from attention or from the state updates, positions counted per row)."""
        return "attention_mask" in self._library_parameters()

    def _new_cache(self) -> OdelmCache | None:
        """A fresh Hugging Face cache around the model's own, or None when the model
        recomputes its context at every step."""
        init = getattr(self, "init_cache", None)
        if not callable(init) or not callable(getattr(self, "next_token_logits", None)):
            return None
        if "cache" not in self._library_parameters():
            return None
        return OdelmCache(init())

    def hf_forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **ignored: Any,
    ) -> Any:
        """The Hugging Face forward (the module docstring): ``input_ids`` ``[B, T]`` to a
        [`CausalLMOutput`][odelm.hf.config.CausalLMOutput]; with a cache (``past_key_values`` or
        ``cache``, an [`OdelmCache`][odelm.hf.config.OdelmCache]) the ids continue the cached tokens.
        ``attention_mask`` (1 on real tokens) reaches models that take a padding mask;
        other models accept padding only after the real tokens (right padding)."""
        if inputs_embeds is not None:
            raise HuggingFaceError(f"{type(self).__name__} takes input_ids, not inputs_embeds")
        if input_ids is None:
            raise HuggingFaceError("input_ids is required")
        forward = self._library_forward()
        options: dict[str, Any] = {}
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache and not self.training:
            cache = self._new_cache()
        if cache is not None and not isinstance(cache, OdelmCache):
            raise HuggingFaceError(
                f"{type(self).__name__} keeps its own cache; pass the OdelmCache it returned "
                f"(got {type(cache).__name__})"
            )
        seen = 0 if cache is None else cache.seen
        mask = _padding_mask(attention_mask, input_ids, seen)
        if mask is not None:
            if self._takes_padding_mask():
                options["attention_mask"] = mask
            elif cache is not None or bool((mask.int().diff(dim=1) > 0).any()):
                raise HuggingFaceError(
                    f"{type(self).__name__} takes no padding mask, so padding may only follow "
                    "the real tokens (right padding: tokenizer.padding_side = 'right')"
                )
        alone = self.batch_invariant if self.batch_invariant is not None else not self.training
        with rows_alone(self, alone):
            if cache is not None:
                cache._batch = input_ids.shape[0]
                output = forward(input_ids, cache=cache.tree, **options)
                cache.seen += input_ids.shape[1]
            else:
                output = forward(input_ids, **options)
        logits, aux = output[0], output[1]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                labels[:, 1:].reshape(-1).to(logits.device),
                ignore_index=-100,
            )
            if self.training and aux.get("reg") is not None:
                loss = loss + aux["reg"]
        nfe = aux.get("nfe")
        result = CausalLMOutput(
            loss=loss,
            logits=logits,
            cache=cache,
            nfe=None if nfe is None else float(nfe),
            aux=aux,
        )
        if return_dict is False:
            return result.to_tuple()
        return result

    # --- Hugging Face generation ------------------------------------------------------------------

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model's own cache comes from prepare_inputs_for_generation

    def prepare_inputs_for_generation(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        next_sequence_length: int | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache is not False:
            cache = self._new_cache()
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if isinstance(cache, OdelmCache):
            # the new tokens only; the mask stays the whole sequence's (cached tokens too)
            inputs["input_ids"] = input_ids[:, cache.seen :]
            inputs["cache"] = cache
        return inputs

    def _update_model_kwargs_for_generation(  # type: ignore[override]
        self, outputs: Any, model_kwargs: dict[str, Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        model_kwargs = super()._update_model_kwargs_for_generation(
            outputs, model_kwargs, *args, **kwargs
        )
        if outputs.get("cache") is not None:
            model_kwargs["cache"] = outputs["cache"]
        return model_kwargs

    def generate(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Hugging Face's ``GenerationMixin.generate``, or, for a call in the library's spelling
        (``generate(ids, max_new_tokens)`` positionally, or ``strategy=``, ``eos_id=``,
        ``generator=``), [`odelm.decoding.generate`][odelm.decoding.generate]. A bf16 model
        on a CPU without native bf16 products generates with emulated products
        ([`emulated_products`][odelm.mixed_precision.emulated_products])."""
        library = (len(args) > 1 and isinstance(args[1], int)) or any(
            key in LIBRARY_GENERATE_KEYWORDS for key in kwargs
        )
        bf16_on_cpu = self.dtype == torch.bfloat16 and self.device.type == "cpu"
        with emulated_products("bf16-true" if bf16_on_cpu else "32-true"):
            if library:
                from odelm import decoding

                with torch.no_grad():
                    return decoding.generate(self, *args, **kwargs)
            inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
            if (
                isinstance(inputs, torch.Tensor)
                and "attention_mask" not in kwargs
                and self.generation_config.pad_token_id is None
            ):
                kwargs["attention_mask"] = torch.ones_like(inputs)
            return GenerationMixin.generate(self, *args, **kwargs)

    # --- loading and building -------------------------------------------------------------------

    @classmethod
    def _from_config(cls, config: Any, **kwargs: Any) -> Any:
        """A freshly initialised model from a ``transformers`` config (``AutoModel.from_config``)."""
        return build(config)


def _padding_mask(
    attention_mask: torch.Tensor | None, ids: torch.Tensor, seen: int = 0
) -> torch.Tensor | None:
    """The library's bool mask (True on real tokens) over the ``seen`` cached tokens and
    ``ids``, or None when every token is real."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    mask = attention_mask.to(ids.device).bool()
    if mask.shape != (ids.shape[0], seen + ids.shape[1]) or bool(mask.all()):
        return None
    return mask
