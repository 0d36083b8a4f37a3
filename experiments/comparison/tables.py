"""The comparison's tables: ``results.csv`` (one row per run) and ``results.md``
(aggregated over seeds, each model against the grid's baseline)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from experiments.comparison.stats import PairedDifference, paired_difference, summarize

# results.csv: one row per run, every column (``run`` is the run directory's name).
CSV_COLUMNS = [
    "name",
    "seed",
    "run",
    "family",
    "parameters",
    "test_ppl",
    "test_ppl_per_word",
    "test_bleu_tf",
    "test_bleu_cont",
    "test_nfe",
    "test_flops_per_token",
    "test_flops_batches",
    "train_tokens_per_s",
    "train_mfu",
    "peak_memory_mb",
    "is_causal",
    "protocol",
    "valid_ppl",
    "selected",
    "steps",
    "train_seconds",
    "recipe",
    "model",
]
# results.md: the headline columns averaged over seeds (after model, parameters, test
# perplexity and Δ); per-word perplexity, BLEU, memory, steps, time, family, recipe and
# configuration are per run in results.csv.
MEAN_COLUMNS = [
    ("valid_ppl", "valid perplexity"),
    ("test_nfe", "NFE"),
    ("test_flops_per_token", "forward FLOPs/token"),
    ("train_tokens_per_s", "train tokens/s"),
    ("train_mfu", "train MFU"),
]


NOTE = (
    "Perplexities are on the test split: mean ± sample standard deviation over n seeds "
    "(seeds {seeds}); every other column is a mean over seeds. Δ is the model's test "
    "perplexity minus the baseline's ({baseline}), paired by seed, with a 95% Student-t "
    "interval over the paired differences; significant when the interval excludes 0 "
    "(n/a with one seed). Every other result of every run is in results.csv. NFE: evaluations of the depth function F per forward pass "
    "(docs/DESIGN.md): for Transformers F is one pre-norm attention+FFN layer (a residual "
    "layer costs 1, an RK block of s stages s, Macaron 1); for ODE heads F is the head's "
    "small vector field, so NFE is not a cost across families. Forward FLOPs/token "
    "(experiments/evaluation/flops.py): matrix products, attention's score and value products included "
    "(the full T x T scores, under a causal mask too) and fused kernels in closed form; "
    "elementwise work is not counted; per predicted token over every test batch, the forward "
    "passes the perplexity and NFE come from. "
    "Train MFU: model FLOPs utilisation, 3 x forward FLOPs per token (forward + backward) "
    "per second of the training's CPU time over the matrix-product peak per CPU-second at "
    "the run's precision, so other processes on the machine change neither side; train "
    "tokens/s is wall-clock."
)


def group_by_model(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Results per model name, models in the order they first appear."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        groups.setdefault(result["name"], []).append(result)
    return groups


def write_tables(results: list[dict[str, Any]], out_dir: Path, baseline: str) -> None:
    """Write ``results.csv`` (every run) and ``results.md`` (the table a paper would show)."""
    with (out_dir / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for result in results:
            writer.writerow([_csv_value(result.get(key)) for key in CSV_COLUMNS])
    (out_dir / "results.md").write_text(markdown_table(results, baseline))


def markdown_table(results: list[dict[str, Any]], baseline: str) -> str:
    """The aggregated table plus its notes (protocol, statistics, cost definitions)."""
    groups = group_by_model(results)
    base = {r["seed"]: _number(r.get("test_ppl")) for r in groups.get(baseline, [])}
    mean_columns = [
        (key, title) for key, title in MEAN_COLUMNS if any(r.get(key) is not None for r in results)
    ]
    header = ["model", "parameters", "test perplexity (mean ± sd, n seeds)"]
    header += [f"Δ vs {baseline} [95% CI]"] + [title for _, title in mean_columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, runs in groups.items():
        ppl = summarize([_number(r.get("test_ppl")) for r in runs])
        causal = all(r.get("is_causal", True) for r in runs)
        ppl_cell = f"{_mean_sd(ppl)} ({ppl.n})"
        if not causal:
            ppl_cell += " (non-causal: not an LM perplexity)"
        if name == baseline:
            delta_cells = ["baseline"]
        else:
            paired = paired_difference({r["seed"]: _number(r.get("test_ppl")) for r in runs}, base)
            delta_cells = _delta_cells(paired)
        cells = [name, _format("parameters", _mean(runs, "parameters")), ppl_cell, *delta_cells]
        cells += [_format(key, _mean(runs, key)) for key, _ in mean_columns]
        lines.append("| " + " | ".join(cells) + " |")
    protocols = "; ".join(sorted({str(r.get("protocol")) for r in results}))
    seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in results}))
    note = NOTE.format(seeds=seeds, baseline=baseline)
    lines += ["", f"Data protocol: {protocols}.", "", note]
    return "\n".join(lines) + "\n"


def _delta_cells(paired: PairedDifference | None) -> list[str]:
    if paired is None:
        return ["-"]
    if paired.ci_low is None:
        return [f"{paired.mean:+.2f} [n/a]"]
    verdict = "significant" if paired.significant else "not significant"
    return [f"{paired.mean:+.2f} [{paired.ci_low:+.2f}, {paired.ci_high:+.2f}], {verdict}"]


def _mean_sd(summary: Any) -> str:
    if summary.n == 0:
        return "-"
    sd = "n/a" if summary.sd is None else f"{summary.sd:.2f}"
    return f"{summary.mean:.2f} ± {sd}"


def _mean(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _csv_value(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def _format(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if key in ("parameters", "test_flops_per_token"):
        if value >= 1e5:
            return f"{value / 1e6:.2f}M"
        return f"{value / 1e3:.1f}k" if value else "0"
    if key in ("steps", "train_tokens_per_s"):
        return f"{value:.0f}"
    if key == "train_mfu":
        return f"{value:.1%}"
    return f"{value:.3f}" if "bleu" in key else f"{value:.2f}"
