"""``odelm train``: a ``LightningCLI`` subclass (``OdelmCLI``) of the Lightning package odelm
chose (``odelm.lightning``).

Its parser is Lightning's ``LightningArgumentParser`` with the run config's arguments, the
*Lightning form* (``experiments.training.run_parser``, whose own copy ``parse_config``
reads and ``odelm compare`` copies its options from), and the command's options.
``--help`` and ``--print_config`` are LightningCLI's. The CLI is built with ``run=False``
and no subcommands: ``instantiate_classes`` reads the parsed config into the engine's
``RunConfig`` (the hashed, canonical form) and ``cmd_train`` hands it to
``experiments.training.train.train``, which builds the Lightning objects, resumes, and
writes ``result.json`` and the model card.
"""

from __future__ import annotations

import importlib
import json
import logging
from argparse import ArgumentError
from datetime import datetime
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from experiments.cli.parser import HelpFormatter, epilog
from experiments.models.schema import model_keys_help, resolved_model_comment
from experiments.training.config import RunConfig
from experiments.training.run_parser import (
    add_config_arguments,
    add_core_arguments,
    add_own_arguments,
    add_seed_arguments,
    read_run_form,
)
from experiments.training.run_sections import COMMAND_KEYS, NO_MODEL, draw_seed, run_config
from experiments.training.runs import config_sha256
from experiments.training.threads import check_threads
from odelm.lightning import NAME, pl

_cli = importlib.import_module(f"{pl.__name__}.cli")  # not imported by the package
LightningCLI, LightningArgumentParser = _cli.LightningCLI, _cli.LightningArgumentParser

_PARSERS: dict[str, Any] = {}
"""``OdelmCLI``'s parser, once built (``OdelmCLI.setup_parser``)."""


class OdelmParser(LightningArgumentParser):
    """Lightning's parser; a printed config (``--print_config``) is checked as a run config
    first, and leaves out the command's own options."""

    def dump(self, cfg: Namespace, *args: Any, **kwargs: Any) -> str:
        cfg = cfg.clone()
        for key in COMMAND_KEYS:
            cfg.pop(key, None)
        config = named(run_config(cfg, print_only=True), cfg)
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
        add_config_arguments(parser)
        return parser

    def add_default_arguments_to_parser(self, parser: Any) -> None:
        """``seed_everything`` (also ``--seed``; ``true`` draws one)."""
        add_seed_arguments(parser)

    def add_core_arguments_to_parser(self, parser: Any) -> None:
        """``trainer`` (Lightning's ``Trainer``, the arguments the engine takes), ``model``
        and ``data``."""
        add_core_arguments(parser)

    def add_arguments_to_parser(self, parser: Any) -> None:
        """odelm's own sections and settings, the short flags and the command's options."""
        add_own_arguments(parser)
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
        from experiments.training.run_sections import WRITTEN

        WRITTEN.clear()  # this parse's --config files: errors name their keys as written
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
        self.run_config = named(run_config(self.config), self.config)
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
    return named(read_run_form(values, lightning_names=True), Namespace())


def named(config: RunConfig, cfg: Namespace) -> RunConfig:
    """``config`` with ``name: auto`` resolved: the last config file's name and the config's
    hash, a run folder per config (trying an override needs no ``--overwrite``)."""
    if config.name == "auto":
        paths = [p for p in (cfg.get("config") or []) if p is not None]
        stem = Path(str(paths[-1])).stem if paths else "train"
        config.name = f"{stem}-{config_sha256(config)[:10]}"
    return config


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
