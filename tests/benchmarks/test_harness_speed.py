"""The harness's speed changes change no number a run produces."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.training import allocator
from tests.support.paths import ROOT

_TRAIN = """
import sys
import experiments.training.task
if sys.argv[2] == "off":  # the step as it ran before the allocator setting
    experiments.training.task.keep_freed_memory = lambda: False
from experiments.cli.main import main
sys.exit(main(["train", "--config", sys.argv[1], "--quiet"]))
"""


def _losses(run_dir: Path) -> list[str]:
    with (run_dir / "logs" / "metrics.csv").open() as handle:
        return [row["train/loss"] for row in csv.DictReader(handle) if row.get("train/loss")]


@pytest.mark.slow  # two training processes
def test_keeping_freed_memory_changes_no_loss_of_a_seeded_run(tmp_path, tiny_config) -> None:
    results = {}
    for setting in ("off", "on"):
        config = tiny_config(tmp_path, setting, trainer={"max_steps": 8, "log_every": 1})
        config["eval"] = {"bleu_sentences": 0}
        path = tmp_path / f"{setting}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", _TRAIN, str(path), setting], check=True, env=env)
        results[setting] = json.loads((tmp_path / setting / "result.json").read_text())
    assert len(_losses(tmp_path / "on")) == 8
    assert _losses(tmp_path / "on") == _losses(tmp_path / "off")  # the logged strings, exactly
    for key in ("valid_ppl", "test_ppl"):
        assert results["on"][key] == results["off"][key]


def test_keep_freed_memory_sets_glibcs_thresholds_once() -> None:
    if not sys.platform.startswith("linux"):
        assert allocator.keep_freed_memory() is False
        return
    assert allocator.keep_freed_memory() is True
    assert allocator.keep_freed_memory() is True  # a second call changes nothing
