"""The one parser of a run config: ``odelm train``'s (its LightningCLI, ``OdelmCLI``, adds
these arguments to Lightning's parser) and ``parse_config``'s (``read_run_form``), and
``odelm compare``'s options are copied from it.

It reads the Lightning form (``experiments.training.lightning_form``): ``seed_everything``
(also ``--seed``), ``trainer`` (Lightning's ``Trainer`` arguments the engine takes, under
Lightning's names and types), ``model``, odelm's ``data``, ``optim``, ``eval`` and ``run``
sections (each ranged key a jsonargparse constrained number type, its field's),
``name``, ``out_dir``, ``recipe`` and the short flags. ``--config`` may be repeated, each
file over the ones before; a file in the run form (every published config, every run
folder's ``config.yaml``) is translated on read. A recipe is a YAML file under
``experiments/configs/recipes`` (``--recipe NAME`` layers it where it is given; a file's
``recipe: NAME`` lies under that file).
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
import typing
from argparse import ArgumentError
from typing import Any, Union

from experiments.config_errors import ConfigError, config_error, lookup
from experiments.data.corpora import CORPUS_NAMES
from experiments.training.lightning_form import (
    DEFAULT_LOGGERS,
    LIGHTNING_TRAINER_KEYS,
    LOGGERS,
    RUN_KEYS,
    run_form_key,
)
from experiments.training.run_schema import (
    RECIPE_DIR,
    DataConfig,
    EvalConfig,
    OptimConfig,
    RunConfig,
    Seed,
    TrainerConfig,
    key_range_check,
)
from experiments.training.run_sections import (
    MODEL_HELP,
    ConfigFile,
    ModelSection,
    RecipeFile,
    add_section,
    check_sections,
    descriptions,
    lightning_values,
    run_config,
)
from odelm.lightning import pl

LightningArgumentParser = importlib.import_module(f"{pl.__name__}.cli").LightningArgumentParser

TRAINER_DEFAULTS = {
    "max_steps": 1000,
    "val_check_interval": 100,
    "log_every_n_steps": 10,
    "enable_progress_bar": True,
    "devices": 1,
    "precision": "32-true",
    "deterministic": True,
}
"""odelm's defaults for Lightning's ``Trainer`` arguments (the run form's defaults)."""
SHORT_FLAGS = {
    "--corpus": "data.corpus",
    "--max-steps": "trainer.max_steps",
    "--num-threads": "run.num_threads",
    "--data-dir": "data.data_dir",
    "--protocol": "data.protocol",
}
"""Short flags kept beside the dotted options they stand for (``odelm compare`` has them
too)."""


def add_config_arguments(parser: Any) -> None:
    """``-c/--config``, reading run-form files too (``ConfigFile``)."""
    parser.add_argument(
        "-c",
        "--config",
        action=ConfigFile,
        help="a YAML run config; repeat it to layer files, each over the ones before "
        "(run-form files, e.g. a run folder's config.yaml, are translated on read)",
    )


def add_seed_arguments(parser: Any) -> None:
    """``seed_everything`` (also ``--seed``): the seed of initialization, batching and
    dropout; ``true`` draws one."""
    seed = Union[bool, Seed]  # noqa: UP007 (a runtime type)
    help_text = "the seed of initialization, batching and dropout (true: draw one)"
    parser.add_argument("--seed_everything", type=seed, default=0, help=help_text)
    parser.add_argument("--seed", dest="seed_everything", type=seed, default=0, help=help_text)


def add_core_arguments(parser: Any) -> None:
    """``trainer`` (Lightning's ``Trainer``, the arguments the engine takes), ``model`` and
    ``data``."""
    skip = {
        name
        for name in typing.get_type_hints(pl.Trainer.__init__)
        if name not in LIGHTNING_TRAINER_KEYS or name == "logger"
    }
    parser.add_class_arguments(
        pl.Trainer, "trainer", fail_untyped=False, instantiate=False, skip=skip
    )
    parser.set_defaults({f"trainer.{k}": v for k, v in TRAINER_DEFAULTS.items()})
    parser.add_argument(
        "--trainer.logger",
        type=Union[bool, list[typing.Literal[LOGGERS]]],  # type: ignore[valid-type]  # noqa: UP007
        default=list(DEFAULT_LOGGERS),
        help="loggers: any of csv, tensorboard, wandb (offline); false: none",
    )
    parser.add_argument("--model", action=ModelSection, default={}, help=MODEL_HELP)
    add_section(parser, "data", DataConfig)
    (corpus,) = [a for a in parser._actions if a.option_strings == ["--data.corpus"]]
    corpus.help = (  # the corpora from the registry, not the docstring's list
        f"the corpus, one of {', '.join(CORPUS_NAMES)} (grammar is generated; text reads "
        "a folder of train*, valid*, test* files)"
    )


def add_own_arguments(parser: Any) -> None:
    """odelm's own sections and settings and the short flags."""
    add_section(parser, "optim", OptimConfig)
    add_section(parser, "eval", EvalConfig)
    add_section(parser, "run", TrainerConfig, RUN_KEYS)
    text = descriptions(RunConfig)
    parser.add_argument("--name", type=str, default="run", help=text["name"])
    parser.add_argument("--out_dir", type=str, default="runs", help=text["out_dir"])
    recipes = ", ".join(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))
    parser.add_argument(
        "--recipe",
        action=RecipeFile,
        default=None,
        help=f"a recipe, one of {recipes}: experiments/configs/recipes/NAME.yaml layered "
        "where it is given (a file's recipe: lies under that file)",
    )
    for flag, key in SHORT_FLAGS.items():
        (same,) = [a for a in parser._actions if a.option_strings == [f"--{key}"]]
        kind = {"choices": CORPUS_NAMES} if key == "data.corpus" else {}
        parser.add_argument(
            flag,
            dest=key,
            default=same.default,
            type=getattr(same, "_typehint", None),
            help=f"same as --{key}",
            **kind,
        )
    parser.add_argument(
        "--download",
        dest="data.download",
        action="store_true",
        help="same as --data.download true",
    )


@functools.cache
def run_parser() -> Any:
    """The run config's parser (Lightning's parser class with every argument above), built
    once: ``parse_config`` and ``odelm compare``'s options read it."""
    parser = LightningArgumentParser(exit_on_error=False)
    for add in (add_config_arguments, add_seed_arguments, add_core_arguments, add_own_arguments):
        add(parser)
    return parser


def read_run_form(
    values: dict[str, Any], where: str = "config", *, lightning_names: bool = False
) -> RunConfig:
    """``experiments.training.config.parse_config``: a run-form mapping (Lightning-form keys
    read too) read by the run config's parser; an error is one line naming the key as it
    was written (``where``: the file or grid entry it came from)."""
    check_sections(values, where)
    try:
        cfg = run_parser().parse_object(lightning_values(copy.deepcopy(values)))  # kept as given
    except ArgumentError as error:
        raise _run_form_error(str(error), values, where) from None
    return run_config(cfg, lightning_names=lightning_names)


def _run_form_error(text: str, values: dict[str, Any], where: str) -> ConfigError:
    """The parser's error on a run-form mapping as one line naming the run-form key (the
    Lightning key where the mapping spelled it so): its range and value, or its type."""
    wrong = re.match(r'Parser key "([^"]+)"', text)
    if wrong:
        key = run_form_key(wrong[1])
        for spelled in (key, wrong[1]):
            value = lookup(values, spelled)
            key_range_check(key, value, spelled)  # raises where the value is out of range
        text = text.replace(f'"{wrong[1]}"', f'"{key}"')
    unknown = re.match(r"Option '(?:([\w.]+)\.)?(\w+)' is not accepted", text)
    if unknown and unknown[1]:  # a key of a section: name the section's keys
        text = f"Group '{unknown[1]}' does not accept option '{unknown[2]}'"
    text = text.replace("Group 'run'", "Group 'trainer'")
    return config_error(
        Exception(text), lambda key: f"{where}.{key}".rstrip("."), values, RunConfig
    )
