"""The grammar study's plots on small synthetic results: excess loss against training FLOPs
(each design's compute frontier) and against the grammar's depth D."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import yaml

from experiments.comparison import compute
from experiments.comparison.compute import frontier, tokens_per_step, write_compute
from experiments.comparison.depth_plots import (
    excess_by_depth,
    excess_depth_figure,
    write_excess_depth,
)
from experiments.plotting import plt

REFERENCE = 2.0  # the true grammar's validation NLL per token, stubbed
WORDS = 9.0  # expected words per sentence, stubbed: 10 tokens with <eos>


@pytest.fixture
def grammar(monkeypatch):
    """A depth-1 family whose expected sentence is 10 tokens and validation NLL 2.0/token."""
    import experiments.data.grammar_family as family

    monkeypatch.setattr(
        family, "family_grammar", lambda depth: SimpleNamespace(expected_words=WORDS)
    )
    monkeypatch.setattr(compute, "validation_reference", lambda data: REFERENCE)


def _run(out, name, seed, flops_per_token, excess_curve, test_excess):
    run = f"{name}-seed{seed}"
    folder = out / "runs" / run
    (folder / "logs").mkdir(parents=True)
    data = {"corpus": "grammar", "grammar_depth": 1, "batching": "sentences", "batch_size": 2}
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    rows = ["step,val/ppl,val/elapsed_s"] + [
        f"{s},{math.exp(REFERENCE + v)},{s / 10}" for s, v in excess_curve
    ]
    (folder / "logs" / "metrics.csv").write_text("\n".join(rows) + "\n")
    return {
        "name": name,
        "seed": seed,
        "run": run,
        "test_flops_per_token": flops_per_token,
        "test_excess_nll_per_token": test_excess,
        "best_step": excess_curve[-1][0],
        "protocol": "grammar-depth 1 (streamed train, seed 0)",
    }


def test_tokens_per_step_of_streamed_grammar_sentences(grammar):
    """Sentences of the family: batch x expected tokens (words and <eos>); stream windows:
    batch x bptt; other sentence batches: no fixed count."""
    assert (
        tokens_per_step(
            {"corpus": "grammar", "grammar_depth": 3, "batching": "sentences", "batch_size": 32}
        )
        == 320.0
    )
    assert tokens_per_step({"batch_size": 20, "bptt": 35}) == 700.0
    assert tokens_per_step({"corpus": "ptb", "batching": "sentences", "batch_size": 32}) is None


def test_frontier_is_the_best_so_far():
    assert frontier([(1, 0.5), (2, 0.7), (3, 0.2)]) == [(1, 0.5), (2, 0.5), (3, 0.2)]


def test_a_grammar_grid_is_read_in_excess_loss_against_flops(grammar, tmp_path):
    """Baseline best excess 0.1 (both seeds); deep reaches it at step 20 on one seed
    (3 x 100 FLOPs x 20 tokens x 20 steps = 120,000), never on the other."""
    results = [
        _run(tmp_path, "base", 1, 10.0, [(10, 0.4), (20, 0.1)], 0.11),
        _run(tmp_path, "base", 2, 10.0, [(10, 0.3), (20, 0.1)], 0.12),
        _run(tmp_path, "deep", 1, 100.0, [(10, 0.2), (20, 0.05)], 0.06),
        _run(tmp_path, "deep", 2, 100.0, [(10, 0.2), (20, 0.15)], 0.16),
    ]
    written = write_compute(tmp_path, results, "base")
    table = (tmp_path / "compute.md").read_text()
    assert "best validation excess loss (0.1000 nats/token" in table
    assert "| deep | 1.2e+05 | 1 of 2 |" in table
    assert "| base | 1.2e+04 | 2 of 2 |" in table  # 3 x 10 x 20 x 20
    assert [p.name for p in written] == ["excess_vs_compute.png", "compute.md"]
    assert not (tmp_path / "ppl_vs_compute.png").exists()


def test_the_frontier_figure_draws_best_so_far_and_the_test_star(grammar, tmp_path):
    results = [
        _run(tmp_path, "base", 1, 10.0, [(10, 0.4), (20, 0.5), (30, 0.1)], 0.12),
        _run(tmp_path, "base", 2, 10.0, [(10, 0.2), (20, 0.3), (30, 0.1)], 0.14),
    ]
    curves = compute.compute_curves(tmp_path, results, excess=True)
    figure = compute.excess_compute_figure(tmp_path, results, curves, "base", 0.1)
    left = figure.axes[0]
    lines = {line.get_label(): line for line in left.get_lines()}
    assert list(lines["base"].get_xdata()) == pytest.approx([6e3, 1.2e4, 1.8e4])
    assert list(lines["base"].get_ydata()) == pytest.approx([0.3, 0.3, 0.1])  # running minimum
    stars = [line for line in left.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1 and list(stars[0].get_ydata()) == pytest.approx([0.13])
    assert list(stars[0].get_xdata()) == pytest.approx([1.8e4])
    assert figure.axes[1].get_lines()  # the wall-time panel
    plt.close(figure)


def _rows(name, depth, values):
    protocol = f"grammar-depth {depth} (streamed train, seed 0)"
    return [
        {"name": name, "seed": str(s), "protocol": protocol, "test_excess_nll_per_token": str(v)}
        for s, v in enumerate(values, start=1)
    ]


def test_excess_by_depth_groups_arms_and_leaves_out_seed_noise():
    rows = [
        *_rows("residual", 1, [0.01, 0.03]),
        *_rows("residual", 3, [0.05, 0.07]),
        *_rows("seed-noise", 3, [0.06]),
        *_rows("looped4", 3, [0.04]),
        {"name": "x", "protocol": "PTB-mini", "test_excess_nll_per_token": ""},
    ]
    table = excess_by_depth(rows)
    assert table == {"residual": {1: [0.01, 0.03], 3: [0.05, 0.07]}, "looped4": {3: [0.04]}}
    figure = excess_depth_figure(table)
    containers = figure.axes[0].containers  # one errorbar per arm, labelled
    means = {c.get_label(): list(c.lines[0].get_ydata()) for c in containers}
    assert means["residual (mean of 2 seeds)"] == pytest.approx([0.02, 0.06])
    assert means["looped4"] == pytest.approx([0.04])
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["D = 1", "D = 3"]
    plt.close(figure)


def test_write_excess_depth_from_two_results_csvs(tmp_path):
    import csv

    paths = []
    for depth, values in ((1, [0.01, 0.02]), (3, [0.05, 0.08])):
        path = tmp_path / f"d{depth}.csv"
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(
                handle, ["name", "seed", "protocol", "test_excess_nll_per_token"]
            )
            writer.writeheader()
            writer.writerows(_rows("residual", depth, values))
        paths.append(path)
    out = write_excess_depth(paths, tmp_path / "excess_vs_depth.png")
    assert out is not None and out.stat().st_size > 0
    assert write_excess_depth([], tmp_path / "none.png") is None
