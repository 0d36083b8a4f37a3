"""Equal training compute: validation perplexity against cumulative training FLOPs and wall
time for every model on one figure (``ppl_vs_compute.png``), and the training FLOPs each
model needs to reach the baseline's best validation perplexity (``compute.md``).

Training FLOPs of a step are 3 x forward FLOPs per token (forward and backward) x tokens
per step (``data.batch_size`` x ``data.bptt`` windows, read from the run's ``config.yaml``);
forward FLOPs per token are the run's measured ``test_flops_per_token``, so for an
adaptive ODE solver whose NFE changes over training the figure uses its test-time cost.
Sentence batches have no fixed token count per step: their runs are left out (said so).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from experiments.comparison.plots import _draw, read_metrics
from experiments.comparison.tables import group_by_model
from experiments.plotting import plain_log_ticks, plt, save_figure
from experiments.training.yamlfiles import parse_yaml, read_yaml_text
from odelm import files


def step_flops(run_dir: Path, result: dict[str, Any]) -> float | None:
    """Training FLOPs of one optimizer step of the run (None where not defined)."""
    forward = result.get("test_flops_per_token")
    path = run_dir / "config.yaml"
    if not isinstance(forward, (int, float)) or not forward or not path.is_file():
        return None
    data = (parse_yaml(read_yaml_text(path), str(path)) or {}).get("data", {})
    if data.get("batching", "stream") != "stream":
        return None
    return 3.0 * forward * data.get("batch_size", 0) * data.get("bptt", 0) or None


def compute_curves(
    out_dir: Path, results: list[dict[str, Any]]
) -> dict[str, list[tuple[list[tuple[float, float]], float]]]:
    """Per model, each seed's validation curve (step, perplexity) and its FLOPs per step."""
    curves: dict[str, list[tuple[list[tuple[float, float]], float]]] = {}
    for name, runs in group_by_model(results).items():
        for run in runs:
            run_dir = out_dir / "runs" / run["run"]
            flops = step_flops(run_dir, run)
            curve = read_metrics(run_dir).get("val/ppl", [])
            if flops and curve:
                curves.setdefault(name, []).append((curve, flops))
    return curves


def flops_to_target(
    curves: dict[str, list[tuple[list[tuple[float, float]], float]]], baseline: str
) -> tuple[float, dict[str, tuple[float | None, int, int]]]:
    """The baseline's best validation perplexity (mean over its seeds) and, per model, the
    mean training FLOPs its seeds needed to reach it, with how many of how many did."""
    best = [min(v for _, v in curve) for curve, _ in curves.get(baseline, [])]
    target = sum(best) / len(best) if best else math.nan
    reached: dict[str, tuple[float | None, int, int]] = {}
    for name, seeds in curves.items():
        hits = [
            next((step * flops for step, v in curve if v <= target), None) for curve, flops in seeds
        ]
        found = [h for h in hits if h is not None]
        reached[name] = (sum(found) / len(found) if found else None, len(found), len(hits))
    return target, reached


def write_compute(out_dir: Path, results: list[dict[str, Any]], baseline: str) -> list[Path]:
    """``ppl_vs_compute.png`` and ``compute.md``; nothing when no run has a FLOPs curve."""
    curves = compute_curves(out_dir, results)
    if not curves:
        return []
    target, reached = flops_to_target(curves, baseline)
    lines = [
        (
            f"Training FLOPs to reach {baseline}'s best validation perplexity "
            f"({target:.2f}, mean over its seeds): 3 x forward FLOPs/token x tokens per step x "
            "steps, at the first validation at or below it."
        ),
        "",
        "| model | training FLOPs to the target (mean over seeds that reach it) | seeds that reach it |",
        "|---|---|---|",
    ]
    for name, (flops, hits, total) in reached.items():
        cell = f"{flops:.3g}" if flops is not None else "never within the budget"
        lines.append(f"| {name} | {cell} | {hits} of {total} |")
    files.write_text(out_dir / "compute.md", "\n".join(lines) + "\n")
    figure = compute_figure(out_dir, results, curves, baseline, target)
    path = out_dir / "ppl_vs_compute.png"
    save_figure(figure, path)
    return [path, out_dir / "compute.md"]


def compute_figure(
    out_dir: Path,
    results: list[dict[str, Any]],
    curves: dict[str, list[tuple[list[tuple[float, float]], float]]],
    baseline: str,
    target: float,
) -> Any:
    """Validation perplexity against cumulative training FLOPs (left) and wall time (right).
    Each seed's steps map to its own FLOPs (an adaptive solver's seeds differ in FLOPs per
    step), and the mean line's x is the mean over seeds, as for wall time."""
    logs = {r["run"]: read_metrics(out_dir / "runs" / r["run"]) for r in results}
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for index, (name, runs) in enumerate(group_by_model(results).items()):
        seeds = curves.get(name)
        if not seeds:
            continue
        flops_x = [{step: step * flops for step, _ in curve} for curve, flops in seeds]
        _draw(left, index, name, [curve for curve, _ in seeds], flops_x)
        timed = [(dict(logs[r["run"]].get("val/elapsed_s", [])), logs[r["run"]]) for r in runs]
        time_curves = [[(s, v) for s, v in log.get("val/ppl", []) if s in x] for x, log in timed]
        if all(time_curves):
            _draw(right, index, name, time_curves, [x for x, _ in timed])
    left.axhline(target, color="black", linewidth=0.8, linestyle=":", label=f"{baseline}'s best")
    left.set(xlabel="cumulative training FLOPs (3 x forward)", ylabel="validation perplexity")
    right.set(xlabel="training wall time (s)")
    for axis in (left, right):
        axis.set_yscale("log")
        plain_log_ticks(axis)
        axis.grid(True, alpha=0.3)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    left.legend(handles=left.get_lines()[-1:], fontsize=7, loc="upper right")
    figure.suptitle(
        "Equal training compute: validation perplexity against FLOPs and time", fontsize=9
    )
    figure.tight_layout()
    return figure
