"""What makes a run config valid beyond its types, and config errors as one line each.

jsonargparse checks types (choices are ``Literal`` types); the checks here name ranges,
budgets and combinations of settings, and turn jsonargparse's messages into one line naming
the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from odelm.errors import OdelmError

if TYPE_CHECKING:
    from experiments.training.config import RunConfig


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
        expected = type_name(key_type(schema, key))
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


def type_name(annotation: Any, short: bool = False) -> str:
    """A type as people read it: ``one of a, b``, ``int or null``, ``float``; ``short`` (help
    lines): ``{a,b}``, ``int | None``."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        choices = [str(arg) for arg in args]
        return "{" + ",".join(choices) + "}" if short else "one of " + ", ".join(choices)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return (" | " if short else " or ").join(type_name(arg, short) for arg in args)
    if annotation is type(None):
        return "None" if short else "null"
    if typing.get_origin(annotation) is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def check_values(config: RunConfig) -> None:
    """The checks types cannot say: ranges, budgets and combinations (the choices are the
    config's ``Literal`` types, which jsonargparse checks)."""
    for key, value in _ranged_values(config).items():
        check_range(key, value)
    for index, beta in enumerate(config.optim.betas):
        check_range("optim.betas", beta, f"optim.betas[{index}]")
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


@dataclasses.dataclass(frozen=True)
class Interval:
    """The values a setting may take: ``low`` to ``high``, each end included or not."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        if self.high is None:
            return above
        return above and (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low}, {self.high}{right}"


SEED_MAX = 2**32 - 1
"""The largest seed numpy (and so Lightning's ``seed_everything``) accepts."""
BPE_MIN_VOCAB = 258
"""A trained byte-level BPE needs its 256 byte symbols plus ``<eos>`` and ``<unk>``."""
RANGES: dict[str, Interval] = {
    "seed": Interval(0, SEED_MAX),
    "data.seed": Interval(0, SEED_MAX),
    "data.batch_size": Interval(1),
    "data.bptt": Interval(1),
    "data.eval_batch_size": Interval(1),
    "data.eval_window": Interval(2),  # one token of context, one predicted
    "data.bpe_vocab_size": Interval(BPE_MIN_VOCAB),
    "optim.lr": Interval(0),
    "optim.betas": Interval(0, 1, high_open=True),
    "optim.weight_decay": Interval(0),
    "optim.momentum": Interval(0),
    "optim.warmup_steps": Interval(0),
    "optim.grad_clip": Interval(0, low_open=True),
    "optim.label_smoothing": Interval(0, 1, high_open=True),
    "trainer.max_steps": Interval(1),
    "trainer.max_epochs": Interval(1),
    "trainer.max_time_s": Interval(0, low_open=True),
    "trainer.val_every": Interval(1),
    "trainer.val_batches": Interval(1),
    "trainer.checkpoint_every": Interval(1),
    "trainer.early_stopping_patience": Interval(1),
    "trainer.average_last": Interval(0),
    "trainer.log_every": Interval(1),
    "trainer.num_nodes": Interval(1),
    "trainer.num_threads": Interval(1),
    "eval.bleu_sentences": Interval(0),
    "eval.continuation_sentences": Interval(0),
    "eval.prompt_len": Interval(1),
}
"""The one range of every numeric setting: the config and the command line both check it."""
_NULLABLE = {
    "optim.grad_clip",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time_s",
    "trainer.val_batches",
    "trainer.early_stopping_patience",
    "trainer.num_threads",
}


def check_range(key: str, value: float | None, label: str | None = None) -> None:
    """Raise ``ConfigError`` naming ``label`` (default: ``key``) unless ``value`` lies in
    ``RANGES[key]`` (None passes: the setting is unset)."""
    if value is not None and value not in RANGES[key]:
        unset = " or null" if key in _NULLABLE else ""
        raise ConfigError(
            f"{label or key} = {value!r} is out of range; it must be {RANGES[key]}{unset}"
        )


_HMS = re.compile(r"(?:(\d+):)?(\d+):(\d+):(\d+)")


def resolve_max_time(trainer: Any) -> Any:
    """``trainer`` with its ``max_time`` (Lightning's ``[DD:]HH:MM:SS``; whole seconds as a
    number, which is what YAML reads an unquoted ``1:30:00`` as) moved into ``max_time_s``,
    so a run's identity is one budget however it was spelled."""
    value = trainer.max_time
    if value is None:
        return trainer
    text = str(value)
    match = _HMS.fullmatch(text)
    if match:
        days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
        total = float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    elif text.isdigit():
        total = float(text)
    else:
        raise ConfigError(
            f"trainer.max_time = {value!r} is not a time; it must be HH:MM:SS or DD:HH:MM:SS "
            "(as Lightning spells it, e.g. 00:05:00) or null"
        )
    if total <= 0:
        raise ConfigError(f"trainer.max_time = {value!r} is out of range; it must be > 0 or null")
    if trainer.max_time_s is not None and trainer.max_time_s != total:
        raise ConfigError(
            f"trainer.max_time = {value!r} ({total:g} s) and trainer.max_time_s = "
            f"{trainer.max_time_s!r} disagree; give one of them"
        )
    return dataclasses.replace(trainer, max_time_s=total, max_time=None)


MAX_THREADS = os.cpu_count() or 1
"""The most CPU threads a process may ask for: this machine's logical CPUs (torch starts a
thread pool of the size asked; a hundred thousand threads fail far from the cause)."""


def check_threads(value: int | None, label: str = "trainer.num_threads") -> None:
    """Raise ``ConfigError`` naming ``label`` unless ``value`` is None (the thread policy's
    choice) or a thread count within 1..``MAX_THREADS``. Checked where threads are set,
    not when a config is read: a run trained on a larger machine still loads."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        unset = " or null" if label.startswith("trainer.") else ""
        raise ConfigError(
            f"{label} = {value!r} is out of range; it must be in [1, {MAX_THREADS}]{unset} "
            f"({MAX_THREADS} is this machine's CPU count)"
        )


def _ranged_values(config: RunConfig) -> dict[str, float | None]:
    """The value of every key of ``RANGES`` but the betas (None: unset)."""
    values: dict[str, Any] = {"seed": config.seed}
    for section in ("data", "optim", "trainer", "eval"):
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            values[f"{section}.{key}"] = value
    if isinstance(config.trainer.val_every, str):
        values["trainer.val_every"] = None  # "epoch"
    return {key: values[key] for key in RANGES if key != "optim.betas"}
