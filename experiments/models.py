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

FAMILIES = ("ode_transformer", "neuralode_lm", "reference")


def build_model(spec: dict[str, Any], vocab_size: int) -> nn.Module:
    """A contract model from a ``model`` config section and the tokenizer's vocabulary size."""
    options = dict(spec)
    family = options.pop("family", None)
    if family not in FAMILIES:
        raise ConfigError(f"model.family = {family!r}; valid: {', '.join(FAMILIES)}")
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
