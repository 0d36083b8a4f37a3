"""The parser class of ``odelm`` and its subcommands, and the examples at the end of every
subcommand's ``--help``: commands that run as written
from the repository root once the README's main job has made ``runs/quick``
(tests/test_examples.py runs every one, training ones with a tiny budget)."""

from __future__ import annotations

import typing
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter

from experiments.config_errors import type_name

EXAMPLES: dict[str, tuple[str, ...]] = {
    "train": (
        (
            "odelm train --model.family ode_transformer --model.block rk4 --corpus grammar "
            "--trainer.max_time 00:05:00 --name flags-rk4"
        ),
        "odelm train --config experiments/configs/example.yaml",
        "odelm train --config experiments/configs/example.yaml --optim.lr 3e-4 --name auto",
        (
            "odelm train --config experiments/configs/example.yaml --corpus grammar --seed 1 "
            "--model.block rk4 --name example-rk4"
        ),
        (
            "odelm train --config experiments/configs/example.yaml --name example-lstm "
            "--model '{family: neuralode_lm, name: lstm, embed_dim: 64, hidden_dim: 64}'"
        ),
        "odelm train --config experiments/configs/example.yaml --print_config",
    ),
    "compare": (
        "odelm compare --preset quick --out runs/quick",
        "odelm compare --preset table5-seeds --out runs/table5 --corpus ptb --print_config",
    ),
    "eval": (
        "odelm eval runs/quick/runs/rk4",
        "odelm eval runs/quick/runs/rk4 --split valid --json --num-threads 1",
    ),
    "generate": (
        "odelm generate runs/quick/runs/rk4 --prompt 'this dog'",
        "odelm generate runs/quick/runs/rk4 --prompt 'this dog' --strategy sample --top-k 10",
    ),
    "data": (
        "odelm data info --corpus grammar",
        "odelm data info --corpus grammar --protocol mini --json",
    ),
    "models": ("odelm models", "odelm models --json"),
    "bench": ("odelm bench corpus-load", "odelm bench corpus-load --json --num-threads 1"),
    "discretize": (
        "odelm discretize runs/quick/runs/rk4 --max-batches 1 --eval-batch-size 2 --steps 1 2",
    ),
}
"""Each subcommand's examples, shown in its ``--help`` under "examples:"."""


def epilog(command: str) -> str | None:
    """The "examples:" block of a subcommand's help (None for one without examples)."""
    lines = EXAMPLES.get(command)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


class KeepExamples:
    """A help-formatter mixin that prints the "examples:" block line by line, unwrapped,
    so each example can be copied (argparse would join and rewrap its lines)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:\n"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)  # type: ignore[misc]


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
