"""``odelm train``: a ``LightningCLI`` subclass (``OdelmCLI``) of the Lightning package odelm
chose (``odelm.lightning``).

Its parser is Lightning's ``LightningArgumentParser``; its config is the *Lightning form*
of a run config (``experiments.training.lightning_form``): ``trainer:`` is Lightning's
``Trainer`` arguments under Lightning's names (those the engine takes), ``seed_everything``
the seed, ``model:`` odelm's ``{family, name, ...keys}`` or ``{class_path, init_args}``,
and odelm's own sections beside them: ``data``, ``optim``, ``eval``, ``run`` (the loop's
settings Lightning's ``Trainer`` lacks), ``name``, ``out_dir`` and ``recipe``. Numeric
settings are jsonargparse's constrained number types (their ranges are
``experiments.training.config_checks.RANGES``). ``--config`` may be repeated, each file
over the ones before it; a file in the run form (every published config, every run
folder's ``config.yaml``) is translated on read. A recipe is a YAML file under
``experiments/configs/recipes`` (``--recipe NAME`` layers it where it is given; a file's
``recipe: NAME`` lies under that file). ``--help`` and ``--print_config`` are
LightningCLI's.

The CLI is built with ``run=False`` and no subcommands: ``instantiate_classes`` reads the
parsed config into the engine's ``RunConfig`` (the hashed, canonical form) and
``cmd_train`` hands it to ``experiments.training.train.train``, which builds the Lightning
objects, resumes, and writes ``result.json`` and the model card.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import typing
from argparse import ArgumentError
from datetime import datetime
from typing import Any, Union

from jsonargparse import Namespace

from experiments.cli.parser import HelpFormatter, epilog
from experiments.cli.run_sections import (
    COMMAND_KEYS,
    MODEL_HELP,
    NO_MODEL,
    ConfigFile,
    ModelSection,
    RecipeFile,
    add_section,
    descriptions,
    draw_seed,
    lightning_values,
    ranged_type,
    run_config,
)
from experiments.config_errors import ConfigError, config_error, lookup
from experiments.data.corpora import CORPUS_NAMES
from experiments.models.schema import model_keys_help, resolved_model_comment
from experiments.training.config import (
    RECIPE_DIR,
    SECTIONS,
    DataConfig,
    EvalConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
)
from experiments.training.config_checks import RANGES, check_range
from experiments.training.lightning_form import (
    DEFAULT_LOGGERS,
    LIGHTNING_TRAINER_KEYS,
    LOGGERS,
    RUN_KEYS,
    run_form_key,
)
from experiments.training.threads import check_threads
from odelm.lightning import NAME, pl

_cli = importlib.import_module(f"{pl.__name__}.cli")  # not imported by the package
LightningCLI, LightningArgumentParser = _cli.LightningCLI, _cli.LightningArgumentParser

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


_PARSERS: dict[str, Any] = {}
"""``OdelmCLI``'s parser, once built (``OdelmCLI.setup_parser``)."""


class OdelmParser(LightningArgumentParser):
    """Lightning's parser; a printed config (``--print_config``) is checked as a run config
    first, and leaves out the command's own options."""

    def dump(self, cfg: Namespace, *args: Any, **kwargs: Any) -> str:
        cfg = cfg.clone()
        for key in COMMAND_KEYS:
            cfg.pop(key, None)
        config = run_config(cfg, print_only=True)
        cfg["name"] = config.name  # auto resolved
        text = super().dump(cfg, *args, **kwargs)
        model = resolved_model_comment(config.model) if config.model else f"# {NO_MODEL}\n"
        return text + model  # the run's identity is the section as written: defaults aside


class OdelmCLI(LightningCLI):
    """``odelm train``'s LightningCLI: the run config's parser, read into ``RunConfig``
    (``self.run_config``); the engine fits (``cmd_train``)."""

    def __init__(self, args: list[str] | None = None) -> None:
        super().__init__(
            parser_class=OdelmParser,
            parser_kwargs={
                "prog": "odelm train",
                "description": DESCRIPTION,
                "exit_on_error": False,
                "formatter_class": HelpFormatter,
                "epilog": f"{epilog('train')}\n\n{model_keys_help()}",
                "dump_header": [f"odelm train ({NAME})"],
            },
            seed_everything_default=0,
            save_config_callback=None,
            auto_configure_optimizers=False,
            load_from_checkpoint_support=False,
            run=False,
            args=args,
        )

    def init_parser(self, **kwargs: Any) -> Any:
        """Lightning's parser with ``-c/--config`` reading run-form files too."""
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c",
            "--config",
            action=ConfigFile,
            help="a YAML run config; repeat it to layer files, each over the ones before "
            "(run-form files, e.g. a run folder's config.yaml, are translated on read)",
        )
        return parser

    def add_default_arguments_to_parser(self, parser: Any) -> None:
        """``seed_everything`` (also ``--seed``): the seed of initialization, batching and
        dropout; ``true`` draws one."""
        seed = Union[bool, ranged_type("seed", int)]  # noqa: UP007 (a runtime type)
        help_text = "the seed of initialization, batching and dropout (true: draw one)"
        parser.add_argument("--seed_everything", type=seed, default=0, help=help_text)
        parser.add_argument("--seed", dest="seed_everything", type=seed, default=0, help=help_text)

    def add_core_arguments_to_parser(self, parser: Any) -> None:
        """``trainer`` (Lightning's ``Trainer``, the arguments the engine takes), ``model``
        and ``data``."""
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

    def add_arguments_to_parser(self, parser: Any) -> None:
        """odelm's own sections and settings, the short flags and the command's options."""
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
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="discard an existing run of this name (made with another config) and train afresh",
        )
        parser.add_argument(
            "--quiet", action="store_true", help="no progress bar or Lightning chatter"
        )
        parser.add_argument(
            "--verbose", action="store_true", help="show Lightning's hardware lines and tips"
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """The command line ``args`` (``odelm``'s ``main`` hands them over); a wrong one
        raises ``UsageError``, one line naming the option."""
        from experiments.cli.usage import usage_error

        try:
            self.config = parser.parse_args(args)
        except ArgumentError as error:
            raise usage_error(parser, list(args), error, command="train") from None
        finally:  # a refused --print_config leaves its request on the (shared) parser
            if hasattr(parser, "print_config"):
                delattr(parser, "print_config")

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        """LightningCLI's parser, built once per process and shared: a parse leaves it as it
        was, and building it (Lightning's ``Trainer`` signature read) costs a second."""
        if "train" not in _PARSERS:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            _PARSERS["train"] = self.parser
        self.parser = _PARSERS["train"]

    def _set_seed(self) -> None:
        """``seed_everything: true`` draws a seed into the config (the engine seeds the run
        with it; Lightning's own draw is 0 whenever no seed is set)."""
        if self.config.get("seed_everything") is True:
            self.config["seed_everything"] = draw_seed()

    def instantiate_classes(self) -> None:
        """The run config, checked (its thread count against this machine's CPUs, before
        anything is written); the engine builds the Lightning objects."""
        self.run_config = run_config(self.config)
        check_threads(self.run_config.trainer.num_threads, "run.num_threads")


DESCRIPTION = (
    "Train one model from YAML run configs (--config, repeatable: each file over the ones "
    "before) and/or options: any config key as --section.key VALUE (e.g. --optim.lr 1e-3 "
    "--trainer.max_steps 20 --trainer.max_time 00:05:00). trainer: takes Lightning's Trainer "
    "arguments under Lightning's names; run: odelm's loop settings Lightning has no argument "
    "for. Defaults shown are odelm's."
)


def quiet_lightning() -> None:
    """Hide Lightning's hardware lines, tips and advertisements (shown with ``--verbose``)."""
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)


def cli_parser() -> Any:
    """``OdelmCLI``'s parser (built once, shared)."""
    return _PARSERS.get("train") or OdelmCLI(args=["--model.family", "ode_transformer"]).parser


def read_lightning(values: dict[str, Any]) -> RunConfig:
    """The ``RunConfig`` of a config mapping in either form, read as ``odelm train --config``
    reads a file of it (the parser's defaults under it; errors name keys as ``odelm train``
    does)."""
    return read_run_form(values, lightning_names=True)


def read_run_form(
    values: dict[str, Any], where: str = "config", *, lightning_names: bool = False
) -> RunConfig:
    """``experiments.training.config.parse_config``: a run-form mapping (Lightning-form keys
    read too) read by ``odelm train``'s parser; an error is one line naming the key as it
    was written (``where``: the file or grid entry it came from)."""
    for key in SECTIONS.keys() & values.keys():
        if not isinstance(values[key], dict):
            got = type(values[key]).__name__
            raise ConfigError(f"{where}.{key} must be a mapping, got {got}")
    try:
        cfg = cli_parser().parse_object(lightning_values(values))
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
            if key in RANGES and isinstance(value, (int, float)) and not isinstance(value, bool):
                check_range(key, value, spelled)  # raises: the value is out of range
        text = text.replace(f'"{wrong[1]}"', f'"{key}"')
    unknown = re.match(r"Option '(?:([\w.]+)\.)?(\w+)' is not accepted", text)
    if unknown and unknown[1]:  # a key of a section: name the section's keys
        text = f"Group '{unknown[1]}' does not accept option '{unknown[2]}'"
    text = text.replace("Group 'run'", "Group 'trainer'")
    return config_error(
        Exception(text), lambda key: f"{where}.{key}".rstrip("."), values, RunConfig
    )


def parse_train(argv: list[str]) -> OdelmCLI | int:
    """``odelm train``'s command line read by ``OdelmCLI``; an exit code where it ended
    there (``--help``, ``--print_config``)."""
    try:
        return OdelmCLI(args=list(argv))
    except SystemExit as done:
        return int(done.code or 0)


def main(argv: list[str]) -> int:
    """``odelm train ARGS``: read by ``OdelmCLI``, then trained (``cmd_train``)."""
    cli = parse_train(argv)
    return cli if isinstance(cli, int) else cmd_train(cli)


def cmd_train(cli: OdelmCLI) -> int:
    """Train the run ``cli`` read; print its result and where it went."""
    from experiments.training.runs import RESULT_FILE
    from experiments.training.train import train

    config, options = cli.run_config, cli.config
    if not options.get("verbose"):
        quiet_lightning()
    if options.get("quiet"):
        for name in ("pytorch_lightning", "lightning.pytorch"):  # whichever odelm chose
            logging.getLogger(name).setLevel(logging.ERROR)
        config.trainer.progress_bar = False
    done = config.run_dir / RESULT_FILE
    finished = done.is_file() and not options.get("overwrite")
    result = train(config, overwrite=bool(options.get("overwrite")))
    if result:
        print(json.dumps(result))
        if finished:
            date = datetime.fromtimestamp(done.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            print(f"{config.run_dir}: already finished, result from {date} (--overwrite retrains)")
        else:
            print(f"wrote {config.run_dir}")
    return 0
