"""The parser class of ``odelm`` and its subcommands, and its help formatter (ranged types
by their range; each subcommand's examples, ``experiments.cli.examples``, kept line by
line)."""

from __future__ import annotations

import typing
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter

from experiments.cli.examples import KeepExamples
from experiments.config_errors import type_name


class HelpFormatter(KeepExamples, DefaultHelpFormatter):
    """jsonargparse's formatter (type and default after each help line; a ranged type as its
    range), except that an option whose default is None and whose help says what happens without it (e.g.
    "default: the config's") is shown as written; a subcommand's examples keep their lines."""

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
    """The parser of ``odelm`` and of every subcommand: errors raised (``odelm``'s ``main``
    prints them as one line), jsonargparse's own ``--print_config`` off (``compare`` has its
    own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, exit_on_error=False, print_config=None, **kwargs)
