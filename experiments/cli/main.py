"""``odelm``: the one command line of the library (also ``python -m experiments``).

One jsonargparse parser holds every subcommand (``data info`` and ``data download`` one
level down). ``train`` and ``compare`` keep only the options given on the command line (and
``train``'s config files), since the config's values lie under them; every other
subcommand gets its defaults.
A user error, on the command line or later, is one line ``odelm: error: ...``, exit 2.
"""

from __future__ import annotations

import sys
from argparse import ArgumentError
from collections.abc import Callable
from typing import Any

from jsonargparse import Namespace

from experiments.cli.examples import epilog
from experiments.cli.options import Parser
from experiments.cli.usage import RUN_COMMANDS, UsageError, _subparser, usage_error
from odelm.errors import OdelmError

__all__ = ["RUN_COMMANDS", "UsageError", "build_parser", "main", "parse", "usage_error"]

Handler = Callable[[Namespace], int]


def subcommands() -> dict[str, tuple[Callable[[], Parser], Handler, str]]:
    """Every subcommand (``"data info"`` one level down): its parser, handler and help."""
    from experiments.cli import bench, commands, eval_generate, options, tools

    return {
        "data info": (
            tools.data_info_parser,
            tools.cmd_data_info,
            "splits, words, tokens, vocabulary, checksums",
        ),
        "data download": (
            tools.data_download_parser,
            tools.cmd_data_download,
            "fetch and verify a corpus archive",
        ),
        "bench": (
            bench.bench_parser,
            bench.cmd_bench,
            "run a registered benchmark ('all' for every one)",
        ),
        "models": (
            tools.models_parser,
            tools.cmd_models,
            "every model: key of each family, with defaults",
        ),
        "train": (
            options.train_parser,
            commands.cmd_train,
            "train one model from a YAML config (--config) and/or --section.key options",
        ),
        "eval": (
            options.eval_parser,
            eval_generate.cmd_eval,
            "perplexity, per-word perplexity, BLEU, NFE of a run",
        ),
        "generate": (
            options.generate_parser,
            eval_generate.cmd_generate,
            "continue a prompt with a trained run",
        ),
        "compare": (
            options.compare_parser,
            commands.cmd_compare,
            "train a grid of models side by side (--grid or --preset, --out)",
        ),
        "verdicts": (
            tools.verdicts_parser,
            tools.cmd_verdicts,
            "the README's verdict table, rebuilt from the grids' results.csv",
        ),
        "discretize": (
            tools.discretize_parser,
            tools.cmd_discretize,
            "evaluate a trained vector field under many discretisations",
        ),
    }


def build_parser() -> Parser:
    """The parser of ``odelm`` and all its subcommands."""
    from odelm import __version__

    parser = Parser(
        prog="odelm",
        description="Continuous-depth language models: data, training, evaluation, generation, "
        "comparison grids and benchmarks (also `python -m experiments`).",
    )
    parser.add_argument("--version", action="version", version=f"odelm {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    groups = {"": parser.add_subcommands(dest="command", required=True)}
    for path, (make, _, text) in subcommands().items():
        group, _, name = path.rpartition(" ")
        if group and group not in groups:  # "data": a subcommand of subcommands
            holder = _add(groups[""], group, Parser(), "corpora: inspect and download")
            groups[group] = holder.add_subcommands(dest="command", required=True)
        _add(groups[group], name, make(), text)
    return parser


def _add(commands: Any, name: str, parser: Parser, text: str) -> Parser:
    commands.add_subcommand(name, parser, help=text)
    parser.prog = f"{commands.parent_parser.prog} {name}"  # not jsonargparse's "[options]"
    parser.epilog = parser.epilog or epilog(name)
    return parser


def parse(argv: list[str]) -> tuple[str, Namespace, bool]:
    """The subcommand (``"data info"``), its options and ``--debug``; a wrong command line
    raises ``UsageError``."""
    parser = build_parser()
    try:
        given = parser.parse_args(argv, defaults=False)
    except ArgumentError as error:
        raise usage_error(parser, argv, error) from None
    path = [given.command]
    while isinstance(given.get(f"{'.'.join(path)}.command"), str):
        path.append(given[f"{'.'.join(path)}.command"])
    options = given.get(".".join(path)) or Namespace()
    command = " ".join(path)
    if command not in RUN_COMMANDS:  # train and compare: their config file lies under
        defaults = _subparser(parser, path).get_defaults()
        for key, value in options.items():
            defaults[key] = value
        options = defaults
    return command, options, bool(given.get("debug"))


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A user error ([`OdelmError`][odelm.errors.OdelmError]) prints one line
    and returns 2; ``--debug`` shows its traceback. Anything else is a bug and keeps its
    traceback."""
    from experiments.cli.environment import check_environment

    debug = False
    try:
        debug = "--debug" in (sys.argv[1:] if argv is None else argv)[:1]
        check_environment()  # before Lightning is imported: it reads SLURM_PROCID on import
        command, options, debug = parse(sys.argv[1:] if argv is None else list(argv))
        return subcommands()[command][1](options)
    except UnicodeEncodeError as error:
        if debug or error.encoding.replace("-", "").lower() == "utf8":
            raise
        print(
            f"odelm: error: the output holds {error.object[error.start : error.end]!r}, which "
            f"the output's encoding {error.encoding} cannot show (PYTHONIOENCODING or the "
            "locale); set PYTHONIOENCODING=utf-8",
            file=sys.stderr,
        )
        return 2
    except OdelmError as error:
        if debug:
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        if isinstance(error, OSError) and error.strerror:
            message = error.strerror
        print(f"odelm: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
