"""How many parameters a ``model:`` section asks for, counted from its sizes before anything
is built, so a typo such as ``n_layers: 1000000`` or ``d_ff: 1e11`` is one clear error
instead of an allocation of tens of gigabytes.

The count is a lower bound (embeddings, attention and feed-forward or recurrent weights;
biases and norms left out), so a model that fits is never refused. A model is refused when
training it would need more memory than the machine has: ``BYTES_PER_PARAMETER`` bytes per
parameter (float32 weight, gradient and Adam's two moments).
"""

from __future__ import annotations

import math
import os
from typing import Any

from experiments.config_errors import ConfigError

BYTES_PER_PARAMETER = 16


def _int(sizes: dict[str, Any], key: str) -> int | None:
    value = sizes.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


TRANSFORMER_SIZES = ("d_model", "d_ff", "n_layers", "max_positions")


def drop_none(sizes: dict[str, Any]) -> dict[str, Any]:
    """``sizes`` without its null values (a null key takes the model's own default)."""
    return {key: value for key, value in sizes.items() if value is not None}


def _transformer(vocab: int, d: int, ff: int, layers: int, positions: int, tied: bool) -> int:
    return vocab * d * (1 if tied else 2) + positions * d + layers * (4 * d * d + 2 * d * ff)


def estimate_parameters(
    spec: dict[str, Any], vocab_size: int, keys: dict[str, dict[str, Any]]
) -> int | None:
    """A lower bound of the parameter count of the model ``spec`` describes, its unset sizes
    read from ``keys`` (``experiments.models.build.model_keys()``: every family's defaults); None
    where the sizes are not plain numbers, or come from a pretrained GPT-2."""
    from ode_transformer.presets import PRESETS

    options = dict(spec)
    family, name = options.pop("family", None), options.pop("name", None)
    if family == "ode_transformer":
        preset = PRESETS.get(options.pop("preset", "small"))
        if preset is None:
            return None
        sizes = {**keys["ode_transformer"], **preset, **options}
        wanted = ("d_model", "d_ff", "n_layers", "max_positions")
        tied = sizes.get("tie_embeddings") is not False
    elif family == "neuralode_lm" and name in ("lstm", "ode-lstm"):
        sizes = {**keys[f"neuralode_lm: {name}"], **options}
        e, h, n = (_int(sizes, key) for key in ("embed_dim", "hidden_dim", "n_layers"))
        if None in (e, h, n):
            return None
        tied = sizes.get("tie_embeddings") is True
        return vocab_size * e + n * 4 * h * h + (0 if tied else vocab_size * h)
    elif family == "neuralode_lm" and name == "node-transformer":
        sizes = {**keys["neuralode_lm: node-transformer"], **options}
        d, ff, layers, positions, basis, rank = (
            _int({"weight_basis": 4, "hypernetwork_rank": 4, **drop_none(sizes)}, key)
            for key in (*TRANSFORMER_SIZES, "weight_basis", "hypernetwork_rank")
        )
        if None in (d, ff, layers, positions, basis, rank):
            return None
        conditioning = sizes.get("time_conditioning")
        field = (4 * d * d + 2 * d * ff) * (basis if conditioning == "weights" else 1)
        if conditioning == "hypernetwork":
            field += rank * (8 * d + 2 * ff)  # the low-rank factors of the four maps
        return vocab_size * d + positions * d + layers * field
    elif family == "reference" and name == "transformer":
        sizes = {**keys["reference: transformer"], **options, "max_positions": 0}  # sinusoidal
        wanted, tied = ("d_model", "d_ff", "n_layers", "max_positions"), False
    elif family == "reference" and name in (None, "bigram"):
        return vocab_size * vocab_size
    else:
        return None
    d, ff, layers, positions = (_int(sizes, key) for key in wanted)
    if None in (d, ff, layers, positions):
        return None
    return _transformer(vocab_size, d, ff, layers, positions, tied)


def memory_bytes() -> int | None:
    """This machine's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_model_size(
    spec: dict[str, Any], vocab_size: int, keys: dict[str, dict[str, Any]]
) -> None:
    """Raise ``ConfigError`` naming the estimate when training the model would not fit."""
    count, memory = estimate_parameters(spec, vocab_size, keys), memory_bytes()
    if count is None or memory is None or count * BYTES_PER_PARAMETER <= memory:
        return
    raise ConfigError(
        f"the model section asks for about {count:.3g} parameters (vocabulary {vocab_size}), "
        f"which need {count * BYTES_PER_PARAMETER / 2**30:,.0f} GiB to train "
        f"({BYTES_PER_PARAMETER} bytes each: weight, gradient, Adam's two moments); this "
        f"machine has {memory / 2**30:,.0f} GiB: lower the model's sizes (d_model, d_ff, "
        "n_layers, ...) or the vocabulary"
    )
