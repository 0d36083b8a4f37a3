"""A run folder is untrusted, shared and checked: loading one runs no code, odelm deletes
only what it made, one trainer holds a run folder, and damaged weights or a changed test
split are refused.

Each test fails on the behaviour it rules out: a pickled checkpoint and a
``config.json`` naming a module ran code, run names escaped ``out_dir``, ``--overwrite`` and
``odelm compare`` deleted files odelm never made, two trainers shared one run folder, a
killed ``odelm compare`` left its trainer running, flipped or NaN weights loaded, and a
changed test split was scored against the run's recorded number.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import experiments
from experiments.cli.main import main
from experiments.evaluation.trained import DataChangedError
from experiments.training.checkpoints import UnsafeCheckpointError
from experiments.training.runfolder import LOCK_FILE, RUN_MARKER, RunFilesChangedError
from experiments.training.task import LMTask
from odelm.errors import OdelmError
from odelm.pretrained import (
    ARCHITECTURES,
    CorruptModelError,
    PretrainedError,
    PretrainedMixin,
    load_pretrained,
)
from tests.support.paths import ROOT


class _WritesMarker:
    """Unpickling this calls ``open(path, "w")``: the marker file proves code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err + captured.out
    assert len(err.splitlines()) == 1 and err.startswith("odelm: error: "), err
    return err


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "copy"))


# Security 1: checkpoints load weights-only everywhere.


def test_a_pickled_checkpoint_runs_nothing_on_resume(tmp_path, tiny_config, capsys):
    values = tiny_config(tmp_path, "evil")
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    run = tmp_path / "evil"
    (run / "checkpoints").mkdir(parents=True)
    (run / RUN_MARKER).write_text("{}")
    (run / "config.yaml").write_text(yaml.safe_dump(values))
    ran = tmp_path / "code-ran"
    torch.save({"global_step": 3, "x": _WritesMarker(ran)}, run / "checkpoints" / "last.ckpt")
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    assert "could run code" in _one_error_line(capsys)
    assert not ran.exists()


@pytest.mark.parametrize("options", [{}, {"weights_only": False}])
@pytest.mark.slow
def test_load_from_checkpoint_is_weights_only(trained, tmp_path, options):
    task = LMTask.load_from_checkpoint(trained / "checkpoints" / "last.ckpt", **options)
    assert type(task.model).__name__ == "ODETransformerLM"
    ran = tmp_path / "code-ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _WritesMarker(ran)}, evil)
    with pytest.raises(UnsafeCheckpointError, match="could run code"):
        LMTask.load_from_checkpoint(evil, **options)
    assert not ran.exists()


# Security 2: config.json names only the library's own models.


def test_an_architecture_outside_the_registry_is_refused_before_import(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    config = run / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "architecture": "this:s"}))
    (run / RUN_MARKER).write_text("{}")  # no recorded checksums: the config alone decides
    with pytest.raises(PretrainedError, match="ode_transformer.lm:ODETransformerLM"):
        load_pretrained(run / "model")
    assert main(["generate", str(run), "--prompt", "a", "--max-new-tokens", "2"]) == 2
    assert "'this:s' is not one of the library's models" in _one_error_line(capsys)
    assert "Beautiful is better than ugly" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_module_shipped_in_the_run_folder_is_not_imported(trained, tmp_path):
    run = _copy(trained, tmp_path)
    ran = tmp_path / "code-ran"
    (run / "shipped.py").write_text(
        f"open({str(ran)!r}, 'w')\nfrom ode_transformer.lm import ODETransformerLM as Model\n"
    )
    config = run / "model" / "config.json"
    saved = json.loads(config.read_text())
    config.write_text(json.dumps({**saved, "architecture": "shipped:Model"}))
    (run / RUN_MARKER).write_text("{}")  # no recorded checksums: the config alone decides
    loaded = subprocess.run(
        [sys.executable, "-c", "import experiments; experiments.load_run('.')"],
        cwd=run,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode != 0
    assert "'shipped:Model' is not one of the library's models" in loaded.stderr
    assert not ran.exists()


def test_the_registry_names_every_model_class_of_the_library():
    from experiments.reference import BigramLM, WordLMTransformer
    from neuralode_lm.models import MODELS
    from ode_transformer import ODETransformerLM
    from ode_transformer.encoder import ODETransformerEncoder

    classes = [*MODELS.values(), ODETransformerLM, ODETransformerEncoder]
    classes += [BigramLM, WordLMTransformer]
    assert {f"{c.__module__}:{c.__qualname__}" for c in classes} == ARCHITECTURES


class _UserModel(PretrainedMixin, torch.nn.Module):
    """A user's own model class: loadable through itself, never by name from a file."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)


def test_a_users_own_class_loads_through_itself_only(tmp_path):
    _UserModel(3).save_pretrained(tmp_path)
    assert isinstance(_UserModel.from_pretrained(tmp_path), _UserModel)
    with pytest.raises(PretrainedError, match="_UserModel' is not one of the library's models"):
        load_pretrained(tmp_path)


# Security 3: a run name is one safe folder name.


@pytest.mark.parametrize("name", ["../escaped", "/tmp/absolute-run", ".", "..", "", "a/b", ".x"])
@pytest.mark.slow
def test_unsafe_run_names_are_refused_before_anything_is_written(
    tmp_path, tiny_config, capsys, name
):
    out = tmp_path / "out"
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(out, "run")))
    assert main(["train", "--config", str(config_file), "--name", name]) == 2
    assert "is not one folder name" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]
    assert not Path("/tmp/absolute-run").exists()


def test_a_grid_run_name_cannot_escape_the_output_folder(tmp_path, tiny_model, capsys):
    grid = tmp_path / "grid.yaml"
    runs = [{"name": "../../victim", "model": tiny_model}]
    grid.write_text(yaml.safe_dump({"shared": {"seed": 0}, "runs": runs}))
    assert main(["compare", "--grid", str(grid), "--out", str(tmp_path / "a" / "b")]) == 2
    assert "runs[0] name '../../victim' is not one folder name" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


# Security 4: --overwrite and compare delete only what odelm made.


def test_overwrite_refuses_a_folder_odelm_did_not_make(tmp_path, tiny_config, capsys):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    for name, text in [("config.yaml", "a: 1\n"), ("important.txt", "x"), ("src/main.py", "")]:
        (project / name).write_text(text)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(tmp_path, "project")))
    assert main(["train", "--config", str(config_file), "--overwrite"]) == 2
    assert "odelm did not make it" in _one_error_line(capsys)
    found = sorted(str(p.relative_to(project)) for p in project.rglob("*"))
    assert found == ["config.yaml", "important.txt", "src", "src/main.py"]


@pytest.mark.slow
def test_overwrite_replaces_only_the_files_odelm_made(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "last.ckpt").write_bytes(b"stale")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["out_dir"] = str(tmp_path)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump({**config, "name": "copy"}))
    assert main(["train", "--config", str(config_file), "--quiet", "--overwrite"]) == 0
    capsys.readouterr()
    assert (run / "notes.txt").read_text() == "mine"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_compare_never_deletes_files_it_did_not_make(tmp_path, tiny_model, capsys):
    out = tmp_path / "out"
    victim = out / "runs" / "lstm"
    victim.mkdir(parents=True)
    (victim / "config.yaml").write_text("name: lstm\n")
    (victim / "precious.txt").write_text("keep me")
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        yaml.safe_dump({"shared": {"seed": 0}, "runs": [{"name": "lstm", "model": tiny_model}]})
    )
    (out / ".odelm-comparison").write_text("{}")  # even inside odelm's own comparison folder
    assert main(["compare", "--grid", str(grid), "--out", str(out)]) == 2
    assert f"{victim} is not empty and odelm did not make it" in _one_error_line(capsys)
    assert (victim / "precious.txt").read_text() == "keep me"
    (out / ".odelm-comparison").unlink()  # and a folder that is not a comparison at all
    assert main(["compare", "--grid", str(grid), "--out", str(out)]) == 2
    assert f"{out} is not empty and odelm did not make it" in _one_error_line(capsys)
    assert (victim / "precious.txt").read_text() == "keep me"


# Silently wrong: lock, orphaned trainer, damaged weights, changed data.


def test_a_second_trainer_on_a_locked_run_is_refused_naming_the_holder(
    tmp_path, tiny_config, capsys
):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from pathlib import Path; from experiments.training.runfolder import "
                "claimed_run\nwith claimed_run(Path(sys.argv[1])):\n print('locked', flush=True)"
                "\n time.sleep(120)"
            ),
            str(run),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        config_file = tmp_path / "run.yaml"
        config_file.write_text(yaml.safe_dump(tiny_config(tmp_path, "run")))
        assert main(["train", "--config", str(config_file), "--quiet"]) == 2
        assert f"in use by another odelm process (PID {holder.pid})" in _one_error_line(capsys)
        assert not (run / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_compare_kills_its_trainer(tmp_path, tiny_model):
    grid = tmp_path / "grid.yaml"
    shared = {"seed": 0, "data": {"corpus": "grammar"}, "trainer": {"max_steps": 10**6}}
    grid.write_text(
        yaml.safe_dump({"shared": shared, "runs": [{"name": "long", "model": tiny_model}]})
    )
    compare = subprocess.Popen(
        [sys.executable, "-m", "experiments", "compare", "--grid", str(grid)]
        + ["--out", str(tmp_path / "out"), "--num-threads", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lock = tmp_path / "out" / "runs" / "long" / LOCK_FILE
    trainer = None
    try:
        deadline = time.monotonic() + 180
        while trainer is None and time.monotonic() < deadline:
            text = lock.read_text().strip() if lock.is_file() else ""
            trainer = int(text) if text else None
            time.sleep(0.1)
        assert trainer is not None and trainer != compare.pid, "the trainer never started"
        compare.send_signal(signal.SIGKILL)
        compare.wait()
        deadline = time.monotonic() + 60
        while _alive(trainer) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(trainer)
    finally:
        compare.kill()
        if trainer is not None and _alive(trainer):
            os.kill(trainer, signal.SIGKILL)


def test_flipped_bytes_in_the_weights_are_refused(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    weights = run / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(RunFilesChangedError, match="does not match its recorded SHA-256"):
        experiments.load_run(run)
    with pytest.raises(CorruptModelError, match="does not match the SHA-256 recorded"):
        load_pretrained(run / "model")
    assert main(["generate", str(run), "--prompt", "a", "--max-new-tokens", "2"]) == 2
    assert "model.safetensors does not match" in _one_error_line(capsys)


def test_a_model_with_nan_weights_is_refused(tmp_path):
    from experiments.reference import BigramLM

    model = BigramLM(12)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    model.save_pretrained(tmp_path)
    with pytest.raises(CorruptModelError, match="non-finite weights"):
        load_pretrained(tmp_path)


def test_a_changed_split_is_refused_unless_allowed(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = "the cat sat on the mat\na dog sat on the cat\nthe dog ran\n"
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text(lines)
    values = {
        "name": "text",
        "out_dir": str(tmp_path / "runs"),
        "model": {"family": "reference"},
        "data": {"corpus": "text", "data_dir": str(corpus), "batch_size": 2, "bptt": 8},
        "trainer": {"max_steps": 2, "val_every": 2, "progress_bar": False, "num_threads": 1},
        "eval": {"bleu_sentences": 0},
    }
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    capsys.readouterr()
    run = str(tmp_path / "runs" / "text")
    assert main(["eval", run, "--json"]) == 0
    capsys.readouterr()
    (corpus / "test.txt").write_text("the dog sat on the mat\n")
    assert main(["eval", run, "--json"]) == 2
    assert "the test split of text differs" in _one_error_line(capsys)
    with pytest.raises(DataChangedError):
        experiments.load_run(run).data()
    assert main(["eval", run, "--json", "--allow-changed-data"]) == 0
    assert json.loads(capsys.readouterr().out)["ppl"] > 0


def test_every_load_error_is_an_odelm_error():
    assert issubclass(UnsafeCheckpointError, OdelmError)
    assert issubclass(CorruptModelError, OdelmError) and issubclass(DataChangedError, OdelmError)
