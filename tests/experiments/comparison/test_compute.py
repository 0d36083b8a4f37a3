"""Equal training compute: FLOPs to reach the baseline's best, and the figure, from logs."""

from __future__ import annotations

import pytest
import yaml

from experiments.comparison.compute import write_compute


def _run(out, name, seed, flops_per_token, curve):
    run = f"{name}-seed{seed}"
    folder = out / "runs" / run
    (folder / "logs").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": {"batch_size": 2, "bptt": 5}}))
    rows = ["step,val/ppl,val/elapsed_s"] + [f"{s},{v},{s / 10}" for s, v in curve]
    (folder / "logs" / "metrics.csv").write_text("\n".join(rows) + "\n")
    return {"name": name, "seed": seed, "run": run, "test_flops_per_token": flops_per_token}


def test_flops_to_the_baselines_best(tmp_path):
    """Baseline best 50 (seeds 50 and 50); the model reaches it at step 20 on one seed (3 x
    100 FLOPs x 10 tokens x 20 steps = 60,000) and never on the other."""
    results = [
        _run(tmp_path, "base", 1, 10.0, [(10, 80.0), (20, 50.0)]),
        _run(tmp_path, "base", 2, 10.0, [(10, 70.0), (20, 50.0)]),
        _run(tmp_path, "deep", 1, 100.0, [(10, 60.0), (20, 45.0)]),
        _run(tmp_path, "deep", 2, 100.0, [(10, 60.0), (20, 55.0)]),
    ]
    written = write_compute(tmp_path, results, "base")
    table = (tmp_path / "compute.md").read_text()
    assert "(50.00, mean over its seeds)" in table
    assert "| deep | 6e+04 | 1 of 2 |" in table
    assert "| base | 6e+03 | 2 of 2 |" in table  # 3 x 10 x 10 x 20
    assert (tmp_path / "ppl_vs_compute.png").stat().st_size > 0 and len(written) == 2


def test_sentence_batches_have_no_compute_curve(tmp_path):
    result = _run(tmp_path, "base", 1, 10.0, [(10, 80.0)])
    (tmp_path / "runs" / result["run"] / "config.yaml").write_text(
        yaml.safe_dump({"data": {"batching": "sentences", "batch_size": 2}})
    )
    assert write_compute(tmp_path, [result], "base") == []
    with pytest.raises(FileNotFoundError):
        (tmp_path / "compute.md").read_text()


def test_seeds_with_different_flops_per_step_still_draw_their_mean_line(tmp_path):
    """An adaptive solver's seeds differ in FLOPs per token (100 and 300): the mean line's
    x at each step is the mean of the seeds' cumulative FLOPs (3 x 10 tokens x step x 200)."""
    from experiments.comparison.compute import compute_curves, compute_figure, flops_to_target
    from experiments.plotting import plt

    results = [
        _run(tmp_path, "base", 1, 10.0, [(10, 80.0), (20, 50.0)]),
        _run(tmp_path, "ode", 1, 100.0, [(10, 90.0), (20, 70.0)]),
        _run(tmp_path, "ode", 2, 300.0, [(10, 95.0), (20, 75.0)]),
    ]
    curves = compute_curves(tmp_path, results)
    target, _ = flops_to_target(curves, "base")
    figure = compute_figure(tmp_path, results, curves, "base", target)
    left = figure.axes[0]
    lines = {line.get_label(): line for line in left.get_lines()}
    assert list(lines["ode"].get_xdata()) == [6e4, 1.2e5]
    assert list(lines["ode"].get_ydata()) == [92.5, 72.5]
    plt.close(figure)
