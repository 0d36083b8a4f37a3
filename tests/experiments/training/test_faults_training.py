"""Faults in training: kills at every point of the validate/checkpoint cycle, changed
configs, resumed history, budgets out of range, a full disk, and one-line errors.

Each test fails on the behaviour it rules out: a kill between ``best.ckpt`` and
``last.ckpt`` selected stale weights, a changed config reused the old result, a resume
erased ``metrics.csv`` and counted one process's time, ``max_steps: 0`` trained nothing and
exited 0, a full disk printed a C++ traceback and left a ``.partial`` file.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from experiments.cli.main import main
from experiments.training.checkpoints import DiskFullError, atomic_save, read_checkpoint
from experiments.training.config import ConfigError, load_config, parse_config
from experiments.training.identity import identity
from experiments.training.runfolder import RUN_MARKER
from experiments.training.train import train
from tests.support.paths import ROOT

STEPS = 16
TRAINER = {"max_steps": STEPS, "val_every": 4, "checkpoint_every": 2}
OPTIM = {"lr": 0.02}  # large enough that validation perplexity is not monotone

# Runs in a fresh process: trains the config, exiting with status 9 (as a kill would: no
# cleanup, no flush) at the named point when the run reaches STEP. Status 3: never reached.
KILLER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from odelm.lightning import pl
    import experiments.training.checkpoints as checkpoints
    import experiments.training.result as result
    import experiments.training.train as training
    from experiments.training.config import load_config

    config_file, point, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seen = {}

    def kill():
        os._exit(9)

    class Killer(pl.Callback):
        def on_train_start(self, trainer, task):
            seen["trainer"] = trainer
        def on_validation_start(self, trainer, task):
            if point == "before-validation" and trainer.global_step == step:
                kill()
        def on_validation_end(self, trainer, task):
            if point == "after-validation" and trainer.global_step == step:
                kill()

    real_save = checkpoints.atomic_save

    def save(obj, path):
        at = seen["trainer"].global_step if "trainer" in seen else -1
        name = Path(path).name
        if point == "mid-write-" + name and at == step:
            Path(str(path) + ".partial").write_bytes(b"half a checkpoint")
            kill()
        real_save(obj, path)
        if point == "after-" + name and at == step:
            kill()

    checkpoints.atomic_save = save
    if point == "before-result":
        result.evaluate = lambda *args, **kwargs: kill()
    training.train(load_config(config_file), callbacks=[Killer()])
    sys.exit(3)
    """
)

# Validation perplexity at steps 4, 8, 12, 16 of this run: about 62.0, 61.1, 58.8, 59.8
# (the reference test below checks the shape): step 12 is the best, step 16 is worse.
KILL_POINTS = [
    ("before-validation", 12),
    ("after-validation", 12),
    ("mid-write-best.ckpt", 12),
    ("after-best.ckpt", 12),
    ("mid-write-last.ckpt", 12),
    ("after-last.ckpt", 12),
    ("after-last.ckpt", 6),  # a periodic checkpoint between validations
    ("after-validation", STEPS),
    ("after-last.ckpt", STEPS),
    ("before-result", STEPS),
]


def _config(tiny_config, out_dir: Path, name: str) -> dict:
    # data order 1: the kill points were chosen on this order's validation curve
    return tiny_config(out_dir, name, trainer=TRAINER, optim=OPTIM, data={"order": 1})


def _validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    with (run_dir / "logs" / "metrics.csv").open() as handle:
        return [
            (int(r["step"]), float(r["val/ppl"])) for r in csv.DictReader(handle) if r["val/ppl"]
        ]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_config) -> tuple[dict, Path]:
    """The uninterrupted run every killed-and-resumed run must reproduce."""
    folder = tmp_path_factory.mktemp("reference")
    result = train(parse_config(_config(tiny_config, folder, "reference")))
    return result, folder / "reference"


def _run_until_killed(config: dict, point: str, step: int, folder: Path) -> None:
    config_file = folder / f"{config['name']}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    status = subprocess.run(
        [sys.executable, "-c", KILLER, str(config_file), point, str(step)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert status.returncode == 9, f"the kill point was not reached:\n{status.stderr[-3000:]}"


@pytest.mark.slow
def test_reference_run_selects_a_validation_before_the_last(reference):
    """The kill points assume the best validation is at step 12 and step 16 is worse: a
    stale best score in ``last.ckpt`` would then select step 16's weights."""
    result, run_dir = reference
    curve = [ppl for _, ppl in _validation_curve(run_dir)]
    assert len(curve) == STEPS // TRAINER["val_every"]
    assert min(curve) == curve[2] < curve[3]
    assert result["valid_ppl"] == pytest.approx(curve[2], abs=1e-6)
    assert result["selected"] == "best validation"


@pytest.mark.slow
@pytest.mark.parametrize(("point", "step"), KILL_POINTS)
def test_kill_anywhere_in_the_cycle_then_resume_gives_the_uninterrupted_result(
    tmp_path, tiny_config, reference, point, step
):
    expected, reference_dir = reference
    config = _config(tiny_config, tmp_path, "killed")
    _run_until_killed(config, point, step, tmp_path)
    assert not (tmp_path / "killed" / "result.json").exists()
    resumed = train(parse_config(config))
    assert (resumed["steps"], resumed["selected"]) == (expected["steps"], expected["selected"])
    for key in ("valid_ppl", "test_ppl"):
        assert resumed[key] == pytest.approx(expected[key], abs=1e-6), key
    want = _weights(reference_dir)
    got = _weights(tmp_path / "killed")
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)
    # the full validation history survives the resumption (item 3)
    got_curve, want_curve = _validation_curve(tmp_path / "killed"), _validation_curve(reference_dir)
    assert [s for s, _ in got_curve] == [s for s, _ in want_curve]
    assert [p for _, p in got_curve] == pytest.approx([p for _, p in want_curve], abs=1e-6)
    assert not list((tmp_path / "killed" / "checkpoints").glob("*.partial"))


@pytest.mark.slow
def test_resume_keeps_history_and_counts_every_process(tmp_path, tiny_config, reference):
    config = _config(tiny_config, tmp_path, "resumed")
    _run_until_killed(config, "after-last.ckpt", 8, tmp_path)
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    state = read_checkpoint(last)
    assert state["global_step"] == 8
    # Pretend the killed process trained for 1000 s: the total must include it.
    state["callbacks"]["Timer"]["time_elapsed"]["train"] = 1000.0
    state["callbacks"]["ThroughputMeter"]["seconds"] = 1000.0
    atomic_save(state, last)
    rows_before = _validation_curve(tmp_path / "resumed")
    assert rows_before == _validation_curve(reference[1])[:2]
    result = train(parse_config(config))
    assert result["train_seconds"] > 1000.0
    tokens = STEPS * 8 * 16  # steps x batch x predicted tokens per window
    assert result["train_tokens_per_s"] < tokens / 1000.0
    assert _validation_curve(tmp_path / "resumed")[:2] == rows_before


@pytest.mark.slow
def test_changed_config_is_refused_naming_the_keys_unless_overwritten(
    tmp_path, tiny_config, capsys
):
    values = tiny_config(tmp_path, "run", trainer={"max_steps": 4, "val_every": 2})
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[-2])
    saved = (tmp_path / "run" / "config.yaml").read_text()

    changed = tiny_config(
        tmp_path, "run", trainer={"max_steps": 6, "val_every": 2}, optim={"lr": 0.01}
    )
    config_file.write_text(yaml.safe_dump(changed))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("odelm: error: run ")
    assert "optim.lr: 0.001 -> 0.01" in err and "trainer.max_steps: 4 -> 6" in err
    assert "--overwrite" in err and "new name" in err
    assert (tmp_path / "run" / "config.yaml").read_text() == saved  # not rewritten

    # keys that do not change the result do not count: a finished run is reused
    moved = {**values, "trainer": {**values["trainer"], "num_threads": 2, "progress_bar": True}}
    assert train(parse_config(moved)) == first
    assert not {"trainer.num_threads", "out_dir", "data.data_dir"} & set(
        identity(parse_config(moved))
    )

    assert main(["train", "--config", str(config_file), "--quiet", "--overwrite"]) == 0
    again = json.loads(capsys.readouterr().out.splitlines()[-2])
    assert again["steps"] == 6 and again["config_sha256"] != first["config_sha256"]
    assert load_config(tmp_path / "run" / "config.yaml").optim.lr == 0.01


GRID_SHARED = {
    "seed": 0,
    "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 64},
    "trainer": {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "val_batches": 1},
    "eval": {"bleu_sentences": 5, "continuation_sentences": 3},
}


@pytest.mark.slow
def test_compare_names_a_failed_run_keeps_the_others_and_retrains_changed_configs(
    tmp_path, tiny_model, capsys
):
    runs = [
        # a model: section of valid keys and types that its model refuses when built
        {"name": "broken", "model": {**tiny_model, "d_model": 30, "n_heads": 4}},
        {"name": "fine", "model": tiny_model},
    ]
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"shared": GRID_SHARED, "runs": runs}))
    out = tmp_path / "out"
    assert main(["compare", "--grid", str(grid), "--out", str(out), "--jobs", "2"]) == 2
    captured = capsys.readouterr()
    threads, err = captured.err.strip().split("\n")  # the thread policy's line first
    log = out / "logs" / "broken.log"
    assert threads.startswith("threads: ") and "broken" in err and str(log) in err
    lines = captured.out.splitlines()
    at = next(i for i, line in enumerate(lines) if "broken seed 0: FAILED (exit " in line)
    assert lines[at].endswith(f"see {log}")
    tail = lines[at + 1 : at + 6]  # the log's last lines, indented under it
    assert tail[0].startswith("    | ") and any("not divisible by n_heads=4" in t for t in tail)
    assert "1 trained, 0 kept, 1 failed of 2 runs" in captured.out
    finished = out / "runs" / "fine" / "result.json"
    assert json.loads(finished.read_text())["steps"] == 4
    assert "| fine |" in (out / "results.md").read_text()
    # a longer budget on the finished grid re-trains the run instead of keeping it
    assert main(["compare", "--grid", str(grid), "--out", str(out), "--max-steps", "6"]) == 2
    assert json.loads(finished.read_text())["steps"] == 6
    assert (
        "[2/2] fine seed 0: config changed (trainer.max_steps: 4 -> 6)" in capsys.readouterr().out
    )
    stamp = finished.stat().st_mtime_ns
    assert main(["compare", "--grid", str(grid), "--out", str(out), "--max-steps", "6"]) == 2
    assert finished.stat().st_mtime_ns == stamp  # the same config again: kept


@pytest.mark.parametrize(
    ("section", "key", "value", "bound"),
    [
        ("trainer", "max_steps", None, ""),  # null, and no max_epochs: no budget
        ("trainer", "max_steps", -1, ">= 1 or null"),  # null: the budget is max_epochs
        ("trainer", "max_steps", 0, ">= 1 or null"),
        ("trainer", "max_epochs", 0, ">= 1 or null"),
        ("trainer", "val_every", 0, ">= 1"),
        ("data", "eval_window", 0, ">= 2"),
        ("trainer", "num_threads", -1, ">= 1 or null"),
        ("trainer", "checkpoint_every", 0, ">= 1"),
        ("data", "batch_size", 0, ">= 1"),
        ("trainer", "max_time_s", 0.0, "> 0 or null"),
    ],
)
@pytest.mark.slow
def test_budgets_out_of_range_name_the_key_and_the_range(
    tmp_path, tiny_config, capsys, section, key, value, bound
):
    values = tiny_config(tmp_path, **{section: {key: value}})
    no_budget = value is None  # no step budget, and no epoch budget either
    no_budget_error = "set a budget: trainer.max_steps or trainer.max_epochs (or both)"
    message = no_budget_error if no_budget else rf"{section}\.{key} = {value} is out of range"
    with pytest.raises(ConfigError, match=re.escape(message) if no_budget else message):
        parse_config(values)
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file)]) == 2
    err = capsys.readouterr().err.strip()
    if no_budget:
        assert err == f"odelm: error: {no_budget_error}"
    else:  # the key as the file spells it, whatever form odelm train reads it in
        assert err == f"odelm: error: {section}.{key} = {value} is out of range; it must be {bound}"
    assert not (tmp_path / "run").exists()


def _fail_like_a_full_disk(obj, handle, *args, **kwargs):
    handle.write(b"the first bytes of a checkpoint")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_during_a_write_keeps_the_old_file_and_leaves_no_partial(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({"step": 1}, path)
    monkeypatch.setattr(torch, "save", _fail_like_a_full_disk)
    with pytest.raises(DiskFullError, match=f"no space left on {tmp_path} ") as caught:
        atomic_save({"step": 2}, path)
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert read_checkpoint(path) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_disk_full_during_training_is_one_line(tmp_path, tiny_config, monkeypatch, capsys):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(tmp_path, "full", trainer={"max_steps": 4})))
    monkeypatch.setattr(torch, "save", _fail_like_a_full_disk)
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    checkpoints = tmp_path / "full" / "checkpoints"
    assert err.startswith(f"odelm: error: no space left on {checkpoints} while writing")
    assert len(err.splitlines()) == 1
    assert not list(checkpoints.glob("*.partial"))


@pytest.fixture
def small_filesystem(tmp_path) -> Path:
    """A 256 KiB tmpfs (needs root and mount permission; skipped with the reason otherwise)."""
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_disk_full_on_a_real_small_filesystem(small_filesystem):
    path = small_filesystem / "last.ckpt"
    atomic_save({"w": torch.zeros(10)}, path)
    with pytest.raises(DiskFullError, match=f"no space left on {small_filesystem} "):
        atomic_save({"w": torch.zeros(200_000)}, path)  # 800 KB into 256 KiB
    assert sorted(p.name for p in small_filesystem.iterdir()) == ["last.ckpt"]
    assert read_checkpoint(path)["w"].shape == (10,)


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    config_file = tmp_path / "broken.yaml"
    config_file.write_text("name: x\ntrainer:\n  max_steps: [1, 2\n  val_every: 3\n")
    assert main(["train", "--config", str(config_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"odelm: error: YAML syntax error in {config_file}, line ")
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_corrupt_checkpoint_is_named(tmp_path, tiny_config, capsys):
    values = tiny_config(tmp_path, "corrupt", trainer={"max_steps": 4})
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    last = tmp_path / "corrupt" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    (tmp_path / "corrupt" / RUN_MARKER).write_text("{}")  # a run folder odelm made
    (tmp_path / "corrupt" / "config.yaml").write_text(yaml.safe_dump(values))
    last.write_bytes(b"PK\x03\x04 truncated")
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"odelm: error: {last} is corrupt or truncated")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "trainer", [{"accelerator": "no-such-device"}, {"devices": 0}, {"precision": "7"}]
)
@pytest.mark.slow
def test_lightning_configuration_errors_are_one_line(tmp_path, tiny_config, capsys, trainer):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(tmp_path, "bad", trainer=trainer)))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    (key,) = trainer  # refused by Lightning, or when the config is parsed (precision's choices)
    assert err.startswith(
        (
            "odelm: error: Lightning rejected the trainer settings: ",
            f"odelm: error: trainer.{key} ",  # the key as the file spells it
        )
    )
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_diverging_run_ends_in_one_line_and_writes_no_result(tmp_path, tiny_config, capsys):
    values = tiny_config(tmp_path, "nan", optim={"lr": 1e6, "grad_clip": None})
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at step " in err and "optim.lr" in err
    assert not (tmp_path / "nan" / "result.json").exists()
    assert not (tmp_path / "nan" / "model").exists()


def test_debug_shows_the_traceback_and_bugs_keep_theirs(tmp_path, capsys, monkeypatch):
    missing = str(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        main(["--debug", "train", "--config", missing])

    from experiments.cli import commands

    def bug(*args, **kwargs):
        raise KeyError("a programming error")

    monkeypatch.setattr(commands, "parse_config", bug)
    with pytest.raises(KeyError, match="a programming error"):
        main(["train", "--model.family", "ode_transformer"])


def test_a_solver_failure_in_training_names_the_step(tmp_path, tiny_config, capsys):
    solver = {"method": "dopri5", "rtol": 1e-9, "atol": 1e-9, "max_num_steps": 1}
    model = {"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8, "hidden_dim": 8}
    values = tiny_config(tmp_path, "stiff", trainer={"max_steps": 2})
    values["model"] = {**model, "field_hidden": 8, "solver": solver}
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("odelm: error: training stopped at step 0: ")
    assert "max_num_steps" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "stiff" / "result.json").exists()


@pytest.mark.parametrize(
    ("sections", "hint"),
    [
        ({"eval": {"prompt_len": 50}, "trainer": {"max_steps": 2}}, "lower eval.prompt_len"),
        ({"data": {"corpus": "text", "batch_size": 64}}, "lower data.batch_size"),
    ],
)
@pytest.mark.slow
def test_settings_too_large_for_the_data_are_one_line(
    tmp_path, tiny_config, text_corpus_dir, capsys, sections, hint
):
    values = tiny_config(tmp_path, "big", **sections)
    values["data"]["data_dir"] = str(text_corpus_dir)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("odelm: error: ") and hint in err and len(err.splitlines()) == 1


def test_a_key_added_later_keeps_old_runs_hashes() -> None:
    """A run made before ``trainer.compile`` existed has no such key; at its default the
    key is left out of the identity, so that run's hash (and its resumption) is unchanged,
    while turning it on is a change."""
    from experiments.training.identity import HASHED_03, config_sha256, neutral

    values = {"model": {"family": "reference"}, "trainer": {"max_steps": 4}}
    plain = parse_config(values)
    later = {"trainer.compile", "data.shuffle", "trainer.max_time", "data.order"}
    later |= {"trainer.matmul_precision", "data.grammar_depth"}
    assert not later & HASHED_03
    assert [neutral(key) for key in sorted(later)] == [None, 1, True, False, "highest", None]
    assert "trainer.compile" not in identity(plain)
    assert "data.grammar_depth" not in identity(plain)
    assert "trainer.matmul_precision" not in identity(plain)
    old_style = {k: v for k, v in plain.to_dict().items()}
    old_style["trainer"] = {k: v for k, v in old_style["trainer"].items() if k != "compile"}
    assert config_sha256(parse_config(old_style)) == config_sha256(plain)
    tf32 = parse_config({**values, "trainer": {"max_steps": 4, "matmul_precision": "high"}})
    assert identity(tf32)["trainer.matmul_precision"] == "high"
    assert config_sha256(tf32) != config_sha256(plain)
    compiled = parse_config({**values, "trainer": {"max_steps": 4, "compile": True}})
    assert identity(compiled)["trainer.compile"] is True
    assert config_sha256(compiled) != config_sha256(plain)
