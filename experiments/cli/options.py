"""``odelm``'s parser (its help shows a ranged type by its range and keeps the examples'
lines), and the options of ``train`` and ``compare`` (the run config's,
``experiments.training.config``, and their own), ``eval`` and ``generate`` (value types:
``experiments.cli.values``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace

from experiments.cli import values
from experiments.cli.examples import KeepExamples, epilog
from experiments.comparison.launchers import add_launch_options
from experiments.config_errors import type_name
from experiments.models.schema import model_keys_help
from experiments.training.config import EvalConfig, add_run_arguments, descriptions, plain


class HelpFormatter(KeepExamples, DefaultHelpFormatter):
    """jsonargparse's formatter (a ranged type as its range), except that an option whose default
    is None and whose help says ``default: ...`` is shown as written; examples keep their lines."""

    def _get_help_string(self, action: Any) -> str:
        if action.default is None and "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

    def _get_type_str(self, action: Any) -> str | None:
        """A ranged type by its range (``int >=1 | None``), not its class name."""
        hint = getattr(action, "_typehint", None)
        args = typing.get_args(hint) or (hint,)
        args = typing.get_args(args[0]) or args if typing.get_origin(hint) is list else args
        if any(hasattr(arg, "_restrictions") for arg in args):
            return type_name(hint, short=True)
        return super()._get_type_str(action)  # type: ignore[no-any-return]


class Parser(ArgumentParser):
    """The parser of ``odelm`` and of every subcommand: errors raised (``main`` prints them as one
    line), jsonargparse's own ``--print_config`` off (``train`` and ``compare`` have their own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, exit_on_error=False, print_config=None, **kwargs)


PRINT_CONFIG = "print the resolved config as YAML and exit"
TRAIN_FLAGS = {
    "overwrite": "discard an existing run of this name (made with another config) and train afresh",
    "quiet": "no progress bar or Lightning chatter",
    "verbose": "show Lightning's hardware lines and tips",
    "print_config": PRINT_CONFIG,
}
"""``odelm train``'s own switches (the rest of its options are run-config keys)."""


def options_parser(prog: str, description: str) -> Parser:
    """The parser of a subcommand that takes run-config options (``train``, ``compare``)."""
    description += (
        " Defaults shown are the schema's: the config file's values replace them, and options "
        "given here replace both."
    )
    return Parser(prog=prog, description=description, epilog=epilog(prog.removeprefix("odelm ")))


def train_parser() -> Parser:
    """The options of ``odelm train``: the run config's parser's, and the command's."""
    parser = options_parser(
        "odelm train",
        "Train one model from YAML run configs (--config, repeatable: each file over the ones "
        "before) and/or options: any config key as --section.key VALUE (e.g. --optim.lr 1e-3 "
        "--trainer.max_steps 20 --trainer.max_time 00:05:00).",
    )
    parser.epilog = f"{parser.epilog}\n\n{model_keys_help()}"
    add_run_arguments(parser)
    for name, text in TRAIN_FLAGS.items():
        parser.add_argument(f"--{name}", action="store_true", help=text)
    return parser


def given_options(args: Namespace) -> dict[str, Any]:
    """The options of ``train`` or ``compare`` as a nested mapping (only those given: the
    config file's values lie under them); ``--model '{...}'`` stays a ``Replace``."""
    given = plain(args.as_dict())
    for section in [given, *given.values()]:  # a section read from a file (--trainer FILE)
        if isinstance(section, dict):
            section.pop("__path__", None)
    if "model" in given:
        given["model"] = args["model"]  # as_dict() copies it into a plain dict
    return given


def compare_parser() -> Parser:
    """The options of ``odelm compare``."""
    parser = options_parser(
        "odelm compare",
        "Train a grid of models on identical data, seeds and budget, then write tables and "
        "plots. Any shared config key may be overridden for every run as --section.key VALUE "
        "(e.g. --trainer.max_steps 200 --optim.lr 3e-4), spelled as odelm train and the grid "
        "files spell it; model keys given here (--model.KEY, --model '{...}') lie under each "
        "run's own model section, whose keys win.",
    )
    parser.add_argument("--grid", help="grid YAML file (give this or --preset)")
    parser.add_argument(
        "--preset", help="a grid shipped in experiments/configs/grids (give this or --grid)"
    )
    parser.add_argument("--out", help="output directory, resumable (needed unless --print_config)")
    parser.add_argument(
        "--seeds",
        type=int,
        help="train every model with N seeds: S..S+N-1, S being --seed, else the grid's "
        "first seed (null: the grid's seeds; results.md: mean ± sd, paired 95% intervals)",
    )
    add_launch_options(parser)
    parser.add_argument("--print_config", action="store_true", help=PRINT_CONFIG)
    add_run_arguments(parser, grid=True)
    return parser


def eval_parser() -> Parser:
    """The options of ``odelm eval``; its settings are the ``eval:`` section's keys."""
    parser = Parser()
    parser.add_argument("run", help="a run directory written by odelm train")
    parser.add_argument("--split", default="test", help="the split to score")
    hints, text = typing.get_type_hints(EvalConfig), descriptions(EvalConfig)
    for field in dataclasses.fields(EvalConfig):
        choices = typing.get_args(hints[field.name])  # decode's; a count's range: cmd_eval
        kind = {"choices": choices} if typing.get_origin(hints[field.name]) else {"type": int}
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            help=f"{text[field.name]} (default: the run's eval setting)",
            **kind,
        )
    parser.add_argument(
        "--allow-noncausal",
        action="store_true",
        help="score a model that sees the tokens it predicts (labelled as such)",
    )
    parser.add_argument(
        "--data-dir", help="where the run's corpus is now (default: where it was trained)"
    )
    parser.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="score splits that differ from those the run recorded (data_sha256)",
    )
    values.add_placement(parser, "the cores other work leaves free, printed", "scores")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    return parser


def generate_parser() -> Parser:
    """The options of ``odelm generate``; each sampling value has the range the library
    checks (``experiments.cli.values``)."""
    from odelm.decoding import MAX_NEW_TOKENS, MIN_TEMPERATURE, MIN_TOP_P, STRATEGIES

    parser = Parser()
    parser.add_argument("run", help="a run directory written by odelm train")
    parser.add_argument("--prompt", required=True, help="the text to continue (its words)")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=20,
        help=f"tokens to generate (at most {MAX_NEW_TOKENS}, and with --num-beams within "
        "odelm generate's budget of token positions and FLOPs, checked before it starts)",
    )
    parser.add_argument(
        "--strategy",
        default="greedy",
        choices=STRATEGIES,
        help="argmax, sampling (--temperature, --top-k, --top-p, --seed) or beam search",
    )
    parser.add_argument(
        "--num-beams",
        type=values.beams,
        default=4,
        help="beams of --strategy beam (at most what this machine's memory holds)",
    )
    parser.add_argument(
        "--temperature",
        type=values.temperature,
        default=1.0,
        help=f"sampling: divide the logits by it (at least {MIN_TEMPERATURE})",
    )
    parser.add_argument(
        "--top-k", type=int, help="sampling: keep the K likeliest tokens (default: all)"
    )
    parser.add_argument(
        "--top-p",
        type=values.top_p,
        help=f"sampling: keep the smallest set of tokens with probability >= P, P in "
        f"[{MIN_TOP_P}, 1] (default: all)",
    )
    parser.add_argument(
        "--seed",
        type=values.sampling_seed,
        default=0,
        help="seed of the sampling generator, 0..2**64-1",
    )
    parser.add_argument(
        "--stop-at-eos", action="store_true", help="stop at the first end of line (<eos>)"
    )
    values.add_placement(parser, "torch's choice", "beams")
    return parser
