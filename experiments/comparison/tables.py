"""The comparison's tables: ``results.csv`` (one row per run) and ``results.md``
(aggregated over seeds, each model against the grid's baseline)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from experiments.comparison.stats import PairedDifference, holm, paired_difference, summarize
from experiments.training.config import merge
from experiments.training.runs import result_depth
from odelm import files

# results.csv: one row per run, every column (``run`` is the run directory's name).
CSV_COLUMNS = [
    "name",
    "seed",
    "run",
    "depth",
    "parameters",
    "test_ppl",
    "test_ppl_per_word",
    "test_true_nll_per_token",
    "test_excess_nll_per_token",
    "test_ppl_ratio",
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
    "best_step",
    "cap_bound",
    "pair",
    "p_value",
    "p_holm",
]
# results.md: the headline columns averaged over seeds (after model, parameters, test
# perplexity and Δ); per-word perplexity, BLEU, memory, steps, time, depth, recipe and
# configuration are per run in results.csv.
MEAN_COLUMNS = [
    ("test_excess_nll_per_token", "excess loss (nats/token)"),
    ("test_ppl_ratio", "perplexity ratio"),
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
    "(experiments/models/flops.py): matrix products, attention's score and value products included "
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


SEED_NOISE = "seed-noise"
"""The run name of a grid's seed-noise row: the baseline's config at other seeds, paired
with the baseline's seeds (an A/A comparison: how far two identical configs "differ")."""


def _pair(result: dict[str, Any]) -> int:
    """The seed a run is paired by: its own, or the baseline seed a seed-noise run stands
    beside."""
    pair = result.get("pair")
    return int(pair) if pair is not None else int(result["seed"])


def comparisons(
    results: list[dict[str, Any]], baseline: str, metric: str = "test_ppl"
) -> dict[str, PairedDifference | None]:
    """Each model's seed-paired difference to ``baseline`` in ``metric`` (a results.csv
    column: test perplexity, or excess loss on a grammar corpus)."""
    groups = group_by_model(results)
    base = {_pair(r): _number(r.get(metric)) for r in groups.get(baseline, [])}
    return {
        name: paired_difference({_pair(r): _number(r.get(metric)) for r in runs}, base)
        for name, runs in groups.items()
        if name != baseline
    }


def adjusted_p_values(results: list[dict[str, Any]], baseline: str) -> dict[str, float | None]:
    """Holm-adjusted p-values over the grid's comparisons with the baseline (the seed-noise
    row, a control, is not one of them)."""
    paired = {k: v for k, v in comparisons(results, baseline).items() if k != SEED_NOISE}
    names = list(paired)
    raw = [paired[n].p_value if paired[n] is not None else None for n in names]
    return dict(zip(names, holm(raw), strict=True))


def cap_bound(result: dict[str, Any]) -> bool | None:
    """Whether the run's best checkpoint is its last validation at its step budget (it was
    still improving when the budget ended); None for runs that did not record it."""
    best, steps, every = result.get("best_step"), result.get("steps"), result.get("val_every")
    if best is None or steps is None or not every:
        return None
    return bool(best == steps - steps % every and steps >= result.get("max_steps", steps))


def runs_have_fixed_budget(configs: list[dict[str, Any]]) -> bool:
    """Whether every run config decays its rate to 0 over a fixed budget (``optim.schedule:
    cosine``): there a best validation at the last step is the end of the decay, not a run
    cut off while improving, so "cap-bound" says nothing; the budget's pilot (in the grid
    file) says whether the budget sufficed."""
    return bool(configs) and all(c.get("optim", {}).get("schedule") == "cosine" for c in configs)


def grid_has_fixed_budget(grid: dict[str, Any]) -> bool:
    """`runs_have_fixed_budget` of a grid file's runs (each merged over its ``shared``)."""
    return runs_have_fixed_budget([merge(grid.get("shared", {}), run) for run in grid["runs"]])


def write_tables(
    results: list[dict[str, Any]], out_dir: Path, baseline: str, fixed_budget: bool = False
) -> None:
    """Write ``results.csv`` (every run) and ``results.md`` (the table a paper would show);
    ``fixed_budget``: every run's rate decays to 0 over its budget, see `markdown_table`."""
    paired, adjusted = comparisons(results, baseline), adjusted_p_values(results, baseline)
    with (
        files.atomic_write(out_dir / "results.csv") as partial,
        partial.open("w", newline="") as handle,
    ):
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for result in results:
            difference = paired.get(result["name"])
            extra = {
                "depth": result_depth(result),  # a result written before the rename: family
                "cap_bound": cap_bound(result),
                "p_value": difference.p_value if difference is not None else None,
                "p_holm": adjusted.get(result["name"]),
            }
            row = {**result, **extra}
            writer.writerow([_csv_value(row.get(key)) for key in CSV_COLUMNS])
    files.write_text(out_dir / "results.md", markdown_table(results, baseline, fixed_budget))


def markdown_table(results: list[dict[str, Any]], baseline: str, fixed_budget: bool = False) -> str:
    """The aggregated table plus its notes (protocol, statistics, cost definitions). With
    ``fixed_budget`` (warm-up + cosine to 0) no run is called cap-bound (see
    `runs_have_fixed_budget`): the grid file's pilot says whether the budget sufficed."""
    groups = group_by_model(results)
    paired, adjusted = comparisons(results, baseline), adjusted_p_values(results, baseline)
    mean_columns = [
        (key, title) for key, title in MEAN_COLUMNS if any(r.get(key) is not None for r in results)
    ]
    header = ["model", "parameters", "test perplexity (mean ± sd, n seeds)"]
    header += [f"Δ vs {baseline} [95% CI]", "p (Holm)"] + [title for _, title in mean_columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, runs in groups.items():
        ppl = summarize([_number(r.get("test_ppl")) for r in runs])
        causal = all(r.get("is_causal", True) for r in runs)
        ppl_cell = f"{_mean_sd(ppl)} ({ppl.n})"
        if not causal:
            ppl_cell += " (non-causal: not an LM perplexity)"
        if name == baseline:
            delta_cells = ["baseline", "-"]
        else:
            delta_cells = _delta_cells(paired[name], adjusted.get(name), name == SEED_NOISE)
        if not fixed_budget and any(cap_bound(r) for r in runs):
            ppl_cell += f" ({sum(bool(cap_bound(r)) for r in runs)} cap-bound)"
        cells = [name, _format("parameters", _mean(runs, "parameters")), ppl_cell, *delta_cells]
        cells += [_format(key, _mean(runs, key)) for key, _ in mean_columns]
        lines.append("| " + " | ".join(cells) + " |")
    true_row = _true_grammar_row(results, mean_columns, len(header))
    if true_row:
        lines.append(true_row)
    protocols = "; ".join(sorted({str(r.get("protocol")) for r in results}))
    seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in results}))
    note = NOTE.format(seeds=seeds, baseline=baseline)
    if SEED_NOISE in groups:
        note += SEED_NOISE_NOTE.format(baseline=baseline)
        note += FIXED_BUDGET_NOTE if fixed_budget else CAP_BOUND_NOTE
    if any(r.get("test_excess_nll_per_token") is not None for r in results):
        note += EXCESS_NOTE
    lines += ["", f"Data protocol: {protocols}.", "", note]
    return "\n".join(lines) + "\n"


SEED_NOISE_NOTE = (
    " The row seed-noise is {baseline}'s own config trained at other seeds, paired with "
    "{baseline}'s seeds: the spread of an A/A comparison, which every Δ is read against. "
    "p: two-sided paired t-test; in brackets Holm's adjustment over the table's comparisons "
    "(seed-noise excluded), from which the word significant is taken."
)
CAP_BOUND_NOTE = (
    " cap-bound: runs whose best checkpoint was their last validation at the budget (still "
    "improving)."
)
FIXED_BUDGET_NOTE = (
    " Every run's rate decays to 0 over a fixed step budget (warm-up, then cosine): a best "
    "validation at the last step is the end of that decay, not a run cut off while improving, "
    "so no run is counted cap-bound; the grid file states the pilot that chose the budget."
)


EXCESS_NOTE = (
    " Excess loss: the model's test NLL minus the true grammar's exact NLL of the same test "
    "split, in nats per token (0 is the optimum); perplexity ratio: exp(excess), the "
    "model's test perplexity over the true grammar's. The row true grammar scores the "
    "generating grammar itself."
)


def _true_grammar_row(
    results: list[dict[str, Any]], mean_columns: list[tuple[str, str]], width: int
) -> str | None:
    """The generating grammar as a row (its exact test NLL, excess 0), when every run was
    tested on one generated split; None otherwise."""
    true_nll = {r.get("test_true_nll_per_token") for r in results}
    if len(true_nll) != 1 or not isinstance(value := true_nll.pop(), float):
        return None
    known = {"test_excess_nll_per_token": 0.0, "test_ppl_ratio": 1.0}
    cells = ["true grammar", "-", f"{math.exp(value):.2f} (exact)", "-", "-"]
    cells += [_format(key, known.get(key)) for key, _ in mean_columns]
    return "| " + " | ".join(cells[:width]) + " |"


def _delta_cells(
    paired: PairedDifference | None, p_holm: float | None, control: bool = False
) -> list[str]:
    if paired is None:
        return ["-", "-"]
    if paired.ci_low is None or paired.p_value is None:
        return [f"{paired.mean:+.2f} [n/a]", "-"]
    interval = f"{paired.mean:+.2f} [{paired.ci_low:+.2f}, {paired.ci_high:+.2f}]"
    if control:
        return [f"{interval} (A/A control)", f"{paired.p_value:.3f}"]
    significant = p_holm is not None and p_holm < 0.05
    verdict = "significant" if significant else "not significant"
    p_cell = f"{paired.p_value:.3f} ({p_holm:.3f})" if p_holm is not None else "-"
    return [f"{interval}, {verdict}", p_cell]


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
    if key in ("test_excess_nll_per_token", "test_ppl_ratio"):
        return f"{value:.4f}"
    return f"{value:.3f}" if "bleu" in key else f"{value:.2f}"
