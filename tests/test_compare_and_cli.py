"""odelm compare (tables, plots, resume, fair shared settings) and odelm bench's JSON lines."""

from __future__ import annotations

import json

import pytest
import yaml

from experiments.bench import REQUIRED_FIELDS, judge
from experiments.cli import main
from experiments.compare import expand_grid, run_grid
from experiments.config import ConfigError

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


@pytest.mark.slow
def test_compare_writes_tables_plots_and_resumes_without_redoing(tmp_path, tiny):
    grid_file = tmp_path / "grid.yaml"
    runs = [
        {"name": "rk2", "model": {**tiny, "block": "rk2"}},
        {"name": "bigram", "model": {"family": "reference"}},
    ]
    grid_file.write_text(yaml.safe_dump({"shared": SHARED, "runs": runs}))
    out = tmp_path / "out"
    results = run_grid(grid_file, out)
    assert [r["name"] for r in results] == ["rk2", "bigram"]
    for name in (
        "results.csv",
        "results.md",
        "ppl_vs_step.png",
        "ppl_vs_time.png",
        "ppl_vs_params.png",
    ):
        assert (out / name).stat().st_size > 0
    table = (out / "results.md").read_text()
    assert "grammar (embedded, seed 0)" in table and "| rk2 |" in table
    finished = out / "runs" / "rk2" / "result.json"
    stamp = finished.stat().st_mtime_ns
    (out / "runs" / "bigram" / "result.json").unlink()  # a half-finished grid
    again = run_grid(grid_file, out)
    assert finished.stat().st_mtime_ns == stamp  # the finished run was not redone
    assert again[1]["test_ppl"] == pytest.approx(results[1]["test_ppl"], rel=1e-6)


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
