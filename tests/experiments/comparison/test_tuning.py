"""Equal tuning (a grid's tune: section) and the seed-noise row: every arm gets the same
trials, a best value at an edge extends every arm's list, the trial at the chosen value is
the arm's run at the trial seed, and the seed-noise runs pair with the baseline's seeds."""

from __future__ import annotations

import csv
import math
from dataclasses import replace

import pytest
import yaml

from experiments.comparison.compare import expand_grid, run_grid
from experiments.comparison.launchers import Launch
from experiments.comparison.tuning import (
    TuneSpec,
    apply_choices,
    extended,
    run_tuning,
    trial_name,
    tune_spec,
)
from experiments.training.config import ConfigError

SHARED = {
    "seed": 0,
    "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 64},
    "trainer": {"max_steps": 6, "val_every": 3, "checkpoint_every": 3, "val_batches": 2},
    "eval": {"bleu_sentences": 5, "continuation_sentences": 3},
}


def _fake_train(best: dict[str, float], calls: list[list[str]]):
    """Validation perplexity (log lr - log best)^2 + 10 for each arm: a bowl around best."""

    def train(todo, record):
        calls.append([name for name, _, _ in todo])
        results = {
            name: {
                "valid_ppl": 10 + math.log(values["optim"]["lr"] / best[name.split("-")[1]]) ** 2
            }
            for name, values, _ in todo
        }
        for name, result in results.items():
            record(name, result)
        return results

    return train


def test_edge_extends_every_arm_and_trials_stay_equal(tmp_path, capsys):
    spec = TuneSpec("optim.lr", (0.5, 1.0, 2.0), seed=1, extend=1)
    arms = {"a": {"optim": {}}, "b": {"optim": {}}}
    calls: list[list[str]] = []
    spec, choices, _ = run_tuning(spec, arms, tmp_path, _fake_train({"a": 1.0, "b": 4.0}, calls))
    assert spec.values == (0.5, 1.0, 2.0, 4.0)  # b's best was at the top edge
    assert choices == {"a": (1.0, None), "b": (4.0, None)}
    assert len(calls[0]) == 6 and sorted(calls[1]) == ["tune-a-lr4", "tune-b-lr4"]
    printed = capsys.readouterr().out
    assert "3 trials per arm, 2 arms, seed 1" in printed and "4 trials per arm" in printed
    assert "WARNING" in printed  # b's best (4) is again the last value, no extension left
    rows = list(csv.DictReader((tmp_path / "tune.csv").open()))
    assert [r["arm"] for r in rows].count("a") == [r["arm"] for r in rows].count("b") == 4
    assert [(r["arm"], r["value"]) for r in rows if r["chosen"] == "True"] == [
        ("a", "1.0"), ("b", "4.0")
    ]  # fmt: skip
    assert (tmp_path / "tune.png").stat().st_size > 0


def test_tune_csv_fills_in_as_the_trials_finish(tmp_path):
    """A sweep of days shows its trials so far: tune.csv is rewritten after each one,
    nothing chosen until the sweep ends."""
    spec = TuneSpec("optim.lr", (0.5, 1.0, 2.0), seed=1, extend=0)
    filled = []

    def train(todo, record):
        for name, values, _ in todo:
            record(name, {"valid_ppl": 10 + values["optim"]["lr"]})
            rows = list(csv.DictReader((tmp_path / "tune.csv").open()))
            assert len(rows) == 6 and {r["chosen"] for r in rows} == {"False"}
            filled.append([r["valid_ppl"] for r in rows].count(""))
        return {name: {"valid_ppl": 10 + values["optim"]["lr"]} for name, values, _ in todo}

    run_tuning(spec, {"a": {"optim": {}}, "b": {"optim": {}}}, tmp_path, train)
    assert filled == [5, 4, 3, 2, 1, 0]  # trials still to come, after each one
    rows = list(csv.DictReader((tmp_path / "tune.csv").open()))
    assert [(r["arm"], r["value"]) for r in rows if r["chosen"] == "True"] == [
        ("a", "0.5"), ("b", "0.5")
    ]  # fmt: skip
    assert (tmp_path / "tune.png").stat().st_size > 0  # drawn once, at the end


def test_a_stalled_trial_is_marked_at_the_top_of_the_plot_not_drawn_to_scale(tmp_path, monkeypatch):
    """A trial far above every chosen one (a stalled run) would squeeze the bowls: the
    y-range ends 30% above the worst chosen trial, the stalled one is marked at that edge and
    listed with its value beside the plot."""
    from experiments.comparison import tuning
    from experiments.plotting import plt

    spec = TuneSpec("optim.lr", (1.0, 2.0, 4.0), seed=1)
    ppl = {(1.0, "a"): 290.0, (2.0, "a"): 280.0, (4.0, "a"): 656.0, (1.0, "b"): 300.0}
    ppl |= {(2.0, "b"): 295.0, (4.0, "b"): 310.0}
    rows = [
        {"arm": arm, "also_value": "", "value": value, "valid_ppl": p, "chosen": p < 296}
        for (value, arm), p in ppl.items()
    ]
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", figures.append)  # kept open to be read
    tuning.plot_tuning(rows, spec, tmp_path / "tune.png")
    (axis,) = figures[0].axes
    assert axis.get_ylim()[1] == pytest.approx(1.3 * 295.0)
    assert [text.get_text() for text in axis.texts] == ["\u2191 off the top:\na at 4: 656"]
    marks = [c.get_offsets().tolist() for c in axis.collections if c.get_offsets().size]
    assert [[4.0, pytest.approx(1.3 * 295.0)]] in marks  # the arrow at the top edge
    close(figures[0])


def test_a_grammar_family_sweep_is_read_in_excess_loss(tmp_path, monkeypatch):
    """On the grammar family the arms differ in the third decimal of the perplexity: tune.csv
    holds each trial's validation excess (log perplexity minus the true grammar's NLL per
    token of the validation split), and the plot and the page's tuning table show it."""
    from experiments.comparison.compute import validation_reference
    from experiments.comparison.pages import tuning_block
    from experiments.plotting import plt

    data = {"corpus": "grammar", "grammar_depth": 1, "seed": 0}
    reference = validation_reference(data)
    excess = {"a": {0.5: 0.0200, 1.0: 0.0050, 2.0: 0.0080}, "b": {0.5: 0.0300, 1.0: 0.0070}}
    excess["b"][2.0] = 0.5  # off the top: 0.007 + log 1.3 < 0.5

    def train(todo, record):
        results = {}
        for name, values, _ in todo:
            arm = name.split("-")[1]
            ppl = math.exp(reference + excess[arm][values["optim"]["lr"]])
            results[name] = {"valid_ppl": ppl}
            record(name, results[name])
        return results

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", figures.append)  # kept open to be read
    spec = TuneSpec("optim.lr", (0.5, 1.0, 2.0), seed=1, extend=0)
    arms = {arm: {"data": data, "optim": {}} for arm in ("a", "b")}
    run_tuning(spec, arms, tmp_path, train)
    rows = list(csv.DictReader((tmp_path / "tune.csv").open()))
    assert [float(r["valid_excess"]) for r in rows] == pytest.approx(
        [0.02, 0.005, 0.008, 0.03, 0.007, 0.5], abs=1e-12
    )
    (axis,) = figures[-1].axes
    assert "excess" in axis.get_ylabel()
    assert axis.get_ylim()[1] == pytest.approx(0.007 + math.log(1.3))  # b's chosen
    assert [text.get_text() for text in axis.texts] == ["\u2191 off the top:\nb at 2: 0.500"]
    close(figures[-1])
    block = tuning_block(tmp_path)
    assert "validation excess (nats/token)" in block
    assert "| a | 0.0200 | **0.0050** | 0.0080 |" in block


def test_extension_is_geometric_on_both_sides():
    assert extended((1.0, 2.0, 4.0), low=True, high=True) == (0.5, 1.0, 2.0, 4.0, 8.0)
    assert extended((0.6, 1.25, 2.5, 5.0), low=False, high=True)[-1] == 10.0


def test_tune_section_is_checked(tmp_path, tiny_model):
    grid = {"shared": SHARED, "runs": [{"name": "a", "model": tiny_model}]}
    assert tune_spec(grid, [3]) is None
    spec = tune_spec({**grid, "tune": {"key": "optim.lr", "values": [1, 2]}}, [3, 4])
    assert spec == TuneSpec("optim.lr", (1.0, 2.0), seed=5, extend=1)  # past the result seeds
    for bad in ({"key": "optim.lr", "values": [2, 1]}, {"key": "optim.lr"}, {"values": [1, 2]},
                {"key": "optim.lr", "values": [1, 2], "extend": -1}, {"key": "x", "values": [1, 2], "typo": 1}):  # fmt: skip
        with pytest.raises(ConfigError, match="tune"):
            tune_spec({**grid, "tune": bad}, [0])


def test_the_tuning_seed_is_kept_out_of_the_results(tiny_model):
    """A trial at a result seed would make that seed's result the best of several trials:
    refused, unless the grid says it reuses the trial (the grids tuned before 0.4)."""
    grid = {"runs": [{"name": "a", "model": tiny_model}]}
    tune = {"key": "optim.lr", "values": [1, 2], "seed": 2}
    with pytest.raises(
        ConfigError, match=r"tune.seed 2 is also one of the grid's seeds \[1, 2, 3\]"
    ):
        tune_spec({**grid, "tune": tune}, [1, 2, 3])
    assert tune_spec({**grid, "tune": tune}, [3, 4]).seed == 2
    reused = tune_spec({**grid, "tune": {**tune, "trial_is_result": True}}, [1, 2, 3])
    assert reused.seed == 2 and reused.trial_is_result
    with pytest.raises(ConfigError, match="trial_is_result must be true or false"):
        tune_spec({**grid, "tune": {**tune, "trial_is_result": "yes"}}, [1])


def test_seed_noise_runs_pair_with_the_baseline_and_take_its_value(tmp_path, tiny_model):
    grid = {
        "shared": SHARED,
        "runs": [
            {"name": "base", "model": {"family": "reference"}},
            {"name": "a", "model": tiny_model},
        ],
        "seeds": [1, 2],
        "seed_noise": 100,
    }
    planned = expand_grid(grid, tmp_path, {})
    noise = [p for p in planned if p.name == "seed-noise"]
    assert [(p.seed, p.pair, p.run) for p in noise] == [
        (101, 1, "seed-noise-seed101"),
        (102, 2, "seed-noise-seed102"),
    ]
    assert noise[0].values["model"] == {"family": "reference"} and noise[0].values["seed"] == 101
    assert [p.name for p in planned[:3]] == ["base", "a", "seed-noise"]  # seed by seed
    spec = TuneSpec("optim.lr", (0.1, 0.2), seed=1, trial_is_result=True)
    tuned = apply_choices(planned, spec, {"base": (0.2, None), "a": (0.1, None)}, "base")
    by_run = {p.run: p for p in tuned}
    assert by_run[trial_name(spec, "base", 0.2, None)].seed == 1  # the trial is the seed-1 run
    kept_out = apply_choices(planned, replace(spec, trial_is_result=False), {"base": (0.2, None), "a": (0.1, None)}, "base")  # fmt: skip
    assert {p.run for p in kept_out} >= {"base-seed1", "a-seed1"}  # the seeds train apart
    assert by_run["a-seed2"].values["optim"]["lr"] == 0.1
    assert by_run["seed-noise-seed102"].values["optim"]["lr"] == 0.2
    with pytest.raises(ConfigError, match="seed_noise"):
        expand_grid({**grid, "seed_noise": -3}, tmp_path, {})


@pytest.mark.slow
def test_a_tuned_grid_writes_the_sweep_the_noise_row_and_holm(tmp_path, tiny_model, capsys):
    """End to end: two arms, two rates, one seed plus its seed-noise twin."""
    grid = {
        "shared": SHARED,
        "runs": [
            {"name": "base", "model": {"family": "reference"}},
            {"name": "rk2", "model": {**tiny_model, "block": "rk2"}},
        ],
        "tune": {
            "key": "optim.lr",
            "values": [0.001, 0.01],
            "extend": 0,
            "seed": 0,
            "trial_is_result": True,
        },
        "seed_noise": 10,
    }
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(grid))
    # two runs at a time give the results of one at a time (tests/experiments/comparison/test_launchers.py)
    results = run_grid(grid_file, tmp_path / "out", launch=Launch(jobs=2))
    out = tmp_path / "out"
    assert {r["run"].split("-lr")[0] for r in results} == {
        "tune-base",
        "tune-rk2",
        "seed-noise-seed10",
    }
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {"cap_bound", "p_holm", "p_value", "pair"} <= set(rows[0])
    assert [r["pair"] for r in rows if r["name"] == "seed-noise"] == ["0"]
    assert len(list(csv.DictReader((out / "tune.csv").open()))) == 4
    printed = capsys.readouterr().out
    assert "[tune] optim.lr over [0.001, 0.01]: 2 trials per arm, 2 arms, seed 0" in printed
    assert "[tune] chosen optim.lr: base" in printed
