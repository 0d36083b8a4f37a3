"""``odelm discretize``: one trained ODE Transformer's fields under many discretisations."""

from __future__ import annotations

import json
import math

import pytest

from experiments.cli.main import main
from experiments.training.config import parse_config
from experiments.training.train import train

KEYS = {"method", "setting", "ppl", "nfe", "flops_per_token", "state_error"}


@pytest.mark.slow
def test_discretize_an_rk4_ode_transformer(tmp_path, capsys):
    values = {
        "name": "rk4",
        "out_dir": str(tmp_path),
        "seed": 1,
        "model": {
            "family": "ode_transformer",
            "preset": "small",
            "d_model": 16,
            "n_heads": 2,
            "d_ff": 32,
            "n_layers": 2,
            "max_positions": 64,
            "block": "rk4",
        },
        "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 32},
        "trainer": {"max_steps": 2, "val_every": 2, "val_batches": 1, "progress_bar": False},
        "eval": {"bleu_sentences": 0, "continuation_sentences": 0},
    }
    train(parse_config(values))
    run = tmp_path / "rk4"
    assert main(["discretize", str(run), "--json", "--max-batches", "1", "--steps", "1", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(KEYS <= set(row) for row in rows)
    by = {(row["method"], row["setting"]): row for row in rows}
    # The trained model is its fields solved by one classic RK4 step per block.
    trained, rk4 = by["rk4 (trained blocks)", "as trained"], by["rk4", "1 step"]
    assert trained["ppl"] == rk4["ppl"] and trained["state_error"] == rk4["state_error"]
    assert [r["setting"] for r in rows if r["ppl"] is None] == ["block 0", "block 1"]
    # Accuracy against the tight reference follows the order of the method.
    assert by["rk4", "2 steps"]["state_error"] < by["rk4", "1 step"]["state_error"]
    assert by["rk4", "1 step"]["state_error"] < by["euler", "1 step"]["state_error"]
    assert by["euler", "2 steps"]["nfe"] == 2 * 2 and by["rk3", "1 step"]["nfe"] == 2 * 3
    # Fixed grids are exactly causal; every row costs FLOPs in proportion to its NFE.
    assert all(r["causal_leak"] == 0.0 for r in rows if r["method"] in ("euler", "rk4"))
    assert by["rk4", "2 steps"]["flops_per_token"] > by["rk4", "1 step"]["flops_per_token"]
    assert (run / "discretize" / "discretize.png").stat().st_size > 0
    assert "| rk4 | 1 step |" in (run / "discretize" / "discretize.md").read_text()


@pytest.mark.slow
def test_discretize_plot_draws_the_test_time_depth_curve_of_a_looped_block(tmp_path, capsys):
    """A looped block (2 Euler steps of size 1 over S = 2), trained for two steps: ``--plot``
    writes ``depth.png`` and its points, every point finite, the training depth marked and
    the grid past it (2x and 4x the training steps over S; 2x and 4x the loops)."""
    from neuralode_lm.transformer import looped

    model = {"family": "neuralode_lm", "name": "node-transformer", "d_model": 16, "n_heads": 2}
    values = {
        "name": "looped",
        "out_dir": str(tmp_path),
        "seed": 1,
        "model": model | {"d_ff": 32, "max_positions": 64, **looped(2)},
        "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 32},
        "trainer": {"max_steps": 2, "val_every": 2, "val_batches": 1, "progress_bar": False},
        "eval": {"bleu_sentences": 0, "continuation_sentences": 0},
    }
    train(parse_config(values))
    run = tmp_path / "looped"
    argv = ["discretize", str(run), "--plot", "--json", "--max-batches", "1", "--batch-size", "2"]
    assert main([*argv, "--steps", "1", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_role = {row["role"]: row for row in rows if "role" in row}
    assert sorted(by_role) == ["2S", "2x", "4S", "4x", "trained"]
    assert by_role["trained"]["method"] == "euler 2 steps (as trained)"
    assert by_role["trained"]["nfe"] == 2 and by_role["2x"]["nfe"] == 4 == by_role["2S"]["nfe"]
    assert by_role["4x"]["setting"] == "4x training steps (8)" and by_role["4x"]["nfe"] == 8
    assert (
        by_role["4S"]["setting"] == "4x depth (8, 8 steps)" and by_role["4S"]["state_error"] is None
    )
    # as trained is the Euler row of the same grid: the same numbers
    euler2 = next(r for r in rows if (r["method"], r["setting"]) == ("euler", "2 steps"))
    assert by_role["trained"]["ppl"] == euler2["ppl"]
    assert (run / "discretize" / "depth.png").stat().st_size > 0
    points = json.loads((run / "discretize" / "depth.json").read_text())
    flat = [v for xy in points["series"].values() for pair in xy for v in pair]
    flat += points["training"] + [v for pair in points["extrapolation"].values() for v in pair]
    assert flat and all(math.isfinite(v) for v in flat)
    assert sorted(points["extrapolation"]) == ["2S", "2x", "4S", "4x"]
    assert points["extrapolation"]["4x"][0] == 4 * points["training"][0]
    assert {"euler", "rk4", "dopri5"} <= set(points["series"])


def test_depth_curve_past_an_adaptive_solve_takes_rk4_at_its_mean_accepted_steps():
    """A model trained adaptively: its training steps are the mean accepted steps per block
    at its tolerance, and 2x/4x of them are RK4 grids; a time-conditioned field on a grid
    gets no longer-depth rows (its weights are not defined past S)."""
    import torch

    from experiments.evaluation.depth_curve import extrapolation, trained_label, training_steps
    from neuralode_lm import build_model

    small = {"d_model": 16, "n_heads": 2, "d_ff": 32, "max_positions": 16, "dropout": 0.0}
    adaptive = build_model("node-transformer", 11, **small, solver={"method": "bosh3"}).eval()
    tokens = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        adaptive.final_state(tokens)
        steps = training_steps(adaptive, tokens)
    assert steps == math.ceil(adaptive.solver_stats.accepted_steps) >= 1
    assert trained_label(adaptive) == "bosh3 rtol 1e-03 (as trained)"
    rows = extrapolation(adaptive, steps)
    assert [(m, g.method, g.steps, f) for m, _, g, f in rows] == [
        ("rk4", "rk4", 2 * steps, None),
        ("rk4", "rk4", 4 * steps, None),
    ]
    grid = {"solver": {"method": "rk4"}, "steps": 3, "time_conditioning": "weights"}
    timed = build_model("node-transformer", 11, **small, **grid)
    assert [g.steps for _, _, g, _ in extrapolation(timed, 3)] == [6, 12]


def test_a_grammar_family_sample_is_read_in_excess_over_its_own_sentences(tmp_path, tiny_config):
    """``discretize`` scores a sample of the test split: the true grammar's NLL it subtracts
    covers exactly the sentences of the sample (decoded from the batches through their mask),
    so over every batch it is the split's exact NLL, and over the first batches the sum over
    the first sentences of the split; the plots then read the excess loss."""
    from dataclasses import replace

    from experiments.data.grammar_family import family_automaton, family_split
    from experiments.evaluation.depth_curve import curve_points
    from experiments.evaluation.discretize import true_nll_per_token
    from experiments.training.datamodule import load_data
    from experiments.training.metrics import EvalSettings, evaluation_batches

    data_section = {"grammar_depth": 1, "batching": "sentences", "eval_batch_size": 64}
    config = parse_config(tiny_config(tmp_path, "g", data=data_section))
    data = load_data(config.data)
    batches = evaluation_batches(data, "test", EvalSettings.from_config(config))
    words, log_probability = family_split(1, 0, "test")
    tokens = sum(len(sentence) for sentence in words)
    assert true_nll_per_token(data, config, batches) == pytest.approx(
        -log_probability / tokens, rel=1e-12
    )
    automaton = family_automaton(1)
    first = words[: 3 * 64]
    total = sum(automaton.log_probability([automaton.words.index(w) for w in s]) for s in first)
    assert true_nll_per_token(data, config, batches[:3]) == pytest.approx(
        -total / sum(len(s) for s in first), rel=1e-12
    )
    stream = replace(config, data=replace(config.data, batching="stream"))
    assert true_nll_per_token(data, stream, batches) is None  # cut sentences: no exact match
    rows = [{"method": "euler", "nfe": 1, "ppl": 9.6, "excess": 0.0123}]
    assert curve_points(rows)["series"] == {"euler": [[1, 0.0123]]}
    assert curve_points(rows)["metric"][0] == "excess"


@pytest.mark.parametrize("metric_key", ["excess", "ppl"])
def test_depth_plot_keeps_the_highest_points_ring_and_label_inside_the_axes(
    tmp_path, monkeypatch, metric_key
):
    """An extrapolation point above every curve (a looped block run for 4x its depth) is
    ringed and labelled inside the axes, not cut by their top edge."""
    import experiments.plotting
    from experiments.evaluation.depth_curve import curve_points, plot_depth

    scale = 1.0 if metric_key == "excess" else 100.0
    rows = [
        {"method": "euler", "nfe": n, metric_key: scale * v}
        for n, v in ((1, 0.3), (2, 0.004), (4, 0.12), (8, 0.8))
    ]
    rows += [
        {
            "method": "euler 2 steps (as trained)",
            "nfe": 2,
            metric_key: scale * 0.004,
            "role": "trained",
        },
        {"method": "euler", "nfe": 4, metric_key: scale * 0.5, "role": "2S"},
        {"method": "euler", "nfe": 8, metric_key: scale * 2.6, "role": "4S"},
    ]
    drawn = {}
    monkeypatch.setattr(
        experiments.plotting, "save_figure", lambda figure, path: drawn.update(figure=figure)
    )
    plot_depth(curve_points(rows), tmp_path / "depth.png", "a title")
    figure = drawn["figure"]
    figure.canvas.draw()
    axes = figure.axes[0]
    box = axes.get_window_extent()
    labels = [t for t in axes.texts if t.get_text() == "4S"]
    assert len(labels) == 1 and box.contains(*labels[0].get_window_extent().corners()[-1])
    rings = [line for line in axes.lines if line.get_fillstyle() == "none"]
    ring = next(line for line in rings if list(line.get_ydata()) == [scale * 2.6])
    ((_, y),) = axes.transData.transform([[8, scale * 2.6]])
    radius = ring.get_markersize() / 72 * figure.dpi / 2
    assert box.y1 >= y + radius and box.y0 <= y
