"""A run's identity: the settings that decide what it computes, hashed (``config_sha256``).
The keys odelm 0.3 hashed (``HASHED_03``) always count; a key added since only where it differs
from its neutral value (its default, or its field's ``neutral`` metadata), so a new key needs no
entry here. Field metadata ``identity: False`` leaves a key out, ``hashed_as`` hashes it under an
old value; ``model:`` counts as written, renamed keys in their 0.3 spelling (``HASHED_SPELLINGS``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from experiments.training import run_schema
from experiments.training.run_schema import RunConfig

_KEYS_03 = {  # a section's keys
    "data": "batch_size batching bpe_vocab_size bptt corpus eval_batch_size eval_window "
    "padding_side protocol seed stateful tokenizer verify_checksums",
    "eval": "bleu_sentences continuation_sentences decode prompt_len",
    "optim": "anneal_factor anneal_patience betas grad_clip label_smoothing lr momentum "
    "optimizer schedule warmup_steps weight_decay",
    "trainer": "accelerator average_last checkpoint_every deterministic devices "
    "early_stopping_patience log_every max_epochs max_steps max_time_s num_nodes precision "
    "strategy val_batches val_every",
}
HASHED_03 = frozenset(
    {"model", "recipe", "seed"}
    | {f"{section}.{key}" for section, keys in _KEYS_03.items() for key in keys.split()}
)
"""The keys odelm 0.3 hashed (and every key of ``model``): frozen, never to grow."""

HASHED_SPELLINGS = {
    "neuralode_lm lstm": {"n_layers": "num_layers", "tie_embeddings": "tie_weights"},
    "neuralode_lm ode-lstm": {"n_layers": "num_layers", "tie_embeddings": "tie_weights"},
    "neuralode_lm node-transformer": {"n_layers": "n_blocks"},
}
"""Model keys renamed since odelm 0.3, hashed under their old spelling."""


def _fields() -> dict[str, dataclasses.Field[Any]]:
    """Every dotted key of ``RunConfig`` (sections one level down) and its field."""
    found: dict[str, dataclasses.Field[Any]] = {}
    for field in dataclasses.fields(RunConfig):
        schema = run_schema.SECTIONS.get(field.name)
        inner = {f"{field.name}.{f.name}": f for f in dataclasses.fields(schema)} if schema else {}
        found.update(inner or {field.name: field})
    return found


RUN_FIELDS = _fields()


def neutral(key: str) -> Any:
    """The value of a key added after 0.3 at which it is left out of the identity."""
    field = RUN_FIELDS[key]
    if "neutral" in field.metadata:
        return field.metadata["neutral"]
    factory = field.default_factory
    return factory() if factory is not dataclasses.MISSING else field.default


def respelled(model: dict[str, Any], *, old: bool) -> dict[str, Any]:
    """A ``model:`` section with its keys renamed since 0.3 under their old spelling (``old``:
    as the identity hashes it) or their new one (a saved 0.3 run's ``config.yaml`` loads)."""
    renames = HASHED_SPELLINGS.get(f"{model.get('family')} {model.get('name')}", {})
    renames = renames if old else {was: now for now, was in renames.items()}
    return {renames.get(key, key): value for key, value in model.items()}


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def identity(config: RunConfig) -> dict[str, Any]:
    """The flattened settings that determine what a run computes (dotted keys)."""
    values = config.to_dict()
    flat = _flatten({**values, "model": respelled(values["model"], old=True)})
    counted = {}
    for key, value in sorted(flat.items()):
        field = RUN_FIELDS.get(key)
        if field is None:  # a key of the model section
            counted[key] = value
        elif field.metadata.get("identity", True):
            if "hashed_as" in field.metadata:
                value = field.metadata["hashed_as"].get(value, value)
            if key in HASHED_03 or value != neutral(key):
                counted[key] = value
    return counted


def config_sha256(config: RunConfig) -> str:
    """SHA-256 of the run's identity (stable across key order and excluded keys)."""
    text = json.dumps(identity(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def is_saved_run(values: dict[str, Any]) -> bool:
    """Whether a mapping is a ``config.yaml`` odelm wrote (a full dump: every data key)."""
    data = values.get("data")
    full = {"batching", "stateful", "eval_batch_size", "eval_window"}
    return isinstance(data, dict) and full <= data.keys()


def saved_run_values(values: dict[str, Any]) -> dict[str, Any]:
    """A run folder's ``config.yaml`` values as its run read them: renamed model keys under
    their new names, each later key it lacks at its neutral value (``data.order: 1``)."""
    values = dict(values)
    if isinstance(values.get("model"), dict):
        values["model"] = respelled(values["model"], old=False)
    if not is_saved_run(values):
        return values
    for key, field in RUN_FIELDS.items():
        section, _, name = key.partition(".")
        if name and "neutral" in field.metadata and name not in values.get(section, {}):
            values[section] = {**values.get(section, {}), name: field.metadata["neutral"]}
    return values
