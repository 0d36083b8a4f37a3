"""Model sizes from the papers, as named presets for
[`ODETransformerConfig`][ode_transformer.ODETransformerConfig].

- ``ptb-lm-1layer`` / ``ptb-lm-2layer``: the ODE Transformer paper's PTB truncation-error
  LM (Table 5): hidden 512, FFN 2048, 8 heads, all dropouts 0.1, 1 or 2 layers.
- ``base``: Transformer-base depth and width (6 layers, 512 / 2048 / 8 heads).
- ``small``: a CPU-sized model (d 128, FFN 512, 4 heads, 2 layers) for quick runs.

The block, sub-layer and stack are left to the caller (default: the residual baseline), so
one preset compares every block at equal size: ``config_from_preset("base", block="rk2")``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import ODETransformerConfig
from .errors import ODETransformerConfigError

_PAPER_DROPOUT = {"dropout": 0.1, "attention_dropout": 0.1, "relu_dropout": 0.1}

PRESETS: dict[str, dict[str, Any]] = {
    "ptb-lm-1layer": {
        "vocab_size": 10000,
        "d_model": 512,
        "d_ff": 2048,
        "n_heads": 8,
        "n_layers": 1,
        "max_positions": 512,
        **_PAPER_DROPOUT,
    },
    "ptb-lm-2layer": {
        "vocab_size": 10000,
        "d_model": 512,
        "d_ff": 2048,
        "n_heads": 8,
        "n_layers": 2,
        "max_positions": 512,
        **_PAPER_DROPOUT,
    },
    "base": {
        "d_model": 512,
        "d_ff": 2048,
        "n_heads": 8,
        "n_layers": 6,
        "max_positions": 512,
        **_PAPER_DROPOUT,
    },
    "small": {
        "d_model": 128,
        "d_ff": 512,
        "n_heads": 4,
        "n_layers": 2,
        "max_positions": 256,
        **_PAPER_DROPOUT,
    },
}
"""Preset name -> config fields (anything not listed keeps the config default)."""


def config_from_preset(name: str, **overrides: Any) -> ODETransformerConfig:
    """The config of preset ``name`` with ``overrides`` applied (e.g. ``vocab_size``, ``block``)."""
    if name not in PRESETS:
        raise ODETransformerConfigError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ODETransformerConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ODETransformerConfigError(
            f"unknown config fields {unknown}; valid: {', '.join(sorted(fields))}"
        )
    return ODETransformerConfig(**{**PRESETS[name], **overrides})
