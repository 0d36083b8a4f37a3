"""Run configuration: typed sections read from YAML, with unknown keys and wrong types named.

A run config has five sections: ``data``, ``model`` (free-form: the model family's own
keyword arguments), ``optim``, ``trainer`` and ``eval``, plus ``name``, ``seed`` and
``out_dir``. ``model`` is passed to ``experiments.models.build_model``, which checks it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from odelm.errors import OdelmError


class ConfigError(OdelmError, ValueError):
    """A config has an unknown key, a wrong type or an invalid value."""


@dataclass
class DataConfig:
    corpus: str = "grammar"
    data_dir: str | None = None
    protocol: str = "full"
    download: bool = False  # fetch missing PTB / WikiText-2 files into the cache
    verify_checksums: bool = True  # refuse a split file whose known checksum differs
    tokenizer: str = "word"  # "word" or "bpe"
    bpe_vocab_size: int = 4000
    tokenizer_dir: str | None = None  # a local GPT-2 tokenizer directory for "bpe"
    batching: str = "stream"  # "stream" (BPTT windows) or "sentences" (padded, masked)
    batch_size: int = 16
    bptt: int = 35
    padding_side: str = "right"
    eval_window: int = 128
    eval_batch_size: int = 16  # evaluation rows (streams when stateful)
    # stateful: the train split as batch_size contiguous streams read in order, the model's
    # state carried (detached) across windows; evaluation carries it over the whole split
    stateful: bool = False
    seed: int = 0  # seed of the generated grammar corpus


@dataclass
class OptimConfig:
    optimizer: str = "adam"  # "adam", "adamw" or "sgd"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    # "constant", "inverse_sqrt" (with linear warmup) or "plateau": the lr is divided by
    # anneal_factor after anneal_patience validations in a row without a new best
    schedule: str = "constant"
    warmup_steps: int = 0
    anneal_factor: float = 4.0
    anneal_patience: int = 1
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0


@dataclass
class TrainerConfig:
    max_steps: int | None = 1000
    max_epochs: int | None = None  # passes over the train split; with max_steps, the first
    max_time_s: float | None = None
    val_every: int | str = 100  # steps, or "epoch"
    val_batches: int | None = None  # limit validation windows (None: the whole split)
    checkpoint_every: int = 100
    early_stopping_patience: int | None = None
    average_last: int = 0  # average the weights of the last N validation checkpoints
    log_every: int = 10
    accelerator: str = "cpu"
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    deterministic: bool = True
    progress_bar: bool = True
    logger: list[str] = field(default_factory=lambda: ["csv", "tensorboard"])  # or wandb
    num_threads: int | None = None  # CPU threads for torch (None: torch's default)


@dataclass
class EvalConfig:
    bleu_sentences: int = 200  # teacher-forced BLEU over the first N test lines
    continuation_sentences: int = 50  # continuation BLEU decodes, so it uses fewer
    prompt_len: int = 3
    decode: str = "greedy"


@dataclass
class RunConfig:
    name: str = "run"
    recipe: str | None = None  # a named recipe (experiments.recipes) under this config
    seed: int = 0
    out_dir: str = "runs"
    data: DataConfig = field(default_factory=DataConfig)
    model: dict[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits a (simple) type annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key {where}.{unknown[0]}"
            + (f" (and {unknown[1:]})" if unknown[1:] else "")
            + f"; valid keys in {where}: {', '.join(sorted(known))}"
        )
    kwargs = {}
    for key, value in values.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, f"{where}.{key}")
            continue
        if not _matches(value, hint):
            raise ConfigError(
                f"{where}.{key} must be {_type_name(hint)}, got {value!r} ({type(value).__name__})"
            )
        kwargs[key] = float(value) if hint is float else value
    return cls(**kwargs)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


# pytorch/examples word_language_model: plain SGD at a high rate, gradient norm clipped at
# 0.25, the rate divided by 4 whenever validation does not improve; recurrent models carry
# their state across consecutive windows of contiguous streams.
_WORD_LM_SGD = {
    "optimizer": "sgd",
    "momentum": 0.0,
    "weight_decay": 0.0,
    "grad_clip": 0.25,
    "schedule": "plateau",
    "anneal_factor": 4.0,
    "anneal_patience": 1,
}
RECIPES: dict[str, dict[str, Any]] = {
    "lstm-sgd": {"optim": {**_WORD_LM_SGD, "lr": 20.0}, "data": {"stateful": True}},
    "transformer-sgd": {"optim": {**_WORD_LM_SGD, "lr": 5.0}, "data": {"stateful": False}},
    # the library's Adam recipe (the quick grid's): inverse square-root decay after warmup
    "adam": {
        "optim": {
            "optimizer": "adam",
            "lr": 1e-3,
            "betas": [0.9, 0.997],
            "weight_decay": 0.0,
            "schedule": "inverse_sqrt",
            "warmup_steps": 100,
            "grad_clip": 1.0,
        },
        "data": {"stateful": False},
    },
}


def with_recipe(values: dict[str, Any]) -> dict[str, Any]:
    """Config values with their named recipe merged underneath (the values win)."""
    name = values.get("recipe")
    if name is None:
        return values
    if name not in RECIPES:
        raise ConfigError(f"recipe = {name!r} is not one of {', '.join(RECIPES)}")
    return merge(RECIPES[name], values)


def parse_config(values: dict[str, Any], *, where: str = "config") -> RunConfig:
    """Build a RunConfig from a plain dict, naming any unknown key or wrong type.

    A ``recipe`` lies underneath: the config's own settings win over the recipe's.
    """
    config = _build(RunConfig, with_recipe(values), where)
    _check_values(config)
    return config


def _check_values(config: RunConfig) -> None:
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


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``override`` wins, nested mappings merge."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (``base: other.yaml`` inherits from another file)."""
    values = load_yaml(path)
    return parse_config(merge(values, overrides or {}), where=str(path))


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping, with ``base:`` files merged underneath (paths relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}, line {mark.line + 1} column {mark.column + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"YAML syntax error in {where}: {problem}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a YAML mapping at the top level")
    base = values.pop("base", None)
    if base:
        values = merge(load_yaml(path.parent / base), values)
    return values
