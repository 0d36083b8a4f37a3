"""``trainer.accelerator: auto`` by default: a GPU is used where CUDA sees one,
and the run identity of every existing config is unchanged (``auto`` is hashed as ``cpu``,
the default before it; the pinned hashes of ``test_config_identity`` hold)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.training.config import TrainerConfig, parse_config
from experiments.training.runs import config_sha256, identity
from experiments.training.trainer import lightning_accelerator
from tests.support.paths import ROOT

GRIDS = ROOT / "experiments" / "configs" / "grids"
PINNED = "e237b71472e628877633185169c0b246636e435c8f08ed8799ab69f617b3e856"
"""``node-lm-table1-cpu`` ``base-lstm``'s hash (``tests/experiments/training/test_config_identity.py``)."""


def test_the_default_accelerator_is_auto() -> None:
    assert TrainerConfig().accelerator == "auto"


def test_auto_and_cpu_are_one_identity_and_gpu_another(tmp_path, tiny_config) -> None:
    hashes = {
        name: config_sha256(parse_config(tiny_config(tmp_path, trainer={"accelerator": name})))
        for name in ("auto", "cpu", "gpu")
    }
    default = parse_config(tiny_config(tmp_path))
    assert default.trainer.accelerator == "auto"
    assert config_sha256(default) == hashes["auto"] == hashes["cpu"] != hashes["gpu"]
    assert identity(default)["trainer.accelerator"] == "cpu"  # as hashed before auto


def test_a_pinned_grid_run_keeps_its_hash_under_the_new_default() -> None:
    from experiments.comparison.compare import expand_grid
    from experiments.training.config import load_yaml

    grid = load_yaml(GRIDS / "node-lm-table1-cpu.yaml")
    plans = {plan.run: plan.values for plan in expand_grid(grid, Path("out"), {}, None)}
    config = parse_config(plans["base-lstm"])
    assert config.trainer.accelerator == "auto"  # the grid leaves it at the default
    assert config_sha256(config) == PINNED


@pytest.mark.parametrize(("cuda", "expected"), [(True, "gpu"), (False, "cpu")])
def test_auto_is_a_gpu_where_cuda_sees_one_else_the_cpu(monkeypatch, cuda, expected) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert lightning_accelerator("auto") == expected
    assert lightning_accelerator("cpu") == "cpu" and lightning_accelerator("gpu") == "gpu"


def test_the_trainer_of_a_default_run_trains_on_this_machines_cpu(tmp_path, tiny_config) -> None:
    from experiments.training.trainer import build_trainer
    from odelm.lightning import pl

    CPUAccelerator = pl.accelerators.CPUAccelerator

    config = parse_config(tiny_config(tmp_path, trainer={"logger": []}))
    assert config.trainer.accelerator == "auto" and not torch.cuda.is_available()
    assert isinstance(build_trainer(config, []).accelerator, CPUAccelerator)
