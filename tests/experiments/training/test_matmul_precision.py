"""``trainer.matmul_precision``: one key sets the precision of float32 matrix
products and of cuDNN (TF32) for the run, is recorded in ``result.json`` and the model card,
and leaves the identity of runs made before it unchanged at its default."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from experiments.training.config import ConfigError, parse_config
from experiments.training.kernels import matmul_precision
from experiments.training.train import train
from odelm.lightning import pl

Callback = pl.Callback


def test_the_setting_holds_inside_and_is_restored_after() -> None:
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    with matmul_precision("medium"):
        assert torch.get_float32_matmul_precision() == "medium"
        assert torch.backends.cudnn.allow_tf32 is True
    with matmul_precision("highest"):  # true fp32 for cuDNN too (PyTorch's default is TF32)
        assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cudnn.allow_tf32 is False
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before


class _SeenAtTrainStart(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def on_train_start(self, trainer: Any, task: Any) -> None:
        self.seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))


@pytest.mark.slow
def test_a_run_trains_under_its_matmul_precision_and_records_it(tmp_path, tiny_config) -> None:
    trainer = {"max_steps": 2, "val_every": 2, "matmul_precision": "high"}
    seen = _SeenAtTrainStart()
    result = train(parse_config(tiny_config(tmp_path, "tf32", trainer=trainer)), callbacks=[seen])
    assert seen.seen == [("high", True)] and result["matmul_precision"] == "high"
    assert "float32 matmuls high" in (tmp_path / "tf32" / "README.md").read_text()
    assert torch.get_float32_matmul_precision() == "highest"  # the process's setting is back


def test_an_unknown_matmul_precision_is_named() -> None:
    values = {"model": {"family": "reference"}, "trainer": {"matmul_precision": "tf32"}}
    with pytest.raises(ConfigError, match="matmul_precision"):
        parse_config(values)
