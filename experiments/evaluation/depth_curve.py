"""``odelm discretize RUN --plot``: test perplexity (a grammar-family run: excess loss)
against NFE per token, depth chosen at test time.

The trained fields are evaluated as trained, on the grids and tolerances ``discretize``
already runs, and past the training depth: the trained grid's method at 2x and 4x the
training steps over the same depth ``[0, S]`` (a finer solve of the same flow), and, for an
autonomous field on a grid (``time_conditioning: none``, the looped block among them), the
same step size over ``2S`` and ``4S`` (more loops: the looped reading of more depth). A
model trained adaptively has as its training steps the mean accepted steps per block at
its tolerance; its 2x and 4x are RK4 grids of that many steps.

Every evaluation of ``F`` processes every token once, so the NFE of a forward pass (summed
over blocks) is the NFE per token.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

from neuralode_lm.depth_field import FixedGrid
from neuralode_lm.transformer import NODETransformerLM
from odelm import files

FACTORS = (2, 4)
"""Extrapolation past the training depth: these multiples of the training steps."""


def training_steps(model: NODETransformerLM, tokens: Any) -> int:
    """Steps per block of the model's own integration: a grid's, or the mean accepted steps
    per block of an adaptive solve on ``tokens`` (rounded up)."""
    if isinstance(model.integration, FixedGrid):
        return model.integration.steps
    model.final_state(tokens)
    return max(1, math.ceil(model.solver_stats.accepted_steps / len(model.fields)))


def extrapolation(
    model: NODETransformerLM, steps: int
) -> list[tuple[str, str, FixedGrid, float | None]]:
    """``(method, setting, grid, depth)`` past the training depth: the trained grid's method
    (RK4 after an adaptive solve) at ``FACTORS`` x ``steps`` over ``[0, S]`` (``depth``
    None), and for an autonomous field on a grid the same step size over ``FACTORS`` x S."""
    trained = model.integration
    method = trained.method if isinstance(trained, FixedGrid) else "rk4"
    rows = [
        (method, f"{k}x training steps ({k * steps})", FixedGrid(method, k * steps), None)
        for k in FACTORS
    ]
    if isinstance(trained, FixedGrid) and model.config.time_conditioning == "none":
        length = model.integration_time
        rows += [
            (f"{method}, depth kS", f"{k}x depth ({k * length:g}, {k * steps} steps)", grid, k)
            for k in FACTORS
            for grid in [FixedGrid(method, k * steps)]
        ]
    return rows


def trained_label(model: NODETransformerLM) -> str:
    """The model's own integration, as a table's method column names it."""
    trained = model.integration
    if isinstance(trained, FixedGrid):
        return f"{trained.method} {trained.steps} step{'s' * (trained.steps > 1)} (as trained)"
    return f"{trained.method} rtol {trained.rtol:.0e} (as trained)"


def metric(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """The rows' key the plots read and its axis label: the excess loss over the true
    grammar for a grammar-family run (``excess``), else the test perplexity."""
    if "excess" in rows[0]:
        return "excess", "test excess loss over the true grammar (nats/token)"
    return "ppl", "test perplexity"


def curve_points(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The plotted data: ``series`` (method -> sorted ``[nfe, value]``, the value
    ``metric``'s), the ``training`` point, the ``extrapolation`` points by factor (``"2x"``,
    ``"4x"``; depth ``"2S"``...) and the ``metric``."""
    key, label = metric(rows)
    points = [r for r in rows if r.get(key) is not None and r.get("role") is None]
    series: dict[str, list[list[float]]] = {}
    for row in points:
        series.setdefault(row["method"], []).append([row["nfe"], row[key]])
    training = next(([r["nfe"], r[key]] for r in rows if r.get("role") == "trained"), None)
    extra = {r["role"]: [r["nfe"], r[key]] for r in rows if r.get("role", "").endswith(("x", "S"))}
    return {
        "series": {k: sorted(v) for k, v in series.items()},
        "training": training,
        "extrapolation": extra,
        "metric": [key, label],
    }


def plot_depth(points: dict[str, Any], path: Path, title: str) -> None:
    """Test perplexity (or excess loss: ``points["metric"]``) against NFE per token
    (``points``: ``curve_points``, or the ``depth.json`` it wrote), one line per method,
    the training depth marked (a star and a dotted line) and the 2x/4x extrapolation
    ringed; writes ``path`` (PNG) and ``path`` with ``.json`` (the points)."""
    from matplotlib.ticker import FuncFormatter

    from experiments.plotting import plain_log_ticks, plt, save_figure

    figure, axes = plt.subplots(figsize=(9.5, 4.8))
    for method, xy in points["series"].items():
        axes.plot(*zip(*xy), marker="o", markersize=4, label=method)
    training = points["training"]
    if training is not None:
        axes.axvline(training[0], color="grey", linestyle=":", linewidth=1)
        axes.plot(*training, marker="*", markersize=14, color="black", linestyle="none")
        axes.plot([], [], marker="*", color="black", linestyle="none",
                  label=f"as trained (training depth: NFE {training[0]:g})")  # fmt: skip
    extra = points["extrapolation"]
    for kind, style, label in (
        ("x", "--", "past training: 2x, 4x the steps over [0, S]"),
        ("S", "-.", "past training: same steps over 2S, 4S (more loops)"),
    ):
        chosen = [(name, xy) for name, xy in extra.items() if name.endswith(kind)]
        if not chosen:
            continue
        line = ([training] if training is not None else []) + [xy for _, xy in chosen]
        axes.plot(*zip(*line), linestyle=style, color="black", linewidth=1, label=label)
        for name, (nfe, ppl) in chosen:
            axes.plot([nfe], [ppl], marker="o", markersize=10, fillstyle="none", color="red")
            text = f"{name} steps" if kind == "x" else name
            axes.annotate(text, (nfe, ppl), textcoords="offset points", xytext=(6, 4), fontsize=8)
    key, label = points.get("metric", metric([{}]))  # a depth.json from before: perplexity
    axes.set_xscale("log")
    if key == "ppl":  # perplexity is exp(loss): equal ratios, equal heights
        axes.set_yscale("log")
        plain_log_ticks(axes, "y")
    else:  # an excess near 0 matters, and on a sample of sentences it may be below 0:
        axes.set_yscale("symlog", linthresh=0.01)  # linear within +-0.01, log beyond
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.axhline(0.0, color="grey", linewidth=0.8)
        values = [y for xy in points["series"].values() for _, y in xy]
        values += [y for _, y in extra.values()]
        top = max(values)  # headroom above the highest point, for its ring and its label
        axes.set_ylim(bottom=min(0.0, *values) - 0.002, top=top * 2 if top > 0.01 else top + 0.01)
    axes.set_xlabel("NFE per token (evaluations of F, all blocks)")
    axes.set_ylabel(label)
    axes.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=8)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # never on a point
    figure.tight_layout()
    save_figure(figure, path)
    files.write_text(path.with_suffix(".json"), json.dumps(points, indent=1))
