"""odelm compare (seeds, tables, plots, resume, fair shared settings) and odelm bench's JSON lines."""

from __future__ import annotations

import csv
import json
import re

import pytest
import yaml

from experiments.cli.bench import REQUIRED_FIELDS, judge
from experiments.cli.main import main
from experiments.comparison.compare import expand_grid, grid_seeds, run_grid
from experiments.comparison.launchers import Launch
from experiments.training.config import ConfigError

SHARED = {
    "seed": 0,
    "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 64},
    "trainer": {"max_steps": 6, "val_every": 3, "checkpoint_every": 3, "val_batches": 2},
    "eval": {"bleu_sentences": 5, "continuation_sentences": 3},
}


@pytest.fixture
def tiny(tiny_model):
    return {**tiny_model, "d_model": 16, "d_ff": 32}


def test_grid_runs_share_data_seed_and_budget(tmp_path, tiny):
    grid = {"shared": SHARED, "runs": [{"name": "a", "model": tiny, "seed": 5}]}
    with pytest.raises(ConfigError, match=r"runs\[0\] sets seed"):
        expand_grid(grid, tmp_path, {})
    grid = {"shared": SHARED, "runs": [{"name": "a", "model": tiny}, {"name": "a", "model": tiny}]}
    with pytest.raises(ConfigError, match="unique name"):
        expand_grid(grid, tmp_path, {})
    grid = {"shared": SHARED, "runs": [{"name": "a", "model": tiny, "optim": {"lr": "x"}}]}
    with pytest.raises(ConfigError, match=r"optim.lr must be float"):
        expand_grid(grid, tmp_path, {})


def test_grid_seeds_come_from_the_cli_or_the_grid(tmp_path, tiny):
    grid = {"shared": SHARED, "runs": [{"name": "a", "model": tiny}]}
    assert grid_seeds(grid, {}) == [0]
    assert grid_seeds(grid, {}, num_seeds=3) == [0, 1, 2]
    assert grid_seeds(grid, {"seed": 5}, num_seeds=2) == [5, 6]
    listed = {**grid, "seeds": [3, 7]}
    assert grid_seeds(listed, {}) == [3, 7]
    assert grid_seeds(listed, {}, num_seeds=2) == [3, 4]
    assert grid_seeds(listed, {"seed": 1}) == [1]
    plans = expand_grid(listed, tmp_path, {})
    assert [(p.name, p.seed, p.run) for p in plans] == [("a", 3, "a-seed3"), ("a", 7, "a-seed7")]
    assert plans[1].values["seed"] == 7 and plans[1].values["name"] == "a-seed7"
    assert [p.run for p in expand_grid(grid, tmp_path, {})] == ["a"]  # one seed: plain name
    for bad in ([], [1, 1], ["x"], 3):
        with pytest.raises(ConfigError, match="seeds must be a list of distinct integers"):
            expand_grid({**grid, "seeds": bad}, tmp_path, {})
    with pytest.raises(ConfigError, match="--seeds must be at least 1"):
        grid_seeds(grid, {}, num_seeds=0)
    with pytest.raises(ConfigError, match="grid baseline 'zz' is not a run; runs: a"):
        expand_grid({**grid, "baseline": "zz"}, tmp_path, {})


@pytest.mark.slow
def test_compare_writes_seed_rows_statistics_plots_and_resumes_without_redoing(
    tmp_path, tiny, capsys
):
    grid_file = tmp_path / "grid.yaml"
    runs = [
        {"name": "rk2", "model": {**tiny, "block": "rk2"}},
        {"name": "bigram", "model": {"family": "reference"}},
    ]
    grid_file.write_text(yaml.safe_dump({"shared": SHARED, "runs": runs, "baseline": "bigram"}))
    out = tmp_path / "out"
    # two runs at a time give the results of one at a time (tests/experiments/comparison/test_launchers.py)
    results = run_grid(grid_file, out, num_seeds=2, launch=Launch(jobs=2))
    assert [(r["name"], r["seed"]) for r in results] == [
        ("rk2", 0), ("bigram", 0), ("rk2", 1), ("bigram", 1)
    ]  # fmt: skip
    assert "[3/4] rk2 seed 1: trained and tested in" in capsys.readouterr().out
    for name in ("results.csv", "results.md", "ppl_vs_step.png", "ppl_vs_time.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "ppl_vs_params.png").stat().st_size > 0  # 1,000x apart: the plot is drawn
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["name"], row["seed"], row["run"]) for row in rows] == [
        ("rk2", "0", "rk2-seed0"), ("bigram", "0", "bigram-seed0"),
        ("rk2", "1", "rk2-seed1"), ("bigram", "1", "bigram-seed1"),
    ]  # fmt: skip
    flops = [float(row["test_flops_per_token"]) for row in rows]
    assert flops[0] == flops[2] > 0 and flops[1] == 0.0  # the bigram only looks tokens up
    assert results[0]["test_flops_sample"].startswith("every batch of the split")
    assert results[0]["test_ppl"] != results[2]["test_ppl"]  # the seeds differ
    table = (out / "results.md").read_text()
    assert "grammar (embedded, seed 0)" in table and "| rk2 | " in table
    rk2 = next(line for line in table.splitlines() if line.startswith("| rk2 |"))
    ppl = [results[0]["test_ppl"], results[2]["test_ppl"]]
    assert f"| {sum(ppl) / 2:.2f} ± {abs(ppl[0] - ppl[1]) / 2**0.5:.2f} (2) (2 cap-bound) |" in rk2
    assert "Δ vs bigram [95% CI]" in table and re.search(r"\[[-+]\d+\.\d+, [-+]\d", rk2)
    finished = out / "runs" / "rk2-seed0" / "result.json"
    stamp = finished.stat().st_mtime_ns
    (out / "runs" / "bigram-seed1" / "result.json").unlink()  # a half-finished grid
    assert main(["compare", "--grid", str(grid_file), "--out", str(out), "--seeds", "2"]) == 0
    printed = capsys.readouterr().out
    assert "[1/4] rk2 seed 0: skipped (finished)" in printed
    assert "[4/4] bigram seed 1: trained and tested in" in printed
    assert finished.stat().st_mtime_ns == stamp  # the finished run was not redone
    again = json.loads((out / "runs" / "bigram-seed1" / "result.json").read_text())
    assert again["test_ppl"] == pytest.approx(results[3]["test_ppl"], rel=1e-6)


@pytest.mark.slow
def test_bench_prints_one_json_record_per_line(capsys):
    assert main(["bench", "corpus-load", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all(set(REQUIRED_FIELDS) <= set(r) for r in records)
    assert records[0]["value"] > 0
    assert main(["bench", "no-such-bench"]) == 2
    assert "valid: " in capsys.readouterr().err


def test_judge_compares_value_with_target_in_the_stated_direction():
    base = {"bench": "b", "metric": "m", "target": 1.0, "unit": "x"}
    assert judge({**base, "value": 0.9, "better": "lower"})["met"] is True
    assert judge({**base, "value": 0.9, "better": "higher"})["met"] is False
    with pytest.raises(ValueError, match="lacks fields"):
        judge({"bench": "b", "value": 1.0})
