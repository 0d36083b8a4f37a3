"""``odelm``'s parser (its help shows a ranged type by its range and keeps the examples'
lines), its ranged value types, and the options of ``train`` and ``compare`` (the run config's,
``experiments.training.config``, and their own), ``eval`` and ``generate``. A value type refuses
an odd value while the command line is parsed, in one line naming the option, its range and the
value; its range is the library's own, so a Python call and its command refuse the same values.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace
from jsonargparse.typing import PositiveInt

from experiments.cli.examples import KeepExamples, epilog
from experiments.comparison.launchers import add_launch_options
from experiments.config_errors import ConfigError, check_range, type_name
from experiments.models.schema import model_keys_help
from experiments.training.config import EvalConfig, add_run_arguments, descriptions, plain
from experiments.training.run_schema import Seed
from experiments.training.threads import check_threads
from odelm import decoding
from odelm.errors import OdelmError


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


class _Typed:
    """A parser type, ``name`` in ``--help``: ``convert``, then ``check``, each failure an
    ``ArgumentTypeError`` (argparse keeps its line) naming ``flag``."""

    def __init__(self, name: str, flag: str, convert: Callable[[Any], Any], check: Any) -> None:
        self.__name__, self.flag, self.convert, self.check = name, flag, convert, check

    def __repr__(self) -> str:
        return self.__name__

    def __call__(self, text: Any) -> Any:
        try:
            value = self.convert(text)
        except (TypeError, ValueError):
            kind = "an integer" if self.convert is _integer else "a number"
            raise ArgumentTypeError(f"{self.flag} must be {kind}, got {text!r}") from None
        try:
            self.check(value, self.flag)
        except OdelmError as error:
            raise ArgumentTypeError(str(error)) from None
        return value


def _integer(text: Any) -> int:
    if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
        raise ValueError(text)
    return int(text)


def _check_folder(value: str, flag: str) -> None:
    """An output folder, checked before any work: an existing file, a path under a file or
    a folder this process cannot write is refused (nothing is written to check)."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {value} is a file; it must be a folder (made when missing)")
    parent = path.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {value} lies under {parent}, a file; choose another folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {value}: {parent} cannot be written here; choose another folder")


threads = _Typed("threads", "--num-threads", _integer, check_threads)
"""``--num-threads``: torch CPU threads, 1..this machine's CPU count."""
temperature = _Typed("temperature", "--temperature", float, decoding.check_temperature)
"""``--temperature``: finite, at least [`MIN_TEMPERATURE`][odelm.decoding.MIN_TEMPERATURE]."""
top_p = _Typed("top_p", "--top-p", float, decoding.check_top_p)
"""``--top-p``: in ``[MIN_TOP_P, 1]``."""
sampling_seed = _Typed("seed", "--seed", _integer, decoding.check_seed)
"""``generate --seed``: a ``torch.Generator`` seed, 0..2**64-1."""
data_seed = _Typed("seed", "--seed", _integer, functools.partial(check_range, Seed))
"""``data info --seed``: the grammar corpus's seed, the config's ``data.seed`` range."""
beams = _Typed("beams", "--num-beams", _integer, functools.partial(check_range, PositiveInt))
"""``--num-beams``: at least 1 (its memory bound needs the model: checked once it loads)."""
folder = _Typed("folder", "--out", str, _check_folder)
"""``--out``: a folder, made when missing; an existing file is refused."""


def _device(text: Any) -> str:
    from experiments.evaluation.devices import DeviceError, resolve_device

    try:
        return str(resolve_device(str(text)))
    except DeviceError as error:
        raise ArgumentTypeError("--device" + str(error).removeprefix("device")) from None


device = _Typed("device", "--device", _device, lambda value, flag: None)
"""``--device``: ``cpu``, ``auto`` (resolved here), ``cuda`` or ``cuda:N`` where there is one."""


def add_placement(parser: Any, threads_default: str, invariant: str = "") -> None:
    """The options of a command that loads a trained run (eval, generate, discretize): where the
    model runs, on how many CPU threads; with ``invariant`` (what each sequence's own adaptive
    solve keeps batch-invariant), ``--no-batch-invariant``: one shared step size instead."""
    if invariant:
        parser.add_argument(
            "--no-batch-invariant",
            dest="batch_invariant",
            action="store_false",
            help="solve an adaptive model's batch with one shared step size, as the run's own "
            f"test evaluation did (default: each sequence its own steps, so {invariant} do not "
            "depend on the batch)",
        )
    parser.add_argument(
        "--num-threads",
        type=threads,
        help=f"torch CPU threads, 1..this machine's CPUs (default: {threads_default})",
    )
    parser.add_argument(
        "--device",
        type=device,
        default="cpu",
        help="where the model runs: cpu, auto (cuda when a GPU is visible, else cpu), cuda "
        "or cuda:N",
    )


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
    add_placement(parser, "the cores other work leaves free, printed", "scores")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    return parser


def generate_parser() -> Parser:
    """The options of ``odelm generate``; each sampling value has the range the library
    checks (its value types above)."""
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
        type=beams,
        default=4,
        help="beams of --strategy beam (at most what this machine's memory holds)",
    )
    parser.add_argument(
        "--temperature",
        type=temperature,
        default=1.0,
        help=f"sampling: divide the logits by it (at least {MIN_TEMPERATURE})",
    )
    parser.add_argument(
        "--top-k", type=int, help="sampling: keep the K likeliest tokens (default: all)"
    )
    parser.add_argument(
        "--top-p",
        type=top_p,
        help=f"sampling: keep the smallest set of tokens with probability >= P, P in "
        f"[{MIN_TOP_P}, 1] (default: all)",
    )
    parser.add_argument(
        "--seed", type=sampling_seed, default=0, help="seed of the sampling generator, 0..2**64-1"
    )
    parser.add_argument(
        "--stop-at-eos", action="store_true", help="stop at the first end of line (<eos>)"
    )
    add_placement(parser, "torch's choice", "beams")
    return parser
