"""Names and options the library shares with the Hugging Face ecosystem, without importing it.

[`MODEL_TYPES`][odelm.hub.MODEL_TYPES] gives each library model class its ``transformers``
``model_type`` (written to ``config.json``, registered by [`odelm.hf`][odelm.hf]);
[`resolve`][odelm.hub.resolve] reads the options of ``transformers``' ``from_pretrained`` for the
library's own loader.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

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

DOWNLOAD_OPTIONS = ("revision", "cache_dir", "token", "force_download", "local_files_only")
SAVED_FILES = ["config.json", "model.safetensors"]


def model_type_mismatch(saved: dict[str, Any], path: Path) -> str | None:
    """Why a ``config.json``'s ``model_type`` is not its ``architecture``'s (``transformers``
    would load it as another model than odelm builds), or None when it is (or has none)."""
    given, expected = saved.get("model_type"), MODEL_TYPES.get(saved["architecture"])
    if given is None or expected is None or given == expected:
        return None
    return (
        f"{path} says model_type {given!r} but its architecture {saved['architecture']} is "
        f"{expected!r}; the file was edited: restore it, or save the model again"
    )


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A Hub repository id, ``owner/name`` (a relative path of two parts that is not a folder)."""


def resolve(
    directory: str | os.PathLike[str], map_location: str, options: dict[str, Any]
) -> tuple[Path, str, Any]:
    """``(folder, device, dtype)`` for ``from_pretrained(directory, **options)`` with the options
    of ``transformers``' ``from_pretrained`` (what ``AutoModelForCausalLM.from_pretrained``
    passes on): a Hub repository id (``owner/name``, no such local folder) is downloaded with
    ``huggingface_hub`` (``revision``, ``cache_dir``, ``token``, ...: the config and the
    safetensors weights only), ``device_map`` (one device) moves the model, ``dtype`` (or
    ``torch_dtype``) casts it; every other option (``config``, ``trust_remote_code``, ...) is
    ignored: loading runs no code from the files whatever is passed."""
    path = Path(directory)
    if not path.exists() and isinstance(directory, str) and HUB_ID.fullmatch(directory):
        from huggingface_hub import snapshot_download

        download = {key: options[key] for key in DOWNLOAD_OPTIONS if options.get(key)}
        path = Path(snapshot_download(directory, allow_patterns=SAVED_FILES, **download))
    device = options.get("device_map")
    if isinstance(device, str) and device != "auto":
        map_location = device
    dtype = options.get("dtype", options.get("torch_dtype"))
    if isinstance(dtype, str):
        import torch

        dtype = None if dtype == "auto" else getattr(torch, dtype)
    return path, map_location, dtype


SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
"""The tokenizer's ids a saved model's ``config.json`` may carry (top-level keys, as in a
Hugging Face config): a run's are all its ``<eos>``, which starts every prompt (BOS), ends
every line and pads batches."""


def special_token_ids(model: Any) -> dict[str, int]:
    """The special token ids the model's config states (those set)."""
    config = getattr(model, "config", None)
    ids = {key: getattr(config, key, None) for key in SPECIAL_TOKEN_IDS}
    return {key: value for key, value in ids.items() if isinstance(value, int)}


def set_special_tokens(
    model: Any,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> None:
    """Tell a model its tokenizer's special token ids (those not None): its Hugging Face
    config and generation config take them (so generation stops at ``eos_token_id`` by
    default), and ``save_pretrained`` writes them to ``config.json``."""
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    for owner in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        if owner is None or not hasattr(owner, "__dict__"):
            continue
        for key, value in ids.items():
            if isinstance(value, int):
                setattr(owner, key, value)


def tokenizer_special_ids(folder: str | os.PathLike[str]) -> dict[str, int]:
    """The special token ids of a saved model written before its ``config.json`` carried
    them, read from the tokenizer files beside it: the ``<eos>`` of ``tokenizer_config.json``
    (its id from ``tokenizer.json``), a run's BOS, EOS and padding alike; {} without them."""
    import json

    try:
        config = json.loads((Path(folder) / "tokenizer_config.json").read_text())
        tokens = json.loads((Path(folder) / "tokenizer.json").read_text())["added_tokens"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    eos = config.get("eos_token") if isinstance(config, dict) else None
    ids = [t.get("id") for t in tokens if isinstance(t, dict) and t.get("content") == eos]
    if eos is None or len(ids) != 1 or not isinstance(ids[0], int):
        return {}
    return dict.fromkeys(SPECIAL_TOKEN_IDS, ids[0])


def restore_special_tokens(
    model: Any, saved: dict[str, Any], folder: str | os.PathLike[str]
) -> None:
    """Give a loaded model the special token ids of its ``config.json`` (``saved``), or of the
    tokenizer files beside it ([`tokenizer_special_ids`][odelm.hub.tokenizer_special_ids])."""
    ids = {key: saved[key] for key in SPECIAL_TOKEN_IDS if isinstance(saved.get(key), int)}
    set_special_tokens(model, **(ids or tokenizer_special_ids(folder)))
