"""The run config's sections as options of its parser (``experiments.training.run_parser``):
odelm's typed sections (``add_section``: each ranged key a jsonargparse constrained number
type, its field's), the ``model:`` section (``ModelSection``), ``--config`` reading
files of either form (``ConfigFile``), recipes as files (``RecipeFile``), and the parsed
Lightning-form config read into the engine's ``RunConfig`` (``run_config``)."""

from __future__ import annotations

import dataclasses
import random
import typing
from argparse import Action, ArgumentError
from pathlib import Path
from typing import Any

import docstring_parser
import yaml
from jsonargparse import ActionConfigFile, Namespace

from experiments.config_errors import ConfigError
from experiments.training.identity import is_saved_run, saved_run_values
from experiments.training.lightning_form import (
    from_lightning,
    lightning_message,
    run_form_key,
    to_lightning,
)
from experiments.training.run_schema import (
    RECIPE_DIR,
    SEED_MAX,
    RunConfig,
    checked_config,
    recipe_path,
)
from experiments.training.yamlfiles import load_yaml, merge, parse_yaml

COMMAND_KEYS = ("overwrite", "quiet", "verbose")
"""Options of the command, not of the run: left out of the printed config."""
NO_MODEL = (
    "odelm train needs --config FILE, or a model on the command line: --model.family "
    "ode_transformer (or neuralode_lm, reference; odelm models lists their keys)"
)
MODEL_HELP = (
    "the model: family (ode_transformer, neuralode_lm, reference), name, and that model's "
    "typed keys (listed below the options; odelm models), or {class_path: MODEL_CLASS, "
    "init_args: {...}}, or a saved model's {architecture, config}; --model '{family: "
    "neuralode_lm, name: lstm, embed_dim: 128}' replaces the model section, --model.KEY VALUE "
    "edits one key of it (--model.dropout 0.2, --model.solver.rtol 1e-6)"
)


def descriptions(schema: type) -> dict[str, str]:
    """Each key's help line: the dataclass's ``Attributes:`` docstring, one line each."""
    doc = docstring_parser.parse(schema.__doc__ or "")
    return {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}


def add_section(
    parser: Any, section: str, schema: type, keys: tuple[str, ...] | None = None
) -> None:
    """One typed option per key of a run-config dataclass under ``section`` (``keys``: only
    those), each ranged key a constrained number type (its field's)."""
    hints = typing.get_type_hints(schema)
    text = descriptions(schema)
    group = parser.add_argument_group(
        (schema.__doc__ or "").splitlines()[0], name=section if keys else None
    )
    for field in dataclasses.fields(schema):
        if keys is not None and field.name not in keys:
            continue
        default = (
            field.default_factory()  # type: ignore[misc]
            if field.default is dataclasses.MISSING
            else field.default
        )
        group.add_argument(
            f"--{section}.{field.name}",
            type=hints[field.name],
            default=default,
            help=text.get(field.name),
        )


class ModelSection(Action):
    """``--model '{...}'`` replaces the model section; ``--model.KEY VALUE`` sets one key
    of it, a dotted key one level down per dot (``--model.solver.rtol 1e-6``). Values are
    read as YAML (``1e-6`` is a float); the keys are checked against the model's typed
    config when the run config is read. jsonargparse hands this action every ``--model.*``
    option because it declares a mapping type (``_typehint``)."""

    _typehint = dict[str, Any]
    whole: type[dict[str, Any]] = dict
    """The mapping ``--model '{...}'`` sets (``compare``'s: a ``Replace``)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        key = str(option or "").removeprefix(self.option_strings[0]).removeprefix(".")
        flag = self.option_strings[0] + (f".{key}" if key else "")
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


MAPPING_SECTIONS = ("data", "model", "optim", "trainer", "eval", "run")
"""The config's keys that hold a mapping, in either form."""


def check_sections(values: dict[str, Any], where: str) -> None:
    """Refuse a section that is not a mapping (``data: 5``), naming it as written in
    ``where`` (the file or grid entry)."""
    for key in MAPPING_SECTIONS:
        if key in values and not isinstance(values[key], dict):
            raise ConfigError(
                f"{where}.{key} must be a mapping, got {type(values[key]).__name__}; write "
                f"{key}: {{KEY: VALUE, ...}} ({key}.KEY options on the command line)"
            )


WRITTEN: list[dict[str, Any]] = []
"""The config files ``--config`` read in the current parse, as written: an error names a key
as they spell it (``LightningCLI.parse_arguments`` empties it first)."""


def written_key(key: str) -> tuple[str, Any] | None:
    """A Lightning-form ``key`` as the config files read in this parse spell it, and its
    value there (the last file giving it); None when no file gives it."""
    for values in reversed(WRITTEN):
        for spelled in (run_form_key(key), key):
            value: Any = values
            for part in spelled.split("."):
                value = value.get(part, WRITTEN) if isinstance(value, dict) else WRITTEN
            if value is not WRITTEN:
                return spelled, value
    return None


def written_keys() -> set[str]:
    """Every dotted key of the config files read in this parse, as written."""
    keys: set[str] = set()
    stack: list[tuple[str, Any]] = [("", values) for values in WRITTEN]
    while stack:
        prefix, values = stack.pop()
        for key, value in values.items() if isinstance(values, dict) else ():
            keys.add(f"{prefix}{key}")
            stack.append((f"{prefix}{key}.", value))
    return keys


def read_config_file(path: str | Path, *, written: bool = False) -> dict[str, Any]:
    """A config file in the Lightning form (``lightning_values``); ``written``: the user's
    own (``--config``), kept in ``WRITTEN`` so that errors name its keys as it does."""
    recipe = Path(path).resolve().parent == RECIPE_DIR.resolve()
    values = load_yaml(path)
    check_sections(values, str(path))
    if written:
        WRITTEN.append(values)
    return lightning_values(values, recipe=recipe)


def lightning_values(values: dict[str, Any], *, recipe: bool = False) -> dict[str, Any]:
    """A config mapping, in either form, in the Lightning form: run-form keys translated (a
    run folder's ``config.yaml`` as ``load_run_config`` reads it), a named recipe merged
    underneath (unless ``recipe``: the mapping is the recipe's own file)."""
    if is_saved_run(values):  # a run folder's config.yaml: it reads as its run did
        values = saved_run_values(values)
    name = values.get("recipe")
    if name is not None and not recipe:
        values = merge(read_config_file(recipe_path(name)), values)
    return to_lightning(values)


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


class ConfigFile(ActionConfigFile):
    """LightningCLI's ``--config``, reading run-form files (and ``recipe:``) by translation."""

    def __call__(self, parser: Any, cfg: Any, values: Any, option_string: Any = None) -> None:
        path = values if isinstance(values, str) and Path(values).is_file() else None
        if path is None and isinstance(values, str) and Path(values).suffix in CONFIG_SUFFIXES:
            raise ConfigError(f"config file {values} does not exist")
        if path is not None:
            values = yaml.safe_dump(read_config_file(path, written=True), sort_keys=False)
        self.apply_config(parser, cfg, self.dest, values)
        cfg[self.dest][-1] = path  # the file's name (--name auto names the run after it)


class RecipeFile(Action):
    """``--recipe NAME``: the recipe's file layered here, as ``--config`` would."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        text = yaml.safe_dump(read_config_file(recipe_path(value)), sort_keys=False)
        ConfigFile.apply_config(parser, namespace, "config", text)
        namespace["config"].pop()  # not a file of the run's (--name auto)


def run_config(
    cfg: Namespace, *, print_only: bool = False, lightning_names: bool = True
) -> RunConfig:
    """The engine's ``RunConfig`` of a parsed Lightning-form config, checked (``print_only``:
    the defaults may be shown without a model, every other section checked;
    ``lightning_names``: errors name keys as the Lightning form does)."""
    values = {k: v for k, v in cfg.as_dict().items() if k not in (*COMMAND_KEYS, "config")}
    values.pop("__path__", None)
    if print_only and values.get("seed_everything") is True:  # drawn when the run starts
        values["seed_everything"] = 0
    try:
        run = from_lightning(values)
        if not run["model"].get("family"):  # odelm_model gave a class_path model one
            if not print_only:
                raise ConfigError(NO_MODEL)
            config = checked_config({**run, "model": {"family": "ode_transformer"}})
            config.model = {}
        else:
            config = checked_config(run)
    except ConfigError as error:
        if not lightning_names:
            raise
        raise ConfigError(lightning_message(str(error), written_keys())) from None
    return config


def draw_seed() -> int:
    """A seed drawn at random (``seed_everything: true``), one numpy accepts."""
    return random.SystemRandom().randint(0, SEED_MAX)
