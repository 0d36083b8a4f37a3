"""Comparison plots from the runs' CSV logs: perplexity against step and wall time,
perplexity against parameters, and NFE over training for continuous-depth models."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_metrics(run_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """``metric -> [(step, value)]`` from a run's Lightning CSV log."""
    path = run_dir / "logs" / "metrics.csv"
    series: dict[str, list[tuple[float, float]]] = {}
    if not path.is_file():
        return series
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in ("", None):
                    series.setdefault(key, []).append((float(row["step"]), float(value)))
    return series


def _paired(
    series: dict[str, list[tuple[float, float]]], x_key: str, y_key: str
) -> list[tuple[float, float]]:
    xs = dict(series.get(x_key, []))
    return [(xs[step], y) for step, y in series.get(y_key, []) if step in xs]


def plot_comparison(out_dir: Path, names: list[str], results: list[dict[str, Any]]) -> list[Path]:
    """Write the comparison PNGs into ``out_dir`` and return their paths."""
    logs = {name: read_metrics(out_dir / "runs" / name) for name in names}
    protocol = "; ".join(sorted({str(r.get("protocol")) for r in results}))
    written = []

    def save(figure: plt.Figure, name: str) -> None:
        figure.suptitle(protocol, fontsize=8)
        figure.tight_layout()
        figure.savefig(out_dir / name, dpi=120)
        plt.close(figure)
        written.append(out_dir / name)

    for x_key, x_label, file_name in (
        ("step", "training step", "ppl_vs_step.png"),
        ("val/elapsed_s", "training wall time (s)", "ppl_vs_time.png"),
    ):
        figure, axis = plt.subplots(figsize=(6, 4))
        for name, series in logs.items():
            points = (
                series.get("val/ppl", []) if x_key == "step" else _paired(series, x_key, "val/ppl")
            )
            if points:
                axis.plot(*zip(*points), marker="o", markersize=3, label=name)
        axis.set(xlabel=x_label, ylabel="validation perplexity", yscale="log")
        axis.legend(fontsize=7)
        save(figure, file_name)

    figure, axis = plt.subplots(figsize=(6, 4))
    for result in results:
        if result.get("test_ppl") and math.isfinite(result["test_ppl"]):
            marker = "o" if result.get("is_causal", True) else "x"
            axis.scatter(result["parameters"], result["test_ppl"], marker=marker)
            axis.annotate(result["name"], (result["parameters"], result["test_ppl"]), fontsize=7)
    axis.set(xlabel="parameters", ylabel="test perplexity", xscale="log", yscale="log")
    save(figure, "ppl_vs_params.png")

    continuous = {r["name"] for r in results if r.get("family") == "continuous depth"}
    ode_runs = {
        n: s["train/nfe"] for n, s in logs.items() if n in continuous and s.get("train/nfe")
    }
    if ode_runs:
        figure, axis = plt.subplots(figsize=(6, 4))
        for name, points in ode_runs.items():
            axis.plot(*zip(*points), label=name)
        axis.set(xlabel="training step", ylabel="forward NFE per step")
        axis.legend(fontsize=7)
        save(figure, "nfe_vs_step.png")
    return written
