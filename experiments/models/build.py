"""Build any model of either family from a config's ``model`` section.

``{"family": "ode_transformer", "preset": "small", "block": "rk2"}`` builds an RK-Transformer
LM; ``{"family": "neuralode_lm", "name": "ode-lstm", ...}`` a continuous-depth model;
``{"family": "reference"}`` the bigram reference model, ``{"family": "reference", "name":
"transformer"}`` the word_language_model Transformer. Every other key is a field of the
model's typed config (``experiments.models.schema``), checked before anything is built.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from experiments.config_errors import ConfigError
from experiments.models.schema import FAMILIES, check_model, model_label, schema_keys, schemas
from experiments.models.size import check_model_size

__all__ = ["FAMILIES", "build_model", "count_parameters", "depth_kind", "model_keys"]


def build_model(spec: dict[str, Any], vocab_size: int) -> nn.Module:
    """A contract model from a ``model`` config section and the tokenizer's vocabulary size
    (the section is checked against its model's typed config first)."""
    label = model_label(spec)
    check_model_size(spec, vocab_size, model_keys())  # first: a size of 1e11 is named as such
    check_model(spec)
    options = {k: v for k, v in spec.items() if k not in ("family", "name")}
    try:
        if label == "ode_transformer":
            from ode_transformer import ODETransformerLM
            from ode_transformer.presets import config_from_preset

            preset = options.pop("preset", "small")
            return ODETransformerLM(config_from_preset(preset, vocab_size=vocab_size, **options))
        if label.startswith("neuralode_lm "):
            from neuralode_lm.models import build_model as build_neural_ode

            return build_neural_ode(spec["name"], vocab_size, **options)
        from experiments.reference import BigramLM, WordLMTransformer

        if label == "reference transformer":
            return WordLMTransformer(vocab_size, **options)
        return BigramLM(vocab_size)
    except TypeError as error:
        raise ConfigError(f"model section {spec}: {error}") from None


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


def model_keys() -> dict[str, dict[str, Any]]:
    """Every ``model:`` key of each model (``family: name``) with its default, read from the
    models' config dataclasses (docs/usage.md "Model keys" is this), and the solver's keys."""
    import dataclasses

    from neuralode_lm.solvers import SolverConfig
    from ode_transformer.presets import PRESETS

    keys: dict[str, dict[str, Any]] = {}
    for label, schema in schemas().items():
        defaults = {f.name: f.default for f in dataclasses.fields(schema)}
        row = {key: defaults.get(key) for key in schema_keys(schema)}
        if label == "ode_transformer":
            row["preset"] = f"small; or {', '.join(p for p in PRESETS if p != 'small')}"
        keys[label.replace(" ", ": ")] = row
    keys["solver: {...} (ODE heads, node-transformer)"] = {
        f.name: f.default for f in dataclasses.fields(SolverConfig)
    }
    return keys


def model_keys_markdown() -> str:
    """[`model_keys`][experiments.models.build.model_keys] as a Markdown table (one row per family
    or model name)."""
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
