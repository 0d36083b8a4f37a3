"""The run config's one parser, built from ``RunConfig`` (``add_run_arguments``): a typed
``--section.key`` option per field, ``--model``, ``--config FILE``, ``--recipe NAME`` and the
short flags; ``parse_config`` reads a mapping with it, ``load_config`` a file (``base:`` files
under it). An error is one line naming the key as written; for one release a key of the
removed Lightning form (``LIGHTNING_KEYS``) is refused naming its run-form key.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import random
import typing
from argparse import Action, ArgumentError
from pathlib import Path
from typing import Any, Literal, Optional, Union

import docstring_parser
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from experiments.config_errors import ConfigError, config_error
from experiments.data.corpora import CORPUS_NAMES
from experiments.models.schema import check_model
from experiments.safe_yaml import parse_yaml, read_yaml_text
from experiments.training import run_schema
from experiments.training.identity import config_sha256, is_saved_run, saved_run_values
from experiments.training.run_schema import (  # noqa: F401 (re-exported: the schema)
    DataConfig,
    EvalConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
)


class Replace(dict):
    """A mapping ``merge`` puts in place of the one under its key (``--model '{...}'``)."""


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``override`` wins, nested mappings merge (a ``Replace`` replaces)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Replace):
            merged[key] = dict(value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML mapping, with ``base:`` files merged underneath (paths relative to the file);
    a file that is its own base, through any chain, is an error naming the chain."""
    path = Path(path)
    if path.resolve() in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path.resolve()))
        raise ConfigError(f"base: files form a cycle ({chain}); remove one base: line")
    values = parse_yaml(read_yaml_text(path), str(path)) or {}  # YAML 1.2 numbers: 1e-3
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a YAML mapping at the top level")
    base = values.pop("base", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"base: in {path} must be a file name, got {base!r}")
    if base:
        values = merge(load_yaml(path.parent / base, (*_seen, path.resolve())), values)
    return values


LIGHTNING_KEYS = {
    "seed_everything": "seed",
    "trainer.val_check_interval": "trainer.val_every",
    "trainer.limit_val_batches": "trainer.val_batches",
    "trainer.log_every_n_steps": "trainer.log_every",
    "trainer.enable_progress_bar": "trainer.progress_bar",
    "run.KEY": "trainer.KEY",
    "class_path": "model: {family, name, ...keys} (LMTask with LightningCLI: examples/)",
}
"""One release only: the removed Lightning form's keys, and the run form's key of each."""
SHORT_FLAGS = {
    "--corpus": "data.corpus",
    "--max-steps": "trainer.max_steps",
    "--num-threads": "trainer.num_threads",
    "--data-dir": "data.data_dir",
    "--protocol": "data.protocol",
    "--max-time-s": "trainer.max_time_s",
}
"""Short flags kept beside the dotted options they stand for (in ``odelm compare`` too)."""
NO_MODEL = (
    "odelm train needs --config FILE, or a model on the command line: --model.family "
    "ode_transformer (or neuralode_lm, reference; odelm models lists their keys)"
)
MODEL_HELP = (
    "the model: family (ode_transformer, neuralode_lm, reference), name, and that model's "
    "typed keys (listed below the options; odelm models); --model '{family: neuralode_lm, "
    "name: lstm, embed_dim: 128}' replaces the model section, --model.KEY VALUE edits one "
    "key of it (--model.dropout 0.2, --model.solver.rtol 1e-6)"
)


def lightning_key(key: str) -> str | None:
    """The run-form key of a dotted key of the removed Lightning form (None: not one)."""
    section, _, name = key.partition(".")
    if section == "run":
        return f"trainer.{name}" if name else "trainer"
    if key.rpartition(".")[2] in ("class_path", "init_args"):
        return LIGHTNING_KEYS["class_path"]
    return LIGHTNING_KEYS.get(key)


def check_form(values: dict[str, Any], where: str) -> None:
    """Refuse a section that is not a mapping (``data: 5``), or a key of the removed
    Lightning form, in one line naming it as written in ``where`` (a file, a grid entry)."""
    for key in ("data", "model", "optim", "trainer", "eval"):
        if key in values and not isinstance(values[key], dict):
            raise ConfigError(
                f"{where}.{key} must be a mapping, got {type(values[key]).__name__}; write "
                f"{key}: {{KEY: VALUE, ...}} ({key}.KEY options on the command line)"
            )
    keys = list(values.items())
    while keys:
        key, value = keys.pop()
        new = lightning_key(key)
        if new is not None:
            raise ConfigError(
                f"{where}: {key} is the Lightning form of odelm train, which is gone; write "
                f"{new} (the run form)"
            )
        if isinstance(value, dict) and "." not in key:
            keys.extend((f"{key}.{k}", v) for k, v in value.items())


def descriptions(schema: type) -> dict[str, str]:
    """Each key's help line: the dataclass's ``Attributes:`` docstring, one line each."""
    doc = docstring_parser.parse(schema.__doc__ or "")
    return {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}


def add_section(parser: Any, section: str, schema: type) -> None:
    """One typed option per field of a run-config dataclass under ``section``."""
    hints, text = typing.get_type_hints(schema), descriptions(schema)
    group = parser.add_argument_group((schema.__doc__ or "").splitlines()[0])
    for field in dataclasses.fields(schema):
        factory = field.default_factory
        default = factory() if factory is not dataclasses.MISSING else field.default
        group.add_argument(
            f"--{section}.{field.name}",
            type=hints[field.name],
            default=default,
            help=text.get(field.name),
        )


class ModelSection(Action):
    """``--model '{...}'`` replaces the model section, ``--model.KEY VALUE`` sets one (dotted)
    key of it; values read as YAML, keys checked when the run config is read. jsonargparse
    hands it every ``--model.*`` option, as it declares a mapping type (``_typehint``)."""

    _typehint = dict[str, Any]
    whole: type[dict[str, Any]] = dict
    """The mapping ``--model '{...}'`` sets (``compare``'s: a ``Replace``)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        flag = str(option or self.option_strings[0])
        key = flag.removeprefix(self.option_strings[0]).removeprefix(".")
        value = parse_yaml(value, flag) if isinstance(value, str) else value
        current = namespace.get(self.dest)
        if not key:
            if not isinstance(value, dict):
                raise ArgumentError(self, f"must be a mapping {{key: value, ...}}, got {value!r}")
            namespace[self.dest] = self.whole(value)
            return
        for part in reversed(key.split(".")):
            value = {part: value}
        merged = merge(dict(current or {}), value)
        namespace[self.dest] = type(current)(merged) if isinstance(current, dict) else merged


def run_values(values: dict[str, Any], where: str, *, recipe: bool = False) -> dict[str, Any]:
    """A config mapping as the parser reads it: checked (``check_form``), a saved run's as it
    was read, its recipe underneath (unless ``recipe``: it is the recipe's own file)."""
    check_form(values, where)
    if is_saved_run(values):
        values = saved_run_values(values)
    name = values.get("recipe")
    if name is not None and not recipe:
        values = merge(read_config_file(run_schema.recipe_path(name)), values)
    return values


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config file's values as the parser reads them (``run_values``)."""
    recipe = Path(path).resolve().parent == run_schema.RECIPE_DIR.resolve()
    return run_values(load_yaml(path), str(path), recipe=recipe)


class ConfigFile(ActionConfigFile):
    """``--config FILE``: its values read (``base:``, ``recipe:``) and checked, so that an error
    names the file and the key as written there."""

    def __call__(self, parser: Any, cfg: Any, values: Any, option_string: Any = None) -> None:
        read = read_config_file(values)
        try:
            run_parser().parse_object(copy.deepcopy(read))
        except ArgumentError as error:
            raise config_error(error, str(values), read, RunConfig) from None
        text = yaml.safe_dump(read, sort_keys=False)
        self.apply_config(parser, cfg, self.dest, text)
        cfg[self.dest][-1] = values  # the file's name (--name auto names the run after it)


class RecipeFile(Action):
    """``--recipe NAME``: the recipe's file layered here, as ``--config`` would."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        text = yaml.safe_dump(read_config_file(run_schema.recipe_path(value)), sort_keys=False)
        ConfigFile.apply_config(parser, namespace, "config", text)
        namespace["config"].pop()  # not a file of the run's (--name auto)
        namespace["recipe"] = value


class GridModelSection(ModelSection):
    """``odelm compare``'s ``--model``: ``--model '{...}'`` replaces each run's section."""

    whole = Replace


def add_run_arguments(parser: Any, *, grid: bool = False) -> None:
    """Every key of ``RunConfig`` and the flags on ``parser``; ``grid`` (``odelm compare``'s):
    no ``--config``, ``--name`` or ``--out_dir``; ``--model``, ``--recipe`` under each run's."""
    if not grid:
        parser.add_argument(
            "-c",
            "--config",
            action=ConfigFile,
            help="a YAML run config; repeat it to layer files, each over the ones before "
            "(default: none: the options alone)",
        )
    text = descriptions(RunConfig)
    seed = Union[run_schema.Seed, Literal["random"]]  # noqa: UP007 (a runtime type)
    parser.add_argument("--seed", type=seed, default=0, help=text["seed"])
    model = GridModelSection if grid else ModelSection
    parser.add_argument("--model", action=model, default={}, help=MODEL_HELP)
    for section, schema in run_schema.SECTIONS.items():
        add_section(parser, section, schema)
    _action(parser, "--data.corpus").help = (  # the registry's corpora, not the docstring's
        f"the corpus, one of {', '.join(CORPUS_NAMES)} (grammar is generated; text reads "
        "a folder of train*, valid*, test* files)"
    )
    if not grid:
        parser.add_argument("--name", type=str, default="run", help=text["name"])
        parser.add_argument("--out_dir", type=str, default="runs", help=text["out_dir"])
    recipe = {"type": Optional[str]} if grid else {"action": RecipeFile}  # noqa: UP045
    parser.add_argument(
        "--recipe",
        default=None,
        **recipe,
        help=f"a recipe, one of {', '.join(run_schema.RECIPES)}: experiments/configs/recipes/"
        "NAME.yaml layered where it is given (a file's recipe: lies under that file)",
    )
    for flag, key in SHORT_FLAGS.items():
        same = _action(parser, f"--{key}")
        kind = {"choices": CORPUS_NAMES} if key == "data.corpus" else {"type": same._typehint}
        parser.add_argument(flag, dest=key, default=same.default, help=f"same as --{key}", **kind)
    parser.add_argument(
        "--download", dest="data.download", action="store_true", help="same as --data.download true"
    )


def _action(parser: Any, flag: str) -> Any:
    """The action of ``flag`` on ``parser``."""
    return next(a for a in parser._actions if a.option_strings == [flag])


@functools.cache
def run_parser() -> ArgumentParser:
    """The run config's parser, built once: ``parse_config`` reads a mapping with it."""
    parser = ArgumentParser(exit_on_error=False)
    add_run_arguments(parser)
    return parser


def plain(value: Any) -> Any:
    """``value`` with jsonargparse's ranged numbers (``PositiveInt(8)``) plain, nested too."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    for kind in (int, float):
        if isinstance(value, kind) and type(value) not in (kind, bool):
            return kind(value)
    return value


def named(config: RunConfig, paths: list[Any] | None) -> RunConfig:
    """``config`` with ``name: auto`` resolved: the last config file's name and the config's
    hash, a run folder per config (trying an override needs no ``--overwrite``)."""
    if config.name == "auto":
        files = [p for p in (paths or []) if p is not None]
        stem = Path(str(files[-1])).stem if files else "train"
        config.name = f"{stem}-{config_sha256(config)[:10]}"
    return config


def parse_config(
    values: dict[str, Any], *, where: str = "config", print_only: bool = False
) -> RunConfig:
    """The checked ``RunConfig`` of a mapping (its ``recipe`` under it; ``seed: random`` draws
    one), an error one line naming the key and ``where`` (``print_only``: no model needed)."""
    values = run_values(copy.deepcopy(values), where)
    try:
        parsed = plain(run_parser().parse_object(values).as_dict())
    except ArgumentError as error:
        raise config_error(error, where, values, RunConfig) from None
    parsed = {k: v for k, v in parsed.items() if k not in ("config", "__path__")}
    if parsed.get("seed") == "random":
        parsed["seed"] = random.SystemRandom().randint(0, run_schema.SEED_MAX)
    sections = {key: schema(**parsed.pop(key)) for key, schema in run_schema.SECTIONS.items()}
    model = parsed.pop("model") or {}
    if not model and not print_only:
        raise ConfigError(NO_MODEL)
    config = RunConfig(**parsed, **sections, model=model)
    check_model(config.model)
    return config


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (``base: other.yaml`` inherits from another file)."""
    return parse_config(merge(load_yaml(path), overrides or {}), where=str(path))


def load_run_config(path: str | Path) -> RunConfig:
    """A run folder's ``config.yaml``, read as its run read it (``saved_run_values``)."""
    return parse_config(saved_run_values(load_yaml(path)), where=str(path))
