"""Build any model of either family from a config's ``model`` section.

``{"family": "ode_transformer", "preset": "small", "block": "rk2"}`` builds an RK-Transformer
LM; ``{"family": "neuralode_lm", "name": "ode-lstm", ...}`` a continuous-depth model;
``{"family": "reference"}`` the bigram reference model, ``{"family": "reference", "name":
"transformer"}`` the word_language_model Transformer. Every other key goes to the family's
own constructor, which names what it does not know.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from experiments.config import ConfigError
from experiments.model_size import check_model_size

FAMILIES = ("ode_transformer", "neuralode_lm", "reference")


def build_model(spec: dict[str, Any], vocab_size: int) -> nn.Module:
    """A contract model from a ``model`` config section and the tokenizer's vocabulary size."""
    options = dict(spec)
    family = options.pop("family", None)
    if family not in FAMILIES:
        raise ConfigError(f"model.family = {family!r}; valid: {', '.join(FAMILIES)}")
    check_model_size(spec, vocab_size, model_keys())
    try:
        if family == "ode_transformer":
            from ode_transformer import ODETransformerLM
            from ode_transformer.presets import config_from_preset

            preset = options.pop("preset", "small")
            return ODETransformerLM(config_from_preset(preset, vocab_size=vocab_size, **options))
        if family == "neuralode_lm":
            from neuralode_lm.models import build_model as build_neural_ode

            if "name" not in options:
                raise ConfigError("model.name is required for family neuralode_lm (e.g. ode-lstm)")
            return build_neural_ode(options.pop("name"), vocab_size, **options)
        from experiments.reference import BigramLM, WordLMTransformer

        name = options.pop("name", "bigram")
        if name == "transformer":
            return WordLMTransformer(vocab_size, **options)
        if name != "bigram":
            raise ConfigError(
                f"model.name = {name!r} for family reference; valid: bigram, transformer"
            )
        if options:
            raise ConfigError(f"the reference bigram model takes no options, got {sorted(options)}")
        return BigramLM(vocab_size)
    except TypeError as error:
        raise _key_error(spec, error) from None


def _key_error(spec: dict[str, Any], error: TypeError) -> ConfigError:
    """A constructor's "unexpected keyword argument" as one line naming the valid keys of
    the model's family (a key of another family, e.g. ``preset`` for an ODE-LSTM)."""
    import re

    unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    family, name = spec.get("family"), spec.get("name", "bigram")
    keys = model_keys()
    valid = keys.get(f"{family}: {name}")
    if unexpected is None or valid is None:
        return ConfigError(f"model section {spec}: {error}")
    if name in ("ode-lstm", "ode-gpt2", "aug-ode-gpt2"):
        valid = {**valid, **keys["ODE heads (ode-lstm, ode-gpt2, aug-ode-gpt2)"]}
    unknown = [key for key in spec if key not in (*valid, "family", "name")] or [unexpected[1]]
    verb = "is not a key" if len(unknown) == 1 else "are not keys"
    return ConfigError(
        f"{', '.join(f'model.{key}' for key in unknown)} {verb} of {family} {name}; its keys: "
        f"family, name, {', '.join(valid)} (odelm models lists every family's keys)"
    )


def depth_kind(spec: dict[str, Any], model: nn.Module) -> str:
    """``continuous depth`` (an ODE solve), ``discrete depth`` (RK blocks) or ``baseline``."""
    if hasattr(model, "solver_stats"):
        return "continuous depth"
    return "discrete depth" if spec.get("family") == "ode_transformer" else "baseline"


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (tied weights counted once)."""
    return sum(
        p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()
    )


def _keywords(function: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Keyword parameters of ``function`` with their defaults (``**options`` left out)."""
    import inspect

    return {
        name: param.default
        for name, param in inspect.signature(function).parameters.items()
        if name not in ("self", "vocab_size", *skip)
        and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    }


def _fields(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    import dataclasses

    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]  # or a factory
        for f in dataclasses.fields(cls)
        if f.name not in skip
    }


def model_keys() -> dict[str, dict[str, Any]]:
    """Every ``model:`` key each family (and model name) takes, with its default, read from
    the constructors and config dataclasses themselves (README "Model keys" is this)."""
    from experiments.reference import WordLMTransformer
    from neuralode_lm.encoders import LSTMConfig
    from neuralode_lm.heads import CausalODEHead, _ODEHead
    from neuralode_lm.models import MODELS
    from neuralode_lm.solvers import SolverConfig
    from ode_transformer.config import ODETransformerConfig
    from ode_transformer.presets import PRESETS

    lstm = _fields(LSTMConfig, skip=("embeddings",))
    skip = ("dim", "field_hidden")  # field_hidden: the models' own keyword, listed with them
    head = {**_keywords(_ODEHead.__init__, skip), **_keywords(CausalODEHead.__init__, skip)}
    return {
        "ode_transformer": {
            "preset": f"small; or {', '.join(p for p in PRESETS if p != 'small')}",
            **_fields(ODETransformerConfig, skip=("vocab_size",)),
        },
        "neuralode_lm: lstm": lstm,
        "neuralode_lm: ode-lstm": {**lstm, **_keywords(MODELS["ode-lstm"].__init__, ("config",))},
        "neuralode_lm: gpt2": _keywords(MODELS["gpt2"].__init__),
        "neuralode_lm: ode-gpt2": _keywords(MODELS["ode-gpt2"].__init__),
        "neuralode_lm: aug-ode-gpt2": _keywords(MODELS["aug-ode-gpt2"].__init__),
        "neuralode_lm: node-transformer": _keywords(MODELS["node-transformer"].__init__),
        "ODE heads (ode-lstm, ode-gpt2, aug-ode-gpt2)": head,
        "solver: {...} (ODE heads, node-transformer)": _fields(SolverConfig),
        "reference: bigram": {},
        "reference: transformer": _keywords(WordLMTransformer.__init__),
    }


def model_keys_markdown() -> str:
    """:func:`model_keys` as a Markdown table (one row per family or model name)."""
    rows = ["| `family: name` | keys (default) |", "|---|---|"]
    for model, keys in model_keys().items():
        cells = ", ".join(f"`{key}` ({_short(value)})" for key, value in keys.items())
        rows.append(f"| {model} | {cells or 'none'} |")
    return "\n".join(rows) + "\n"


def _short(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
