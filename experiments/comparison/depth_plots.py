"""Excess loss against the grammar's depth D: one line per arm across the grammar-family
grids' ``results.csv`` files (e.g. ``study-grammar-d1`` and ``study-grammar-d3``).

Each run's depth is read from its ``protocol`` label (``grammar-depth 3 (...)``); a point is
an arm's mean test excess loss over its seeds at that depth, its bar the 95% Student-t
interval of the mean (none with one seed). An arm that ran at one depth only is a single
marker. The ``seed-noise`` row is the baseline again (an A/A control, not a design) and is
left out. Usage::

    from experiments.comparison.depth_plots import write_excess_depth
    write_excess_depth(["runs/g1/results.csv", "runs/g3/results.csv"], "excess_vs_depth.png")
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from experiments.comparison.plots import style
from experiments.comparison.stats import summarize, t_quantile_975
from experiments.plotting import plain_log_ticks, plt, save_figure

SEED_NOISE = "seed-noise"
_DEPTH = re.compile(r"^grammar-depth (\d+)\b")


def depth_of(protocol: str) -> int | None:
    """The grammar family's depth named by a protocol label (None: another corpus)."""
    found = _DEPTH.match(protocol or "")
    return int(found.group(1)) if found else None


def excess_by_depth(rows: Iterable[dict[str, Any]]) -> dict[str, dict[int, list[float]]]:
    """``arm -> depth -> [test excess of each seed]`` from ``results.csv`` rows, in the
    order the arms first appear; rows without a depth or an excess are skipped."""
    table: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        depth, value = depth_of(str(row.get("protocol", ""))), row.get("test_excess_nll_per_token")
        if row.get("name") == SEED_NOISE or depth is None or value in (None, ""):
            continue
        table.setdefault(str(row["name"]), {}).setdefault(depth, []).append(float(value))
    return table


def read_rows(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Every row of the ``results.csv`` files, in order."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        with Path(path).open() as handle:
            rows.extend(csv.DictReader(handle))
    return rows


def excess_depth_figure(table: dict[str, dict[int, list[float]]]) -> Any:
    """Mean test excess against depth, one line per arm with 95% intervals of the mean."""
    figure, axis = plt.subplots(figsize=(8.5, 4.8))
    depths = sorted({depth for by_depth in table.values() for depth in by_depth})
    span = 0.12 * (max(depths) - min(depths) if len(depths) > 1 else 1.0)
    for index, (name, by_depth) in enumerate(table.items()):
        xs, means, errors = [], [], []
        offset = span * (index / max(1, len(table) - 1) - 0.5)  # arms side by side at each D
        for depth in sorted(by_depth):
            summary = summarize(by_depth[depth])
            if summary.n == 0 or summary.mean <= 0:
                continue  # log axis: an excess at or below 0 is the split's noise
            half = (
                t_quantile_975(summary.n - 1) * summary.sd / math.sqrt(summary.n)
                if summary.sd
                else 0.0
            )
            xs.append(depth + offset)
            means.append(summary.mean)
            errors.append(min(half, 0.95 * summary.mean))  # a bar never reaches 0 on a log axis
        if not xs:
            continue
        seeds = max(len(v) for v in by_depth.values())
        label = name if seeds == 1 else f"{name} (mean of {seeds} seeds)"
        axis.errorbar(xs, means, yerr=errors, capsize=3, markersize=5, label=label, **style(index))
    axis.set_xticks(depths)
    axis.set_xticklabels([f"D = {depth}" for depth in depths])
    axis.set_xlabel("grammar depth D (relative clauses nested D deep)")
    axis.set_ylabel("test excess loss over the true grammar (nats/token)")
    axis.set_yscale("log")
    if axis.has_data():
        plain_log_ticks(axis)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    axis.set_title(
        "Excess loss against the depth the task needs (bars: 95% t-interval of the mean)",
        fontsize=9,
    )
    figure.tight_layout()
    return figure


def write_excess_depth(
    paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str]
) -> Path | None:
    """``out`` (a PNG) from the grids' ``results.csv`` files; None when no row has a depth."""
    table = excess_by_depth(read_rows(paths))
    if not table:
        return None
    save_figure(excess_depth_figure(table), out)
    return Path(out)
