"""Hugging Face ``transformers`` models: every causal LM of the library is a ``PreTrainedModel``.

The library's model classes inherit [`HuggingFaceLM`][odelm.hf.HuggingFaceLM] (a
``transformers.PreTrainedModel`` with ``GenerationMixin``), so one object serves both worlds:

* the library contract, unchanged: ``logits, aux = model(tokens)`` (a positional call, or with the
  library's own keywords ``cache=``/``state=``/``attention_mask=`` a bool mask) returns an
  [`LMOutput`][odelm.hf.LMOutput], a named tuple ``(logits, aux)`` that also has ``.logits``;
* the Hugging Face contract: a call with ``input_ids=`` (what ``transformers``, ``Trainer``, PEFT,
  ``pipeline`` and lm-evaluation-harness pass) returns a
  [`CausalLMOutput`][odelm.hf.CausalLMOutput] (``CausalLMOutputWithPast`` plus ``nfe`` and
  ``aux``) with the loss under Hugging Face's label shift (``labels`` equal to ``input_ids``; -100
  is ignored), the training regulariser ``aux["reg"]`` added as the library's training loss adds
  it.

Each class's ``forward`` is wrapped once, when the class is defined, by a dispatcher that picks
the contract from the call; there is no second copy of any model. ``model.generate(ids,
max_new_tokens=...)`` is Hugging Face's ``GenerationMixin.generate`` (``do_sample``, ``top_k``,
``top_p``, ``temperature``, ``num_beams``, ``attention_mask``, ...), which reuses the model's own
per-stage key/value cache through [`OdelmCache`][odelm.hf.OdelmCache]; a call in the library's
spelling (``generate(ids, 5)``, ``strategy=``, ``eos_id=``, ``generator=``) is the library's
[`odelm.decoding.generate`][odelm.decoding.generate].

``model.config`` is a ``transformers`` config ([`OdelmConfig`][odelm.hf.OdelmConfig], one
subclass with a registered ``model_type`` per model class) that wraps the library's frozen
config: ``model.config.library_config`` is that dataclass, and its fields read through
(``model.config.n_layers``). ``config.json`` gains ``model_type``; importing this module (every
model package does) registers the types with ``AutoConfig`` and ``AutoModelForCausalLM``, so
``AutoModelForCausalLM.from_pretrained(RUN / "model")`` loads a run with no
``trust_remote_code``. Loading goes through [`odelm.pretrained`][odelm.pretrained]: weights-only
safetensors, the library's whitelist of classes, the recorded SHA-256.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationMixin
from transformers import PreTrainedModel as _PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

try:
    from transformers import PreTrainedConfig as _PreTrainedConfig
except ImportError:  # transformers 4
    from transformers import PretrainedConfig as _PreTrainedConfig  # type: ignore[no-redef]

from odelm.errors import OdelmError

__all__ = [
    "MODEL_TYPES",
    "CausalLMOutput",
    "HuggingFaceLM",
    "LMOutput",
    "OdelmCache",
    "OdelmConfig",
    "config_class_for",
]

MODEL_TYPES: dict[str, str] = {
    "ode_transformer.lm:ODETransformerLM": "odelm-ode-transformer",
    "ode_transformer.encoder:ODETransformerEncoder": "odelm-ode-transformer-encoder",
    "neuralode_lm.transformer:NODETransformerLM": "odelm-node-transformer",
    "neuralode_lm.models:LSTMLM": "odelm-lstm",
    "neuralode_lm.models:ODELSTM": "odelm-ode-lstm",
    "neuralode_lm.models:GPT2LM": "odelm-gpt2",
    "neuralode_lm.models:ODEGPT2": "odelm-ode-gpt2",
    "neuralode_lm.models:AugmentedODEGPT2": "odelm-aug-ode-gpt2",
    "experiments.reference:BigramLM": "odelm-bigram",
    "experiments.reference:WordLMTransformer": "odelm-reference-transformer",
}
"""The ``model_type`` of each library model class (``config.json``'s ``architecture``)."""

NOT_CAUSAL = frozenset({"ode_transformer.encoder:ODETransformerEncoder"})
"""Classes registered with ``AutoModel`` only (not ``AutoModelForCausalLM``)."""

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


class HuggingFaceError(OdelmError, ValueError):
    """A Hugging Face call the model cannot serve (e.g. left padding without a padding mask)."""


class LMOutput(NamedTuple):
    """The library contract's result: ``logits, aux = model(tokens)``; ``.logits`` as in HF."""

    logits: torch.Tensor
    aux: dict[str, Any]


@dataclasses.dataclass
class CausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus the library's statistics: ``nfe`` (evaluations of the
    vector field in this forward pass, ``aux["nfe"]``; None for models without one) and the
    whole ``aux`` dict."""

    nfe: float | None = None
    aux: dict[str, Any] | None = None

    @property
    def past_key_values(self) -> Cache | None:
        """The cache (``transformers`` 5 calls it ``cache``)."""
        return self.cache


# --- configs ---------------------------------------------------------------------------------


class OdelmConfig(_PreTrainedConfig):
    """The ``transformers`` config of a library model: ``config.json``'s keys, plus the live
    library config.

    ``architecture``, ``family`` and ``odelm_config`` are ``config.json``'s ``architecture``,
    ``family`` and ``config``. On a model, ``library_config`` is the model's frozen dataclass
    config and its fields read through this object (``config.d_model``).
    """

    model_type = "odelm"
    architecture: str | None = None
    family: str | None = None
    odelm_config: dict | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    use_cache: bool = True

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: read through to the library config
        if not name.startswith("_"):
            library = self.__dict__.get("library_config")
            if library is not None and hasattr(library, name):
                return getattr(library, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """Also reads a library ``config.json`` (``config`` becomes ``odelm_config``)."""
        data = dict(config_dict)
        if isinstance(data.get("config"), dict) and "architecture" in data:
            data["odelm_config"] = data.pop("config")
            data.pop("metadata", None)
            data.pop("weights_sha256", None)
            data.setdefault("vocab_size", data["odelm_config"].get("vocab_size"))
        data.pop("model_type", None)
        return super().from_dict(data, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        library = self.__dict__.pop("library_config", None)
        try:
            output = super().to_dict()
        finally:
            if library is not None:
                self.__dict__["library_config"] = library
        if output.get("odelm_config") is None and library is not None:
            output["odelm_config"] = _plain(library)
        return output


def _plain(library: Any) -> dict[str, Any]:
    to_dict = getattr(library, "to_dict", None)
    data = to_dict() if callable(to_dict) else dataclasses.asdict(library)
    from odelm.pretrained import _json_ready

    return _json_ready(data, "config")


_CONFIG_CLASSES: dict[str, type[OdelmConfig]] = {}


def _class_name(model_type: str) -> str:
    return "".join(part.capitalize() for part in model_type.split("-")) + "Config"


def config_class_for(architecture: str) -> type[OdelmConfig]:
    """The registered ``OdelmConfig`` subclass of a library class (``module:QualName``)."""
    model_type = MODEL_TYPES.get(architecture)
    if model_type is None:
        return OdelmConfig
    if architecture not in _CONFIG_CLASSES:
        name = _class_name(model_type)
        cls = type(name, (OdelmConfig,), {"model_type": model_type, "__module__": __name__})
        globals()[name] = cls  # picklable by name
        _CONFIG_CLASSES[architecture] = cls
    return _CONFIG_CLASSES[architecture]


# --- the cache -------------------------------------------------------------------------------


class OdelmCache(Cache):
    """A ``transformers`` ``Cache`` around a library model's own decoding cache (the ODE
    Transformer's key/value tree with one leaf per RK stage), which ``GenerationMixin`` carries
    between steps and reorders in beam search."""

    is_compileable = False

    def __init__(self, tree: Any) -> None:
        super().__init__(layers=[])
        self.tree = tree
        self.seen = 0  # tokens the cache holds

    @property
    def is_linear(self) -> list[bool]:  # type: ignore[override]
        return [False]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.tree.reorder(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.tree.reorder(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        index = torch.arange(self.batch_size or 0).repeat_interleave(repeats)
        self.tree.reorder(index)

    @property
    def batch_size(self) -> int | None:
        return getattr(self, "_batch", None)

    def reset(self) -> None:
        raise HuggingFaceError("an odelm cache cannot be reset; start a new one")

    def __repr__(self) -> str:
        return f"OdelmCache(seen={self.seen})"


# --- the model base --------------------------------------------------------------------------


def _is_hf_call(args: tuple, kwargs: dict[str, Any]) -> bool:
    if any(key in HF_ONLY_KEYWORDS for key in kwargs):
        return True
    return isinstance(kwargs.get("cache"), Cache)


def _dispatching(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` (the library's) behind the dispatcher described in the module docstring."""

    @functools.wraps(forward)
    def dispatch(self: HuggingFaceLM, *args: Any, **kwargs: Any) -> Any:
        if not args and _is_hf_call(args, kwargs):
            return self.hf_forward(**kwargs)
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


class HuggingFaceLM(_PreTrainedModel, GenerationMixin):
    """The ``transformers`` side of every library language model (see the module docstring).

    Subclasses set ``input_embeddings_name`` / ``output_embeddings_name`` (dotted attribute
    paths) for ``get_input_embeddings``, ``get_output_embeddings`` and
    ``resize_token_embeddings``; tied weights are found from the modules themselves.
    """

    base_model_prefix = ""
    main_input_name = "input_ids"
    accepts_loss_kwargs = False
    supports_gradient_checkpointing = False
    _supports_cache_class = True
    _is_stateful = False
    input_embeddings_name: ClassVar[str | None] = "token_embedding"
    output_embeddings_name: ClassVar[str | None] = "head"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__ and not hasattr(
            cls.__dict__["forward"], "__wrapped_library_forward__"
        ):
            cls.forward = _dispatching(cls.__dict__["forward"])  # type: ignore[method-assign]
        architecture = f"{cls.__module__}:{cls.__qualname__}"
        if architecture in MODEL_TYPES:
            _register(architecture, cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        hf_class = config_class_for(f"{type(self).__module__}:{type(self).__qualname__}")
        _PreTrainedModel.__init__(self, hf_class())

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

    # --- embeddings ----------------------------------------------------------------------------

    def _module_at(self, path: str | None) -> Any:
        if path is None:
            return None
        target: Any = self
        for part in path.split("."):
            target = getattr(target, part)
        return target

    def _set_module_at(self, path: str, value: nn.Module) -> None:
        owner, _, name = path.rpartition(".")
        setattr(self._module_at(owner) if owner else self, name, value)

    def get_input_embeddings(self) -> nn.Module:
        return self._module_at(self.input_embeddings_name)

    def set_input_embeddings(self, value: nn.Module) -> None:
        if self.input_embeddings_name is None:
            raise NotImplementedError(f"{type(self).__name__} has no input embedding")
        self._set_module_at(self.input_embeddings_name, value)

    def get_output_embeddings(self) -> nn.Module | None:
        return self._module_at(self.output_embeddings_name)

    def set_output_embeddings(self, value: nn.Module) -> None:
        if self.output_embeddings_name is None:
            raise NotImplementedError(f"{type(self).__name__} has no separate output layer")
        self._set_module_at(self.output_embeddings_name, value)

    @property
    def _tied_weights_keys(self) -> dict[str, str]:  # type: ignore[override]
        """``{output weight: input embedding weight}`` when the two are one tensor."""
        inputs, outputs = self.input_embeddings_name, self.output_embeddings_name
        if inputs is None or outputs is None:
            return {}
        embedding, output = self.get_input_embeddings(), self.get_output_embeddings()
        if output is not None and output.weight is embedding.weight:
            return {f"{outputs}.weight": f"{inputs}.weight"}
        return {}

    @_tied_weights_keys.setter
    def _tied_weights_keys(self, value: Any) -> None:  # HF assigns class defaults
        pass

    def tie_weights(self, *args: Any, **kwargs: Any) -> None:
        """The library ties weights when it builds a model; nothing is left to tie."""

    def _init_weights(self, module: nn.Module) -> None:
        """Models initialise themselves when built (``transformers`` never re-initialises)."""

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = False,
    ) -> nn.Module:
        """Grow or shrink the vocabulary: embedding rows (and output rows, tied or not) are
        kept, new ones drawn N(0, 0.02) (``mean_resizing``: the old rows' mean); the model's
        ``vocab_size`` and configs follow."""
        embedding = self.get_input_embeddings()
        if new_num_tokens is None:
            return embedding
        if pad_to_multiple_of:
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        if not isinstance(embedding, nn.Embedding) or embedding.weight.shape[1] == getattr(
            self, "vocab_size", -1
        ) and self.output_embeddings_name is None and self.input_embeddings_name == "table":
            raise NotImplementedError(f"{type(self).__name__} cannot resize its vocabulary")
        old = embedding.weight.shape[0]
        output = self.get_output_embeddings()
        tied = output is not None and output.weight is embedding.weight
        new_embedding = nn.Embedding(new_num_tokens, embedding.weight.shape[1]).to(
            embedding.weight.device, embedding.weight.dtype
        )
        _copy_rows(new_embedding.weight, embedding.weight, old, mean_resizing)
        self.set_input_embeddings(new_embedding)
        if output is not None:
            if tied:
                output.weight = new_embedding.weight
                if output.bias is not None:
                    output.bias = _resized_bias(output.bias, new_num_tokens)
            else:
                layer = nn.Linear(
                    output.in_features, new_num_tokens, bias=output.bias is not None
                ).to(output.weight.device, output.weight.dtype)
                _copy_rows(layer.weight, output.weight, old, mean_resizing)
                if output.bias is not None:
                    layer.bias = _resized_bias(output.bias, new_num_tokens)
                self.set_output_embeddings(layer)
            if hasattr(output, "out_features"):
                (output if tied else self.get_output_embeddings()).out_features = new_num_tokens
        self._resized_vocabulary(new_num_tokens)
        return new_embedding

    def _resized_vocabulary(self, size: int) -> None:
        """Record the new vocabulary size on the model and its configs."""
        self.__dict__["vocab_size"] = size
        library = self.library_config
        if library is not None and hasattr(library, "vocab_size"):
            self.config = dataclasses.replace(library, vocab_size=size)
        self.config.vocab_size = size

    # --- the Hugging Face forward ----------------------------------------------------------------

    def _library_forward(self) -> Callable[..., Any]:
        forward = type(self).forward
        return functools.partial(getattr(forward, "__wrapped_library_forward__", forward), self)

    def _library_parameters(self) -> set[str]:
        return set(inspect.signature(self._library_forward()).parameters)

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
        [`CausalLMOutput`][odelm.hf.CausalLMOutput]; with a cache (``past_key_values`` or
        ``cache``, an [`OdelmCache`][odelm.hf.OdelmCache]) the ids continue the cached tokens.
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
        mask = _padding_mask(attention_mask, input_ids)
        if mask is not None:
            if getattr(self, "accepts_attention_mask", False):
                options["attention_mask"] = mask
            elif bool((mask.int().diff(dim=1) > 0).any()):
                raise HuggingFaceError(
                    f"{type(self).__name__} takes no padding mask, so padding may only follow "
                    "the real tokens (right padding: tokenizer.padding_side = 'right')"
                )
        if cache is not None:
            if mask is not None and "attention_mask" in options:
                raise HuggingFaceError("a cached forward takes no padding mask")
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
        inputs: dict[str, Any] = {"input_ids": input_ids}
        if isinstance(cache, OdelmCache):
            inputs["input_ids"] = input_ids[:, cache.seen :]
            inputs["cache"] = cache
        elif attention_mask is not None:
            inputs["attention_mask"] = attention_mask
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
        ``generator=``), [`odelm.decoding.generate`][odelm.decoding.generate]."""
        library = (len(args) > 1 and isinstance(args[1], int)) or any(
            key in LIBRARY_GENERATE_KEYWORDS for key in kwargs
        )
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
        return _build(config)


def _copy_rows(new: torch.Tensor, old: torch.Tensor, rows: int, mean: bool) -> None:
    with torch.no_grad():
        keep = min(rows, new.shape[0])
        new[:keep] = old[:keep]
        if new.shape[0] > keep:
            if mean:
                new[keep:] = old.mean(0, keepdim=True)
            else:
                new[keep:].normal_(0.0, 0.02)


def _resized_bias(bias: torch.Tensor, size: int) -> nn.Parameter:
    new = bias.new_zeros(size)
    keep = min(size, bias.shape[0])
    with torch.no_grad():
        new[:keep] = bias[:keep]
    return nn.Parameter(new)


def _padding_mask(attention_mask: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
    """The library's bool mask (True on real tokens), or None when every token is real."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    mask = attention_mask.to(ids.device).bool()
    if mask.shape != ids.shape or bool(mask.all()):
        return None
    return mask


def _build(config: Any) -> Any:
    from odelm.pretrained import build_from_config

    if not isinstance(config, OdelmConfig) or config.architecture is None:
        raise HuggingFaceError("not an odelm config (it names no architecture)")
    odelm_config = config.odelm_config
    if odelm_config is None and config.__dict__.get("library_config") is not None:
        odelm_config = {"vocab_size": config.vocab_size, **_plain(config.library_config)}
    return build_from_config({"architecture": config.architecture, "config": odelm_config})


class _AutoLoader:
    """What ``AutoModelForCausalLM`` finds for an odelm ``model_type`` before the model's
    package is imported: it loads through [`odelm.pretrained`][odelm.pretrained] (which imports
    only whitelisted library classes) and returns the real model."""

    architecture: ClassVar[str] = ""

    @classmethod
    def from_pretrained(cls, path: Any, *args: Any, **kwargs: Any) -> Any:
        from odelm.pretrained import load_pretrained_hf

        return load_pretrained_hf(path, **kwargs)

    @classmethod
    def _from_config(cls, config: Any, **kwargs: Any) -> Any:
        return _build(config)

    from_config = _from_config


def _register(architecture: str, model_class: type | None = None) -> None:
    config_class = config_class_for(architecture)
    model_type = MODEL_TYPES[architecture]
    AutoConfig.register(model_type, config_class, exist_ok=True)
    target = model_class
    if target is None:
        target = type(
            f"Auto{config_class.__name__[: -len('Config')]}",
            (_AutoLoader,),
            {"architecture": architecture, "__module__": __name__},
        )
    AutoModel._model_mapping.register(config_class, target, exist_ok=True)
    if architecture not in NOT_CAUSAL:
        AutoModelForCausalLM._model_mapping.register(config_class, target, exist_ok=True)


def register_all() -> None:
    """Register every library model type with ``AutoConfig``, ``AutoModel`` and
    ``AutoModelForCausalLM`` (done when this module is imported)."""
    for architecture in MODEL_TYPES:
        if architecture not in _CONFIG_CLASSES or not _registered_class(architecture):
            _register(architecture)


def _registered_class(architecture: str) -> bool:
    target = AutoModel._model_mapping._extra_content.get(config_class_for(architecture))
    return target is not None and not issubclass(target, _AutoLoader)


register_all()
