"""Command-line value types with a range: each refuses an odd value while the command line
is parsed, before anything loads, in one line naming the option, its range and the value
(``--temperature = 1e-320 is out of range; it must be ...``). The ranges are the library's
own ([`odelm.decoding`][odelm.decoding]'s, ``experiments.training.run_schema``'s), so a
Python call and its command refuse the same values.
"""

from __future__ import annotations

import functools
import os
from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse.typing import PositiveInt

from experiments.config_errors import ConfigError, check_range
from experiments.training.run_schema import Seed
from experiments.training.threads import check_threads
from odelm import decoding
from odelm.errors import OdelmError


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
