"""What makes a run config valid beyond its types, and config errors as one line each.

jsonargparse checks types; the checks here name choices, ranges, budgets and combinations
of settings, and turn jsonargparse's messages into one line naming the key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from odelm.errors import OdelmError

if TYPE_CHECKING:
    from experiments.config import RunConfig


class ConfigError(OdelmError, ValueError):
    """A config has an unknown key, a wrong type or an invalid value."""


def config_error(
    error: Exception, label: Callable[[str], str], values: Any, schema: type
) -> ConfigError:
    """jsonargparse's error as one line naming the key (``label(key)``), what it must be
    and what it got (looked up in ``values``, the given mapping, when there is one)."""
    text = str(error)
    unknown = re.search(r"Group '([\w.]+)' does not accept option '([^']+)'", text)
    unknown = unknown or re.search(r"()Option '([^']+)' is not accepted", text)
    if unknown:
        section, key = unknown.groups()
        section_schema = key_type(schema, section) if section else schema
        valid = ", ".join(f.name for f in dataclasses.fields(section_schema))
        where = f"{section}.{key}" if section else key
        return ConfigError(f"unknown key {label(where)}; valid keys in {label(section)}: {valid}")
    wrong = re.search(r'Parser key "([^"]+)"', text)
    if wrong:
        key = wrong[1]
        value = _lookup(values, key)
        if value is _MISSING:
            given = re.search(r"(?:Got|Given) value: (.*)", text)
            value = given[1] if given else None
        expected = _type_name(key_type(schema, key))
        return ConfigError(
            f"{label(key)} must be {expected}, got {value!r} ({type(value).__name__})"
        )
    return ConfigError(text.splitlines()[0])


_MISSING = object()


def _lookup(values: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(values, dict) or part not in values:
            return _MISSING
        values = values[part]
    return values


def key_type(schema: Any, key: str) -> Any:
    """The type of a dotted config key in a dataclass schema (``optim.lr`` -> float)."""
    for part in key.split("."):
        schema = typing.get_type_hints(schema)[part]
    return schema


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if typing.get_origin(annotation) is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def check_values(config: RunConfig) -> None:
    """The checks types cannot say: choices, ranges, budgets and combinations."""
    choices = {
        "data.tokenizer": (config.data.tokenizer, ("word", "bpe")),
        "data.batching": (config.data.batching, ("stream", "sentences")),
        "data.padding_side": (config.data.padding_side, ("left", "right")),
        "optim.optimizer": (config.optim.optimizer, ("adam", "adamw", "sgd")),
        "optim.schedule": (config.optim.schedule, ("constant", "inverse_sqrt", "plateau")),
        "eval.decode": (config.eval.decode, ("greedy", "beam")),
    }
    for key, (value, valid) in choices.items():
        if value not in valid:
            raise ConfigError(f"{key} = {value!r} is not one of {', '.join(valid)}")
    for key, (value, low) in _lower_bounds(config).items():
        if value is not None and value < low:
            unset = " or null" if key in _NULLABLE else ""
            raise ConfigError(f"{key} = {value!r} is out of range; it must be >= {low}{unset}")
    if config.trainer.max_time_s is not None and config.trainer.max_time_s <= 0:
        raise ConfigError(
            f"trainer.max_time_s = {config.trainer.max_time_s!r} is out of range; it must be "
            "> 0 or null"
        )
    for name in config.trainer.logger:
        if name not in ("csv", "tensorboard", "wandb"):
            raise ConfigError(f"trainer.logger {name!r} is not one of csv, tensorboard, wandb")
    if len(config.optim.betas) != 2:
        raise ConfigError(f"optim.betas must hold two numbers, got {config.optim.betas}")
    if config.optim.anneal_factor <= 1 or config.optim.anneal_patience < 1:
        raise ConfigError(
            "optim.anneal_factor must be > 1 (the lr is divided by it) and "
            f"optim.anneal_patience >= 1, got {config.optim.anneal_factor} and "
            f"{config.optim.anneal_patience}"
        )
    trainer = config.trainer
    if trainer.max_steps is None and trainer.max_epochs is None:
        raise ConfigError("set a budget: trainer.max_steps or trainer.max_epochs (or both)")
    if isinstance(trainer.val_every, str) and trainer.val_every != "epoch":
        raise ConfigError(f"trainer.val_every = {trainer.val_every!r}: give steps or 'epoch'")
    if config.data.stateful and config.data.batching != "stream":
        raise ConfigError("data.stateful needs data.batching: stream (contiguous streams)")
    if not config.model:
        raise ConfigError("the config has no model section; e.g. model: {family: ode_transformer}")


_NULLABLE = {
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.val_batches",
    "trainer.early_stopping_patience",
    "trainer.num_threads",
}


def _lower_bounds(config: RunConfig) -> dict[str, tuple[float | None, float]]:
    """Budgets and sizes with the smallest value that means something (None: unset)."""
    data, trainer = config.data, config.trainer
    return {
        "data.batch_size": (data.batch_size, 1),
        "data.bptt": (data.bptt, 1),
        "data.eval_batch_size": (data.eval_batch_size, 1),
        "data.eval_window": (data.eval_window, 2),  # one token of context, one predicted
        "data.bpe_vocab_size": (data.bpe_vocab_size, 1),
        "optim.lr": (config.optim.lr, 0),
        "optim.weight_decay": (config.optim.weight_decay, 0),
        "optim.momentum": (config.optim.momentum, 0),
        "optim.warmup_steps": (config.optim.warmup_steps, 0),
        "optim.label_smoothing": (config.optim.label_smoothing, 0),
        "trainer.max_steps": (trainer.max_steps, 1),
        "trainer.max_epochs": (trainer.max_epochs, 1),
        "trainer.val_every": (trainer.val_every if isinstance(trainer.val_every, int) else None, 1),
        "trainer.val_batches": (trainer.val_batches, 1),
        "trainer.checkpoint_every": (trainer.checkpoint_every, 1),
        "trainer.early_stopping_patience": (trainer.early_stopping_patience, 1),
        "trainer.average_last": (trainer.average_last, 0),
        "trainer.log_every": (trainer.log_every, 1),
        "trainer.num_nodes": (trainer.num_nodes, 1),
        "trainer.num_threads": (trainer.num_threads, 1),
        "eval.bleu_sentences": (config.eval.bleu_sentences, 0),
        "eval.continuation_sentences": (config.eval.continuation_sentences, 0),
        "eval.prompt_len": (config.eval.prompt_len, 1),
    }
