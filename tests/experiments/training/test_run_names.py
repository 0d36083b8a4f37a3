"""Iterating on one config: ``--name auto`` gives each changed config its own run folder, and
re-running a finished run says so instead of re-printing as if trained."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from experiments.cli.main import main
from experiments.training.config import load_config
from experiments.training.runs import config_sha256


@pytest.mark.slow
def test_name_auto_names_each_config_and_a_finished_run_says_so(
    tmp_path, tiny_config, capsys
) -> None:
    config_file = tmp_path / "tiny.yaml"
    values = tiny_config(tmp_path / "runs", "ignored", trainer={"max_steps": 2, "val_every": 2})
    config_file.write_text(yaml.safe_dump(values))
    argv = ["train", "--config", str(config_file), "--quiet", "--name", "auto"]

    assert main([*argv, "--optim.lr", "3e-4", "--print_config"]) == 0
    name = yaml.safe_load(capsys.readouterr().out)["name"]
    expected = config_sha256(load_config(config_file, {"optim": {"lr": 3e-4}}))[:10]
    assert name == f"tiny-{expected}"

    assert main([*argv, "--optim.lr", "3e-4"]) == 0
    *_, first_json, first_last = capsys.readouterr().out.strip().splitlines()
    assert first_last == f"wrote {tmp_path / 'runs' / name}"
    assert main([*argv, "--optim.lr", "1e-3"]) == 0  # another lr: another folder, no --overwrite
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and name in folders
    assert all(re.fullmatch(r"tiny-[0-9a-f]{10}", folder) for folder in folders)
    capsys.readouterr()

    result_file = tmp_path / "runs" / name / "result.json"
    stamp = result_file.stat().st_mtime_ns
    assert main([*argv, "--optim.lr", "3e-4"]) == 0
    *_, again_json, again_last = capsys.readouterr().out.strip().splitlines()
    assert json.loads(again_json) == json.loads(first_json)
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path / 'runs' / name))}: already finished, result from "
        r"\d{4}-\d\d-\d\d \d\d:\d\d \(--overwrite retrains\)",
        again_last,
    )
    assert result_file.stat().st_mtime_ns == stamp  # not trained again
