"""The port's ten seeds against the reference example's ten: table and figure.

Reads ``results.csv`` (``odelm compare --preset baselines-ptb-mini-10seeds``) and the
reference example's logs in ``reference-logs/`` (one per model and seed, ending with its
``| End of training | test loss ... | test ppl ...`` line); prints the markdown table of
README.md and writes ``seeds.png``. Run from anywhere: ``python compare_reference.py``.
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from scipy import stats

HERE = Path(__file__).resolve().parent
MODELS = {"lstm-untied": ("LSTM untied", 275.0), "transformer": ("reference Transformer", 345.0)}


def port_results() -> dict[str, dict[int, float]]:
    """Test perplexity by model and seed from the grid's ``results.csv``."""
    table: dict[str, dict[int, float]] = {}
    with open(HERE / "results.csv") as file:
        for row in csv.DictReader(file):
            table.setdefault(row["name"], {})[int(row["seed"])] = float(row["test_ppl"])
    return table


def reference_results() -> dict[str, dict[int, float]]:
    """Test perplexity by model and seed from the reference example's logs."""
    table: dict[str, dict[int, float]] = {}
    for log in sorted((HERE / "reference-logs").glob("*-seed*.log")):
        model, seed = re.fullmatch(r"(.+)-seed(\d+)\.log", log.name).groups()
        found = re.search(r"test ppl\s+([\d.]+)", log.read_text())
        if found:
            table.setdefault(model, {})[int(seed)] = float(found.group(1))
    return table


def summary(values: dict[int, float]) -> str:
    runs = [values[seed] for seed in sorted(values)]
    return f"{statistics.mean(runs):.2f} ± {statistics.stdev(runs):.2f} ({len(runs)})"


def main() -> None:
    port, reference = port_results(), reference_results()
    print(
        "| model | odelm port, mean ± sd (n) | reference example, mean ± sd (n) "
        "| port - reference [95% CI], Welch | seeds 1-3 mean: port / reference "
        "| runs <= target: port / reference | target (3-seed mean) |"
    )
    print("|---|---|---|---|---|---|---|")
    figure, axes = plt.subplots(1, len(MODELS), figsize=(10, 4.2))
    for axis, (name, (label, target)) in zip(axes, MODELS.items()):
        ours, theirs = port[name], reference[name]
        test = stats.ttest_ind(list(ours.values()), list(theirs.values()), equal_var=False)
        interval = test.confidence_interval(0.95)
        delta = statistics.mean(ours.values()) - statistics.mean(theirs.values())
        first = [statistics.mean(d[s] for s in (1, 2, 3)) for d in (ours, theirs)]
        below = [sum(v <= target for v in d.values()) for d in (ours, theirs)]
        print(
            f"| {label} | {summary(ours)} | {summary(theirs)} "
            f"| {delta:+.2f} [{interval.low:+.2f}, {interval.high:+.2f}], p = {test.pvalue:.2f} "
            f"| {first[0]:.2f} / {first[1]:.2f} | {below[0]}/{len(ours)} / {below[1]}/{len(theirs)} "
            f"| <= {target:g} |"
        )
        for x, values in enumerate((ours, theirs)):
            runs = [values[seed] for seed in sorted(values)]
            jitter = [x + 0.02 * (i - (len(runs) - 1) / 2) for i in range(len(runs))]
            axis.scatter(jitter, runs, s=22, alpha=0.8)
            axis.errorbar(
                [x + 0.25],
                [statistics.mean(runs)],
                yerr=[statistics.stdev(runs)],
                fmt="D",
                color="black",
                capsize=4,
            )
        axis.axhline(target, color="tab:red", linestyle="--", linewidth=1)
        axis.text(
            -0.45, target, f"target {target:g}", color="tab:red", va="bottom", ha="left", fontsize=8
        )
        axis.set_xticks([0, 1], ["odelm port", "reference example"])
        axis.set_xlim(-0.5, 1.5)
        axis.set_title(f"{label}: {len(ours)} and {len(theirs)} seeds", fontsize=10)
        axis.set_ylabel("test perplexity")
    figure.suptitle(
        "PTB-mini (train=valid[:90%], valid=valid[90%:], test=test), 20 epochs of 20 x 35\n"
        "dots: one seed each; diamond and bar: mean ± sd; dashed: the 3-seed target",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(HERE / "seeds.png", dpi=110)


if __name__ == "__main__":
    main()
