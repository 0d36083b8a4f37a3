"""``odelm``: the one command line of the library (also ``python -m experiments``).

One jsonargparse parser holds every subcommand (``data info`` and ``data download`` one
level down). ``train`` and ``compare`` keep only the options given on the command line,
since their config file's values lie under them; every other subcommand gets its defaults.
A user error, on the command line or later, is one line ``odelm: error: ...``, exit 2.
"""

from __future__ import annotations

import re
import sys
from argparse import ArgumentError
from collections.abc import Callable
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from experiments.cli.parser import Parser, epilog
from experiments.config_errors import config_error, key_type, type_name
from experiments.training.config import RunConfig
from odelm.errors import OdelmError

RUN_COMMANDS = ("train", "compare")
"""The subcommands whose options are run-config keys (``compare``: given options only, no
defaults; ``train``: its LightningCLI's)."""


class UsageError(OdelmError, ValueError):
    """The command line names an unknown subcommand or option, or gives a wrong value."""


Handler = Callable[[Namespace], int]


def subcommands() -> dict[str, tuple[Callable[[], Parser], Handler, str]]:
    """Every subcommand (``"data info"`` one level down): its parser, handler and help."""
    from experiments.cli import bench, commands, lightning_cli, tools, trained
    from experiments.evaluation import discretize

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
            Parser,  # odelm train's own parser is its LightningCLI's (parse hands it over)
            lightning_cli.main,
            "train one model from a YAML config (--config) and/or --section.key options",
        ),
        "eval": (
            trained.eval_parser,
            trained.cmd_eval,
            "perplexity, per-word perplexity, BLEU, NFE of a run",
        ),
        "generate": (
            trained.generate_parser,
            trained.cmd_generate,
            "continue a prompt with a trained run",
        ),
        "compare": (
            commands.compare_parser,
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
            discretize.cmd_discretize,
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
    raises ``UsageError``. ``train`` gets its command line as it is: its LightningCLI reads
    it."""
    head = 0
    while argv[head : head + 1] == ["--debug"]:
        head += 1
    if argv[head : head + 1] == ["train"]:  # a LightningCLI (experiments.cli.lightning_cli)
        return "train", argv[head + 1 :], head > 0  # type: ignore[return-value]
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


def _subparser(parser: ArgumentParser, path: list[str]) -> ArgumentParser:
    for name in path:
        commands = parser._subcommands_action
        parser = commands._name_parser_map[name] if commands else parser
    return parser


def usage_error(
    parser: ArgumentParser, argv: list[str], error: ArgumentError, command: str | None = None
) -> UsageError:
    """jsonargparse's error as one line naming the option and the subcommand's help
    (``command``: the subcommand whose own parser ``parser`` is, e.g. ``train``'s
    LightningCLI)."""
    path: list[str] = [] if command is None else [command]  # subcommands named, outermost first
    for arg in argv if command is None else ():
        commands = _subparser(parser, path)._subcommands_action
        if commands and arg in commands._name_parser_map:
            path.append(arg)
    sub = _subparser(parser, path) if command is None else parser
    text, prog = str(error), sub.prog
    if text.startswith("unrecognized arguments: "):
        unknown = text.split()[2]
        keys = " (config keys as --section.key)" if " ".join(path) in RUN_COMMANDS else ""
        return UsageError(f"unknown option {unknown}; {prog} --help lists the options{keys}")
    if text.startswith("the following arguments are required: "):
        dest = text.split(": ", 1)[1].split(",")[0].removeprefix(".".join([*path, ""]))
        flag = _flag(sub, dest) or dest.upper()
        return UsageError(f"{prog} needs {flag}; see {prog} --help")
    wrong = re.match(r'Parser key "([^"]+)"', text)
    if wrong:
        key = wrong[1]
        if " ".join(path) == "compare" and _is_config_key(key):
            return config_error(error, lambda key: f"--{key}", {}, RunConfig)  # type: ignore[return-value]
        action = next((a for a in sub._actions if a.dest == key), None)
        restricted = re.search(r"Not of type \w+: (.*) does not conform to restriction v(.*)", text)
        if restricted:  # jsonargparse.typing's PositiveInt and the like
            return UsageError(f"{_flag(sub, key)} must be {restricted[2]}, got {restricted[1]}")
        given = re.search(r"(?:Got|Given) value: (.*)", text)
        expected = type_name(getattr(action, "_typehint", None) or getattr(action, "type", None))
        flag = _flag(sub, key) or f"--{key}"
        value = given[1] if given else _given(argv, flag)
        return UsageError(f"{flag} must be {expected}, got {value!r}")
    typed = re.match(r"argument ([-\w]+): (\1 .*)", text)
    if typed:  # a range type's own line (experiments.cli.values) names the option
        return UsageError(typed[2])
    if re.match(r'expected "[\w.]*command" to be one of', text) and sub._subcommands_action:
        names = ", ".join(sub._subcommands_action._name_parser_map)
        return UsageError(f"{prog} needs a subcommand, one of {names}; see {prog} --help")
    return UsageError(" ".join(text.split()))


def _given(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` on the command line (its last, as parsing keeps)."""
    value = None
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _flag(parser: ArgumentParser, dest: str) -> str | None:
    flags = [a.option_strings[0] for a in parser._actions if a.dest == dest and a.option_strings]
    return flags[0] if flags else None


def _is_config_key(key: str) -> bool:
    try:
        key_type(RunConfig, key)
    except KeyError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A user error ([`OdelmError`][odelm.errors.OdelmError]) prints one line
    and returns 2; ``--debug`` shows its traceback. Anything else is a bug and keeps its
    traceback."""
    debug = False
    try:
        command, options, debug = parse(sys.argv[1:] if argv is None else list(argv))
        return subcommands()[command][1](options)
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
