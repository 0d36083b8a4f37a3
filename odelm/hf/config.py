"""The ``transformers`` side of a library model's config, outputs and cache (see
[`odelm.hf`][odelm.hf])."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

try:
    from transformers import PreTrainedConfig as _PreTrainedConfig
except ImportError:  # transformers 4
    from transformers import PretrainedConfig as _PreTrainedConfig  # type: ignore[no-redef]

from odelm.errors import OdelmError
from odelm.hub import MODEL_TYPES
from odelm.pretrained import _json_ready


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


class OdelmConfig(_PreTrainedConfig):
    """The ``transformers`` config of a library model: ``config.json``'s keys, plus the live
    library config.

    ``architecture``, ``family`` and ``odelm_config`` are ``config.json``'s ``architecture``,
    ``family`` and ``config``. On a model, ``library_config`` is the model's frozen dataclass
    config and its fields read through this object (``config.d_model``). ``bos_token_id``,
    ``eos_token_id`` and ``pad_token_id`` are the run's ``<eos>`` (it starts every prompt, ends
    every line and pads batches), None for a model saved without its tokenizer's ids.
    """

    model_type = "odelm"
    architecture: str | None = None
    family: str | None = None
    odelm_config: dict | None = None
    vocab_size: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
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
