"""``odelm``'s usage errors: jsonargparse's error on a command line as one line naming the
option (``usage_error``); ``odelm``'s ``main`` prints it as ``odelm: error: ...``, exit 2."""

from __future__ import annotations

import difflib
import re
from argparse import ArgumentError
from collections.abc import Sequence

from jsonargparse import ArgumentParser

from experiments.config_errors import ConfigError, type_name
from experiments.safe_yaml import parse_yaml
from experiments.training.config import lightning_key
from experiments.training.run_schema import key_range_check
from odelm.errors import OdelmError

RUN_COMMANDS = ("train", "compare")
"""The subcommands whose options are run-config keys (given options only, no defaults)."""


class UsageError(OdelmError, ValueError):
    """The command line names an unknown subcommand or option, or gives a wrong value."""


def _subparser(parser: ArgumentParser, path: list[str]) -> ArgumentParser:
    for name in path:
        commands = parser._subcommands_action
        parser = commands._name_parser_map[name] if commands else parser
    return parser


def usage_error(parser: ArgumentParser, argv: list[str], error: ArgumentError) -> UsageError:
    """jsonargparse's error as one line naming the option and the subcommand's help."""
    path: list[str] = []  # subcommands named, outermost first
    for arg in argv:
        commands = _subparser(parser, path)._subcommands_action
        if commands and arg in commands._name_parser_map:
            path.append(arg)
    sub = _subparser(parser, path)
    text, prog = str(error), sub.prog
    if text.startswith("unrecognized arguments: "):
        unknown = text.split()[2]
        renamed = lightning_key(unknown.removeprefix("--").partition("=")[0])
        if renamed is not None:  # one release: the Lightning form's spelling
            return UsageError(
                f"unknown option {unknown}: the Lightning form of odelm train is gone; write "
                f"--{renamed}"
            )
        keys = " (config keys as --section.key)" if " ".join(path) in RUN_COMMANDS else ""
        flags = [flag for action in sub._actions for flag in action.option_strings]
        close = difflib.get_close_matches(unknown.partition("=")[0], flags, n=1, cutoff=0.8)
        hint = f"did you mean {close[0]}? " if close else ""
        return UsageError(f"unknown option {unknown}; {hint}{prog} --help lists the options{keys}")
    if text.startswith("the following arguments are required: "):
        dest = text.split(": ", 1)[1].split(",")[0].removeprefix(".".join([*path, ""]))
        flag = _flag(sub, dest) or dest.upper()
        return UsageError(f"{prog} needs {flag}; see {prog} --help")
    wrong = re.match(r'Parser key "([^"]+)"', text)
    if wrong:
        key = wrong[1]
        restricted = re.search(r"Not of type \w+: (.*) does not conform to restriction v(.*)", text)
        action = next((a for a in sub._actions if a.dest == key), None)
        given = re.search(r"(?:Got|Given) value: (.*)", text)
        value = restricted[1] if restricted else given[1] if given else None
        flag = _flag(sub, key, argv) or f"--{key}"
        given_here = None  # the value given to flag on the command line (None: a config file's)
        for arg, after in zip(argv, [*argv[1:], None]):
            if arg == flag and after is not None:
                given_here = after
            elif arg.startswith(flag + "="):
                given_here = arg.split("=", 1)[1]
        try:
            number = parse_yaml(value or given_here or "")
        except ConfigError:
            number = None
        try:  # a run-config key out of its range: the config's own line, naming the option
            number = None if isinstance(number, list) else number
            key_range_check(key, number, key if given_here is None else flag)
        except ConfigError as out_of_range:
            return UsageError(str(out_of_range))
        if restricted:  # jsonargparse.typing's PositiveInt and the like
            return UsageError(f"{flag} must be {restricted[2]}, got {value}")
        expected = type_name(getattr(action, "_typehint", None) or getattr(action, "type", None))
        return UsageError(f"{flag} must be {expected}, got {value or given_here!r}")
    typed = re.match(r"argument ([-\w]+): (\1 .*)", text)
    if typed:  # a range type's own line (experiments.cli.values) names the option
        return UsageError(typed[2])
    if re.match(r'expected "[\w.]*command" to be one of', text) and sub._subcommands_action:
        names = ", ".join(sub._subcommands_action._name_parser_map)
        return UsageError(f"{prog} needs a subcommand, one of {names}; see {prog} --help")
    return UsageError(" ".join(text.split()))


def _flag(parser: ArgumentParser, dest: str, argv: Sequence[str] = ()) -> str | None:
    """The option of ``dest``: the one given in ``argv`` where an alias shares it."""
    flags = [a.option_strings[0] for a in parser._actions if a.dest == dest and a.option_strings]
    given = [f for f in flags if any(arg == f or arg.startswith(f + "=") for arg in argv)]
    return (given or flags or [None])[0]
