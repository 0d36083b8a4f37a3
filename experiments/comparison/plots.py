"""Comparison plots from the runs' CSV logs: validation perplexity against step and wall
time (the selected checkpoint starred), test perplexity against parameters (only when the
counts differ), and forward NFE over training for continuous-depth models (one panel each,
so equal curves cannot hide one another).

With several seeds a model's line is the mean over seeds and its band spans the seeds'
minimum to maximum; the legend says so. Every model has its own colour, line style and
marker. Grammar-corpus plots draw the true grammar's perplexity: its expectation beside
validation curves, its value on the test split beside test perplexities.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from experiments.comparison.tables import group_by_model
from experiments.plotting import plain_log_ticks, plt, save_figure
from experiments.training.runs import result_depth
from odelm import files

LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">", "p", "d", "H", "8")
# Past tab10's ten colours (a study of 13 arms), Dark2's: no colour and marker pair repeats.
EXTRA_COLOURS = "Dark2"
# Parameter counts within this ratio of each other make a perplexity-vs-parameters plot
# meaningless (every point on one vertical line), so it is not drawn.
EQUAL_PARAMETERS_RATIO = 1.1
Series = list[tuple[float, float]]


def read_metrics(run_dir: Path) -> dict[str, Series]:
    """``metric -> [(step, value)]`` from a run's Lightning CSV log."""
    path = run_dir / "logs" / "metrics.csv"
    series: dict[str, Series] = {}
    if not path.is_file():
        return series
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in ("", None):
                    series.setdefault(key, []).append((float(row["step"]), float(value)))
    return series


def style(index: int) -> dict[str, Any]:
    """Colour, line style and marker of the ``index``-th model (all three differ)."""
    colour = plt.get_cmap("tab10")(index % 10) if index % 18 < 10 else None
    return {
        "color": colour or plt.get_cmap(EXTRA_COLOURS)(index % 18 - 10),
        "linestyle": LINE_STYLES[index % len(LINE_STYLES)],
        "marker": MARKERS[index % len(MARKERS)],
    }


def mean_band(curves: list[Series]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Steps every curve has, and the mean, minimum and maximum value at each."""
    steps = sorted(set.intersection(*(set(dict(c)) for c in curves))) if curves else []
    values = [[dict(c)[s] for c in curves] for s in steps]
    return (
        steps,
        [sum(v) / len(v) for v in values],
        [min(v) for v in values],
        [max(v) for v in values],
    )


def selected_step(result: dict[str, Any], val_ppl: Series) -> tuple[float, float]:
    """The validation point of the checkpoint a run was tested with (``val_ppl`` not empty)."""
    if result.get("selected") == "best validation":
        return min(val_ppl, key=lambda point: point[1])
    return val_ppl[-1]  # "last" or an average of the last validations: the final one


def grammar_references(results: list[dict[str, Any]]) -> dict[str, float] | None:
    """The true grammar's perplexity, expected and on the test split, when every run used
    the grammar corpus of one seed, or the grammar family's of one depth and seed (read
    from the protocol label)."""
    pattern = r"^grammar(?:-depth (\d))? .*seed (\d+)"
    found = {re.search(pattern, str(r.get("protocol", ""))) for r in results}
    if not results or None in found:
        return None
    keys = {m.groups() for m in found if m is not None}
    if len(keys) != 1:
        return None
    depth, seed = keys.pop()
    if depth is not None:
        from experiments.data.grammar_family import reference_perplexities as family

        return family(int(depth), int(seed))
    from experiments.data.grammar import reference_perplexities

    return reference_perplexities(int(seed))


def _label(name: str, runs: list[dict[str, Any]]) -> str:
    label = name if len(runs) == 1 else f"{name} (mean of {len(runs)} seeds)"
    if not all(r.get("is_causal", True) for r in runs):
        label += ", non-causal"
    return label


def _draw(
    axis: Any, index: int, label: str, curves: list[Series], xs: list[dict] | None = None
) -> None:
    """Mean line and min-max band over ``curves`` (step, value) at the steps every curve has;
    past the last of those (seeds stopped early at different steps), each longer seed goes on
    as a thin line of its own. ``xs`` maps each curve's steps to another x (wall time),
    averaged over seeds like the values."""
    steps, mean, low, high = mean_band(curves)
    if not steps:
        return
    x = steps if xs is None else [sum(x[s] for x in xs) / len(xs) for s in steps]
    axis.plot(x, mean, markersize=4, markevery=max(1, len(x) // 12), label=label, **style(index))
    if len(curves) > 1:
        axis.fill_between(x, low, high, color=style(index)["color"], alpha=0.18, linewidth=0)
    for number, curve in enumerate(curves):
        tail = [(step, value) for step, value in curve if step > steps[-1]]
        if tail:  # joined to the mean's last point, where this seed was still averaged
            tail_x = [x[-1], *(s if xs is None else xs[number][s] for s, _ in tail)]
            tail_y = [mean[-1], *(v for _, v in tail)]
            axis.plot(tail_x, tail_y, color=style(index)["color"], linewidth=0.8, alpha=0.6)


def plot_comparison(out_dir: Path, results: list[dict[str, Any]]) -> list[Path]:
    """Write the comparison PNGs into ``out_dir`` and return their paths."""
    groups = group_by_model(results)
    logs = {r["run"]: read_metrics(out_dir / "runs" / r["run"]) for r in results}
    protocol = "; ".join(sorted({str(r.get("protocol")) for r in results}))
    several = any(len(runs) > 1 for runs in groups.values())
    band_note = (
        "\nlines: mean over seeds (thin: one seed, after another stopped early); "
        "bands and error bars: min to max over seeds"
        if several
        else ""
    )
    references = grammar_references(results)
    written: list[Path] = []

    def save(figure: plt.Figure, name: str) -> None:
        figure.suptitle(protocol + band_note, fontsize=8)
        figure.tight_layout()
        save_figure(figure, out_dir / name)
        written.append(out_dir / name)

    for x_key, x_label, file_name in (
        ("step", "training step", "ppl_vs_step.png"),
        ("val/elapsed_s", "training wall time (s)", "ppl_vs_time.png"),
    ):
        figure, axis = plt.subplots(figsize=(10, 4.5))
        for index, (name, runs) in enumerate(groups.items()):
            logged = [(r, logs[r["run"]]) for r in runs]
            curves = [
                (r, _validation_curve(log, x_key), dict(log.get(x_key, []))) for r, log in logged
            ]
            curves = [(r, curve, x_map) for r, curve, x_map in curves if curve]
            xs = None if x_key == "step" else [x_map for _, _, x_map in curves]
            _draw(axis, index, _label(name, runs), [curve for _, curve, _ in curves], xs)
            for run, curve, x_map in curves:
                step, value = selected_step(run, curve)
                axis.plot(
                    step if xs is None else x_map[step],
                    value,
                    marker="*",
                    markersize=13,
                    color=style(index)["color"],
                    markeredgecolor="black",
                    linestyle="none",
                    zorder=5,
                )
        handles, _ = axis.get_legend_handles_labels()
        if not handles:  # no run validated (a budget shorter than val_every): no plot
            plt.close(figure)
            files.remove(out_dir / file_name)
            continue
        handles.append(_selected_handle(results))
        if references:
            handles.append(_reference_line(axis, references["expected"], "expected"))
        axis.set(xlabel=x_label, ylabel="validation perplexity", yscale="log")
        plain_log_ticks(axis)
        _legend_outside(axis, handles)
        save(figure, file_name)

    for key, label, file_name in COST_AXES:
        if _costs_differ(results, key):
            save(_cost_figure(groups, references, key, label), file_name)
        else:
            files.remove(out_dir / file_name)

    nfe = {n: [logs[r["run"]].get("train/nfe", []) for r in groups[n]] for n in continuous(groups)}
    nfe = {n: curves for n, curves in nfe.items() if any(curves)}
    if nfe:
        save(_nfe_figure(nfe, list(groups)), "nfe_vs_step.png")
    return written


def _legend_outside(axis: Any, handles: list[Any]) -> None:
    """The legend right of the axes, where it cannot cover a curve."""
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))


def _validation_curve(series: dict[str, Series], x_key: str) -> Series:
    """``(step, validation perplexity)`` at the steps that also log ``x_key``."""
    if x_key == "step":
        return series.get("val/ppl", [])
    logged = dict(series.get(x_key, []))
    return [(step, y) for step, y in series.get("val/ppl", []) if step in logged]


def _selected_handle(results: list[dict[str, Any]]) -> Line2D:
    how = " / ".join(sorted({str(r.get("selected", "last")) for r in results}))
    if len({r["seed"] for r in results}) > 1:
        how += ", one per seed"
    return Line2D(
        [],
        [],
        marker="*",
        markersize=11,
        color="grey",
        markeredgecolor="black",
        linestyle="none",
        label=f"selected checkpoint ({how})",
    )


def _reference_line(axis: Any, value: float, kind: str) -> Line2D:
    """A horizontal line at the true grammar's perplexity (``expected`` or ``test_split``)."""
    label = (
        f"grammar corpus: exp(expected entropy) = {value:.2f}\n(not a floor for a finite split)"
        if kind == "expected"
        else f"the true grammar's perplexity on this test split = {value:.2f}"
    )
    style_ = (0, (1, 3)) if kind == "expected" else (0, (6, 3))
    return axis.axhline(value, color="black", linewidth=0.8, linestyle=style_, label=label)


COST_AXES = (
    ("parameters", "parameters", "ppl_vs_params.png"),
    ("test_flops_per_token", "forward FLOPs per token", "ppl_vs_flops.png"),
)
"""The costs test perplexity is plotted against: (result key, axis label, file)."""


def _costs_differ(results: Iterable[dict[str, Any]], key: str) -> bool:
    counts = [r[key] for r in results if r.get(key)]
    return bool(counts) and max(counts) / min(counts) > EQUAL_PARAMETERS_RATIO


def _cost_figure(
    groups: dict[str, list[dict[str, Any]]],
    references: dict[str, float] | None,
    key: str,
    label: str,
) -> plt.Figure:
    """Test perplexity (mean, with the seeds' min-max as error bars) against a cost: the
    parameters, or the forward FLOPs per token (a model's mean over its seeds)."""
    groups = {name: runs for name, runs in groups.items() if all(r.get(key) for r in runs)}
    figure, axis = plt.subplots(figsize=(10, 4.5))
    counts = [sum(r[key] for r in runs) / len(runs) for runs in groups.values()]
    log_x = max(counts) / min(counts) > 10
    positions = _spread(counts, log_x)
    for index, (name, runs) in enumerate(groups.items()):
        values = [r["test_ppl"] for r in runs if math.isfinite(r.get("test_ppl") or math.nan)]
        if not values:
            continue
        mean = sum(values) / len(values)
        causal = all(r.get("is_causal", True) for r in runs)
        marker = style(index)["marker"] if causal else "x"
        error = [[mean - min(values)], [max(values) - mean]] if len(values) > 1 else None
        axis.errorbar(
            positions[index],
            mean,
            yerr=error,
            marker=marker,
            markersize=8,
            color=style(index)["color"],
            capsize=3,
            linestyle="none",
            label=_label(name, runs),
        )
    handles, _ = axis.get_legend_handles_labels()
    if not all(r.get("is_causal", True) for runs in groups.values() for r in runs):
        handles.append(
            Line2D(
                [],
                [],
                marker="x",
                color="grey",
                linestyle="none",
                label="x: non-causal model (sees the tokens it predicts; not an LM perplexity)",
            )
        )
    if references:
        handles.append(_reference_line(axis, references["test_split"], "test_split"))
    spread = len(set(positions)) > len(set(counts))
    xlabel = label + (" (models of equal count side by side)" if spread else "")
    axis.set(xlabel=xlabel, ylabel="test perplexity", yscale="log")
    if log_x:
        axis.set_xscale("log")
        plain_log_ticks(axis, "x")
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1e6:g}M"))
    plain_log_ticks(axis)
    _legend_outside(axis, handles)
    return figure


def _spread(counts: list[float], log: bool) -> list[float]:
    """x positions of the models: those within 1% of each other's parameter count side by
    side, 3% of the axis apart around their count, so no marker hides another."""
    span = math.log(max(counts) / min(counts)) if log else max(counts) - min(counts)
    positions = []
    for index, count in enumerate(counts):
        same = [i for i, other in enumerate(counts) if abs(other - count) <= 0.01 * count]
        offset = (same.index(index) - (len(same) - 1) / 2) * 0.03 * span
        positions.append(count * math.exp(offset) if log else count + offset)
    return positions


def continuous(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The continuous-depth models of ``groups`` (model -> its results), whose training NFE
    is drawn (``nfe_vs_step.png``)."""
    return [name for name, runs in groups.items() if result_depth(runs[0]) == "continuous depth"]


def _nfe_figure(nfe: dict[str, list[Series]], order: list[str]) -> plt.Figure:
    """One panel per continuous-depth model, sharing the y axis."""
    columns = min(3, len(nfe))
    rows = math.ceil(len(nfe) / columns)
    width = max(7.0, 3.6 * columns)  # at least the two-line title's width
    figure, axes = plt.subplots(
        rows, columns, figsize=(width, 3 * rows + 0.6), sharey=True, squeeze=False
    )
    for panel, (name, curves) in zip(axes.flat, nfe.items()):
        _draw(panel, order.index(name), name, [c for c in curves if c])
        panel.set_title(name if len(curves) == 1 else f"{name} (mean of {len(curves)})", fontsize=9)
        panel.set(xlabel="training step")
    for panel in axes[:, 0]:
        panel.set_ylabel("forward NFE per step")
    for panel in list(axes.flat)[len(nfe) :]:
        panel.set_visible(False)
    return figure
