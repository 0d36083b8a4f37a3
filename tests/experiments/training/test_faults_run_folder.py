"""Faults of loading and writing a run folder, as one table.

Each case damages a copy of a finished run (or the disk under a training run) and asserts
what every user error owes: a non-zero exit, exactly one line on stderr starting with
``odelm: error:``, and no traceback. Cases marked ``forget`` first drop the checksums the
run recorded, as in a run written before they existed, so the loader's own checks (not the
checksum) must catch the damage.
"""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from experiments.cli.main import main
from experiments.data.tokenization import WordTokenizer
from experiments.training.runfolder import RUN_MARKER


def _edit_config(run: Path, **changes) -> None:
    path = run / "model" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _forget_weights_checksum(run: Path) -> None:
    path = run / "model" / "config.json"
    saved = json.loads(path.read_text())
    saved.pop("weights_sha256")
    path.write_text(json.dumps(saved))


def _pickle_weights(run: Path) -> None:
    _forget_weights_checksum(run)
    torch.save({"weight": torch.zeros(3)}, run / "model" / "model.safetensors")


def _truncate_weights(run: Path) -> None:
    _forget_weights_checksum(run)
    weights = run / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _flip_weights(run: Path) -> None:
    weights = run / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x55
    weights.write_bytes(bytes(data))


def _garbage_bpe_tokenizer(run: Path) -> None:
    (run / "tokenizer").unlink()
    (run / "tokenizer").mkdir()
    (run / "tokenizer" / "tokenizer.json").write_text('{"model": 3}')


def _small_tokenizer(run: Path) -> None:
    WordTokenizer(["<eos>", "a", "dog"]).save(run / "tokenizer")
    path = run / "model" / "config.json"
    saved = json.loads(path.read_text())
    saved["metadata"].pop("tokenizer")  # no fingerprint: the vocabulary sizes must be compared
    path.write_text(json.dumps(saved))


CASES: dict[str, tuple[Callable[[Path], None], bool, str]] = {
    # name: (damage, forget the run's recorded checksums, expected words in the line)
    "pickle in model.safetensors": (_pickle_weights, True, "is not a valid weights file"),
    "truncated model.safetensors": (_truncate_weights, True, "is not a valid weights file"),
    "tampered model.safetensors": (_flip_weights, True, "does not match the SHA-256"),
    "tampered, checksums recorded": (_flip_weights, False, "does not match its recorded"),
    "unknown class in config.json": (
        lambda run: _edit_config(run, architecture="ode_transformer.lm:NoSuchModel"),
        True,
        "is not one of the library's models",
    ),
    "unknown module in config.json": (
        lambda run: _edit_config(run, architecture="no_such_module:Model"),
        True,
        "is not one of the library's models",
    ),
    "invalid config.json": (
        lambda run: (run / "model" / "config.json").write_text("{not json"),
        True,
        "is not valid JSON",
    ),
    "config.json not a model config": (
        lambda run: (run / "model" / "config.json").write_text("[1, 2]"),
        True,
        "is not a saved model's config",
    ),
    "config.json with wrong constructor keys": (
        lambda run: _edit_config(run, config={"no_such_key": 1}),
        True,
        "unknown config keys",
    ),
    "garbage tokenizer bytes": (
        lambda run: (run / "tokenizer").write_bytes(b"\xff\xfe\x00garbage"),
        True,
        "is not a tokenizer odelm can read",
    ),
    "tokenizer JSON without tokens": (
        lambda run: (run / "tokenizer").write_text('{"kind": "word"}'),
        True,
        "is not a tokenizer odelm can read",
    ),
    "garbage BPE tokenizer.json": (
        _garbage_bpe_tokenizer,
        True,
        "is not a tokenizer odelm can read",
    ),
    "tokenizer smaller than the model": (_small_tokenizer, True, "the model's vocabulary has"),
    "checksum list not a mapping": (
        lambda run: (run / RUN_MARKER).write_text(json.dumps({"files": [1]})),
        False,
        "is damaged",
    ),
    "checksum list pointing outside the run": (
        lambda run: (run / RUN_MARKER).write_text(json.dumps({"files": {"../x": "0"}})),
        False,
        "a file outside the run",
    ),
}


@pytest.mark.parametrize("command", ["generate", "eval"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_a_damaged_run_is_one_line(trained, tmp_path, capsys, case, command):
    damage, forget, expected = CASES[case]
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    if forget:
        (run / RUN_MARKER).write_text("{}")
    damage(run)
    options = ["--prompt", "a", "--max-new-tokens", "2"] if command == "generate" else []
    assert main([command, str(run), *options]) != 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("odelm: error: "), err
    assert expected in err


def _fail_like_a_full_disk(obj, handle, *args, **kwargs):
    handle.write(b"the first bytes of a checkpoint")
    raise OSError(errno.ENOSPC, "No space left on device")


def _safetensors_full(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device")


def _json_full(path, values):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


DISK_FULL = {
    # where the disk fills: (module, attribute, replacement, expected words)
    "checkpoint": ("torch", "save", _fail_like_a_full_disk, "while writing last.ckpt"),
    "model": (
        "safetensors.torch",
        "save_model",
        _safetensors_full,
        "while writing model.safetensors",
    ),
    "result": ("experiments.training.result", "write_json", _json_full, "writing "),
}


@pytest.mark.parametrize("point", list(DISK_FULL))
@pytest.mark.slow
def test_disk_full_is_one_line(tmp_path, tiny_config, capsys, monkeypatch, point):
    import importlib

    module, name, replacement, expected = DISK_FULL[point]
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(tmp_path, "full", trainer={"max_steps": 4})))
    monkeypatch.setattr(importlib.import_module(module), name, replacement)
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("odelm: error: no space left on ")
    assert expected in err and not (tmp_path / "full" / "result.json").exists()


@pytest.mark.slow
def test_a_failed_first_attempt_does_not_block_the_corrected_config(tmp_path, tiny_config, capsys):
    config_file = tmp_path / "run.yaml"
    broken = tiny_config(tmp_path, "run", model={"no_such_option": 1}, trainer={"max_steps": 2})
    config_file.write_text(yaml.safe_dump(broken))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    assert "no_such_option" in capsys.readouterr().err
    fixed = tiny_config(tmp_path, "run", trainer={"max_steps": 2, "val_every": 2})
    config_file.write_text(yaml.safe_dump(fixed))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-2])["steps"] == 2


def test_a_comparison_folder_that_is_a_file_is_one_line(tmp_path, tiny_model, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        yaml.safe_dump({"shared": {"seed": 0}, "runs": [{"name": "a", "model": tiny_model}]})
    )
    (tmp_path / "out").write_text("a file")
    assert main(["compare", "--grid", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot make comparison folder" in err


@pytest.mark.slow
def test_a_checkpoint_without_a_step_is_one_line(tmp_path, tiny_config, capsys):
    values = tiny_config(tmp_path, "run")
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / RUN_MARKER).write_text("{}")
    (run / "config.yaml").write_text(yaml.safe_dump(values))
    torch.save({"state_dict": {}}, run / "checkpoints" / "last.ckpt")
    assert main(["train", "--config", str(config_file), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no global_step" in err
