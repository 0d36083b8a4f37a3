"""Matplotlib set up for files (the ``Agg`` backend, no display) and the axis helpers every
plot of the harness shares; a leaf that any sub-package may import."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from odelm import files

__all__ = ["plain_log_ticks", "plt", "save_figure"]


def save_figure(figure: Any, path: str | os.PathLike[str], dpi: int = 120) -> None:
    """Write ``figure`` to ``path`` (its format from the suffix) atomically, by the rule of
    ``odelm.files`` (a link at ``path`` is replaced, never written through), and close it."""
    with files.atomic_write(path) as partial:
        figure.savefig(partial, format=Path(path).suffix.lstrip("."), dpi=dpi)
    plt.close(figure)


def plain_log_ticks(axis: Any, which: str = "y") -> None:
    """Plain-number ticks (``20``, ``50``, ``100``) on a log axis, never ``2x10^1``."""
    low, high = axis.get_ylim() if which == "y" else axis.get_xlim()
    ticks: list[float] = []
    if high / low < 4:
        ticks = [t for t in MaxNLocator(5).tick_values(low, high) if low <= t <= high]
    else:
        for mantissas in ((1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,)):
            ticks = [
                m * 10**k
                for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                for m in mantissas
                if low <= m * 10**k <= high
            ]
            if len(ticks) <= 8:
                break
    target = axis.yaxis if which == "y" else axis.xaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_locator(NullLocator())
