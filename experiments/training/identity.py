"""A run's identity: the settings that decide what it computes, hashed (``config_sha256``).

One rule, so that a new key needs no entry here: the keys hashed by odelm 0.3
(``HASHED_03``, frozen) always count; a key added since counts only where it differs from
its neutral value, the behaviour before it existed: its field's default, or the field's
``neutral`` metadata where the default changed the behaviour (``data.order``). A field with
``identity: False`` metadata never counts (where files live, CPU threads, a progress bar:
a run may move or resume with another thread count); one with ``hashed_as`` metadata is
hashed under an old value (``trainer.accelerator: auto`` as ``cpu``, its old default). The
``model:`` section counts as written, its keys renamed since 0.3 under their old spelling
(``HASHED_SPELLINGS``). A run folder's ``config.yaml`` reads as its run did
(``saved_run_values``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from typing import Any

from experiments.training.run_schema import RunConfig

HASHED_03 = frozenset(
    {
        *(f"data.{key}" for key in ("batch_size", "batching", "bpe_vocab_size", "bptt")),
        *(f"data.{key}" for key in ("corpus", "eval_batch_size", "eval_window")),
        *(f"data.{key}" for key in ("padding_side", "protocol", "seed", "stateful")),
        *("data.tokenizer", "data.verify_checksums"),
        *(f"eval.{key}" for key in ("bleu_sentences", "continuation_sentences")),
        *("eval.decode", "eval.prompt_len"),
        *(f"optim.{key}" for key in ("anneal_factor", "anneal_patience", "betas")),
        *(f"optim.{key}" for key in ("grad_clip", "label_smoothing", "lr", "momentum")),
        *(f"optim.{key}" for key in ("optimizer", "schedule", "warmup_steps", "weight_decay")),
        *("model", "recipe", "seed"),
        *(f"trainer.{key}" for key in ("accelerator", "average_last", "checkpoint_every")),
        *(f"trainer.{key}" for key in ("deterministic", "devices", "early_stopping_patience")),
        *(f"trainer.{key}" for key in ("log_every", "max_epochs", "max_steps", "max_time_s")),
        *(f"trainer.{key}" for key in ("num_nodes", "precision", "strategy", "val_batches")),
        "trainer.val_every",
    }
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
    hints = typing.get_type_hints(RunConfig)
    for field in dataclasses.fields(RunConfig):
        schema = hints[field.name]
        if dataclasses.is_dataclass(schema):
            found.update({f"{field.name}.{f.name}": f for f in dataclasses.fields(schema)})
        else:
            found[field.name] = field
    return found


RUN_FIELDS = _fields()


def neutral(key: str) -> Any:
    """The value of a key added after 0.3 at which it is left out of the identity."""
    field = RUN_FIELDS[key]
    if "neutral" in field.metadata:
        return field.metadata["neutral"]
    factory = field.default_factory
    return factory() if factory is not dataclasses.MISSING else field.default


def _label(model: dict[str, Any]) -> str:
    return f"{model.get('family')} {model.get('name')}"


def hashed_spelling(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model:`` section as its run identity spells it (``HASHED_SPELLINGS``)."""
    renames = HASHED_SPELLINGS.get(_label(model), {})
    return {renames.get(key, key): value for key, value in model.items()}


def current_spelling(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model:`` section saved by odelm 0.3 or before, its renamed keys under their names
    now (a saved run's ``config.yaml`` loads; a config file given by hand is refused)."""
    renames = {old: new for new, old in HASHED_SPELLINGS.get(_label(model), {}).items()}
    return {renames.get(key, key): value for key, value in model.items()}


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _counts(key: str, value: Any) -> bool:
    if key not in RUN_FIELDS:  # a key of the model section
        return True
    if not RUN_FIELDS[key].metadata.get("identity", True):
        return False
    return key in HASHED_03 or value != neutral(key)


def identity(config: RunConfig) -> dict[str, Any]:
    """The flattened settings that determine what a run computes (dotted keys)."""
    values = config.to_dict()
    flat = _flatten({**values, "model": hashed_spelling(values["model"])})
    for key, value in flat.items():
        if key in RUN_FIELDS and "hashed_as" in RUN_FIELDS[key].metadata:
            flat[key] = RUN_FIELDS[key].metadata["hashed_as"].get(value, value)
    return {key: value for key, value in sorted(flat.items()) if _counts(key, value)}


def config_sha256(config: RunConfig) -> str:
    """SHA-256 of the run's identity (stable across key order and excluded keys)."""
    text = json.dumps(identity(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


_FULL_DATA_DUMP = {"batching", "stateful", "eval_batch_size", "eval_window"}
"""Keys every ``config.yaml`` odelm has written carries in its data section (a full dump),
unlike a hand-written partial config."""


def is_saved_run(values: dict[str, Any]) -> bool:
    """Whether a run-form mapping is a ``config.yaml`` odelm wrote (a full dump)."""
    data = values.get("data")
    return isinstance(data, dict) and _FULL_DATA_DUMP <= data.keys()


def saved_run_values(values: dict[str, Any]) -> dict[str, Any]:
    """A run folder's ``config.yaml`` values as its run read them: model keys renamed since
    0.3 under their new names, and each later key it lacks at its neutral value
    (``data.order: 1`` where it was written before ``data.order`` existed)."""
    values = dict(values)
    if isinstance(values.get("model"), dict):
        values["model"] = current_spelling(values["model"])
    if not is_saved_run(values):
        return values
    for key, field in RUN_FIELDS.items():
        section, _, name = key.partition(".")
        if name and "neutral" in field.metadata and name not in values.get(section, {}):
            values[section] = {**values.get(section, {}), name: field.metadata["neutral"]}
    return values
