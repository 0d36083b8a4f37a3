"""Equal training compute: validation perplexity against cumulative training FLOPs and wall
time for every model on one figure (``ppl_vs_compute.png``), and the training FLOPs each
model needs to reach the baseline's best validation perplexity (``compute.md``).

Training FLOPs of a step are 3 x forward FLOPs per token (forward and backward,
``experiments.models.flops.training_flops``) x tokens per step (``tokens_per_step``, from the run's ``config.yaml``: ``data.batch_size`` x
``data.bptt`` for stream windows); forward FLOPs per token are the run's measured
``test_flops_per_token``, so for an adaptive ODE solver whose NFE changes over training
the figure uses its test-time cost. Sentence batches have no fixed token count per step,
except the grammar family's streamed sentences, whose expected count is exact:
``data.batch_size`` x the grammar's expected tokens per sentence (words and ``<eos>``, the
tokens the loss counts; padding is not counted); other sentence runs are left out.

A grid of the grammar family (every run on one family depth) is read in excess loss, as
its tables are: the validation excess (the run's validation NLL per token minus the true
grammar's exact NLL per token of the same validation split) against training FLOPs and
wall time, each model's line its best validation excess so far (its compute frontier:
the lowest excess the design reached within that compute), its mean test excess starred
at the FLOPs of the tested checkpoint (``excess_vs_compute.png``), and the FLOPs each
model needs to reach the baseline's best validation excess (``compute.md``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.lines import Line2D

from experiments.comparison.plots import _draw, read_metrics, style
from experiments.comparison.tables import group_by_model
from experiments.models.flops import training_flops
from experiments.plotting import plain_log_ticks, plt, save_figure
from experiments.safe_yaml import parse_yaml, read_yaml_text
from odelm import files

Curves = dict[str, list[tuple[list[tuple[float, float]], float]]]
"""Per model, each seed's validation curve ``[(step, value)]`` and its training FLOPs per step."""


def run_data(run_dir: Path) -> dict[str, Any]:
    """The ``data`` section of the run's ``config.yaml`` (empty without one)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    return (parse_yaml(read_yaml_text(path), str(path)) or {}).get("data", {})


def family_depth(data: dict[str, Any]) -> int | None:
    """The grammar family's depth a run's ``data`` section trains on (None: another corpus)."""
    depth = data.get("grammar_depth")
    return int(depth) if data.get("corpus") == "grammar" and depth is not None else None


def tokens_per_step(data: dict[str, Any]) -> float | None:
    """Training tokens of one optimizer step (None where the count is not fixed)."""
    if data.get("batching", "stream") == "stream":
        return float(data.get("batch_size", 0) * data.get("bptt", 0)) or None
    depth = family_depth(data)
    if depth is None:
        return None
    from experiments.data.grammar_family import family_grammar

    return data.get("batch_size", 0) * (family_grammar(depth).expected_words + 1.0) or None


def training_flops_per_step(run_dir: Path, result: dict[str, Any]) -> float | None:
    """Training FLOPs of one optimizer step of the run (None where not defined): the
    run's measured forward FLOPs per token through ``experiments.models.flops.training_flops``."""
    forward = result.get("test_flops_per_token")
    if (
        not isinstance(forward, (int, float))
        or not forward
        or not (run_dir / "config.yaml").is_file()
    ):
        return None
    tokens = tokens_per_step(run_data(run_dir))
    return training_flops(forward, tokens) if tokens else None


def validation_reference(data: dict[str, Any]) -> float:
    """The true grammar's exact NLL per token of the validation split of a family run."""
    from experiments.data.grammar_family import family_split

    depth = family_depth(data)
    assert depth is not None, "validation_reference needs a grammar-family run"
    words, log_probability = family_split(depth, int(data.get("seed", 0)), "valid")
    return -log_probability / sum(len(sentence) for sentence in words)


def is_excess_grid(out_dir: Path, results: list[dict[str, Any]]) -> bool:
    """Whether every run trained on the grammar family (its grid is read in excess loss)."""
    return bool(results) and all(
        family_depth(run_data(out_dir / "runs" / r["run"])) is not None for r in results
    )


def compute_curves(out_dir: Path, results: list[dict[str, Any]], excess: bool = False) -> Curves:
    """Per model, each seed's validation curve (step, perplexity) and its FLOPs per step;
    with ``excess``, the validation excess loss (nats/token) in place of the perplexity."""
    curves: Curves = {}
    for name, runs in group_by_model(results).items():
        for run in runs:
            run_dir = out_dir / "runs" / run["run"]
            flops = training_flops_per_step(run_dir, run)
            curve = read_metrics(run_dir).get("val/ppl", [])
            if excess and curve:
                reference = validation_reference(run_data(run_dir))
                curve = [(step, math.log(ppl) - reference) for step, ppl in curve]
            if flops and curve:
                curves.setdefault(name, []).append((curve, flops))
    return curves


def flops_to_target(
    curves: Curves, baseline: str
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
    """``ppl_vs_compute.png`` (``excess_vs_compute.png`` for a grammar-family grid) and
    ``compute.md``; nothing when no run has a FLOPs curve."""
    excess = is_excess_grid(out_dir, results)
    curves = compute_curves(out_dir, results, excess)
    if not curves:
        return []
    target, reached = flops_to_target(curves, baseline)
    metric = "validation excess loss" if excess else "validation perplexity"
    value = f"{target:.4f} nats/token" if excess else f"{target:.2f}"
    lines = [
        (
            f"Training FLOPs to reach {baseline}'s best {metric} "
            f"({value}, mean over its seeds): 3 x forward FLOPs/token x tokens per step x "
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
    if excess:
        figure = excess_compute_figure(out_dir, results, curves, baseline, target)
        path = out_dir / "excess_vs_compute.png"
    else:
        figure = compute_figure(out_dir, results, curves, baseline, target)
        path = out_dir / "ppl_vs_compute.png"
    save_figure(figure, path)
    return [path, out_dir / "compute.md"]


def compute_figure(
    out_dir: Path,
    results: list[dict[str, Any]],
    curves: Curves,
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


def frontier(curve: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The best value so far at each step of ``curve`` (its running minimum)."""
    best, out = math.inf, []
    for step, value in curve:
        best = min(best, value)
        out.append((step, best))
    return out


def excess_compute_figure(
    out_dir: Path, results: list[dict[str, Any]], curves: Curves, baseline: str, target: float
) -> Any:
    """Each model's compute frontier: its best validation excess loss so far against
    cumulative training FLOPs (left) and wall time (right), the mean over seeds with a
    min-max band; a star at each model's mean test excess and the mean FLOPs of the tested
    checkpoint. Log axes: an excess at or below 0 (a finite split's noise) is not drawn."""
    logs = {r["run"]: read_metrics(out_dir / "runs" / r["run"]) for r in results}
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for index, (name, runs) in enumerate(group_by_model(results).items()):
        seeds = curves.get(name)
        if not seeds:
            continue
        fronts = [frontier(curve) for curve, _ in seeds]
        flops_x = [{step: step * flops for step, _ in curve} for curve, flops in seeds]
        _draw(left, index, name, fronts, flops_x)
        tested = [
            (r["test_excess_nll_per_token"], r.get("best_step") or seeds[0][0][-1][0])
            for r in runs
            if isinstance(r.get("test_excess_nll_per_token"), (int, float))
        ]
        if tested and len(tested) == len(seeds):
            x = sum(step * flops for (_, step), (_, flops) in zip(tested, seeds)) / len(seeds)
            y = sum(value for value, _ in tested) / len(tested)
            if y > 0:
                left.plot(
                    [x],
                    [y],
                    marker="*",
                    markersize=13,
                    color=style(index)["color"],
                    markeredgecolor="black",
                    linestyle="none",
                )
        elapsed = [dict(logs[r["run"]].get("val/elapsed_s", [])) for r in runs]
        if len(elapsed) == len(fronts) and all(
            all(s in e for s, _ in f) for e, f in zip(elapsed, fronts)
        ):
            _draw(right, index, name, fronts, elapsed)
    left.axhline(target, color="black", linewidth=0.8, linestyle=":")
    left.set(xlabel="cumulative training FLOPs (3 x forward)", xscale="log")
    left.set_ylabel("best validation excess loss so far (nats/token)")
    right.set(xlabel="training wall time (s)")
    handles = [
        Line2D([], [], color="black", linewidth=0.8, linestyle=":", label=f"{baseline}'s best"),
        Line2D(
            [],
            [],
            color="grey",
            marker="*",
            markersize=11,
            markeredgecolor="black",
            linestyle="none",
            label="test excess (mean over seeds)",
        ),
    ]
    for axis in (left, right):
        axis.set_yscale("log")
        plain_log_ticks(axis)
        axis.grid(True, alpha=0.3)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    left.legend(handles=handles, fontsize=7, loc="upper right")
    protocol = next((str(r["protocol"]) for r in results if r.get("protocol")), "")
    figure.suptitle(
        f"Compute frontier of each design: excess loss over the true grammar against training "
        f"FLOPs and time{f' ({protocol})' if protocol else ''}",
        fontsize=9,
    )
    figure.tight_layout()
    return figure
