"""Registration with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` (see
[`odelm.hf`][odelm.hf])."""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from odelm.hf.config import _CONFIG_CLASSES, HuggingFaceError, OdelmConfig, _plain, config_class_for
from odelm.hub import MODEL_TYPES, NOT_CAUSAL, resolve
from odelm.pretrained import build_from_config, load_pretrained


def build(config: Any) -> Any:
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
        folder, device, dtype = resolve(path, "cpu", kwargs)
        model = load_pretrained(folder, device)
        return model if dtype is None else model.to(dtype)

    @classmethod
    def _from_config(cls, config: Any, **kwargs: Any) -> Any:
        return build(config)

    from_config = _from_config


def register(architecture: str, model_class: type | None = None) -> None:
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
            register(architecture)


def _registered_class(architecture: str) -> bool:
    target = AutoModel._model_mapping._extra_content.get(config_class_for(architecture))
    return target is not None and not issubclass(target, _AutoLoader)
