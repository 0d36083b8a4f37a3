"""FSDP and the fused loss: the fused output layer + cross-entropy reads
``output_layer.weight`` outside the layer's forward, where FSDP holds only a shard. The
fused path is taken on the CPU only (``loss_path``) and Lightning's ``fsdp`` strategy needs
a GPU, so a Lightning run never combines them; a model sharded by ``fully_shard`` on the
CPU takes the plain path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from experiments.training.losses import fused_loss_dtype


class Exposed(torch.nn.Module):
    """A model exposing ``features`` and ``output_layer`` (the fusable contract)."""

    def __init__(self) -> None:
        super().__init__()
        self.output_layer = torch.nn.Linear(8, 16)

    def features(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        return torch.zeros(*tokens.shape, 8), {}


def test_a_model_sharded_by_fully_shard_takes_the_plain_loss_path() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, tokens = Exposed(), torch.zeros(2, 5, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_loss_dtype(model, tokens, None, 0.0) is torch.bfloat16  # unsharded
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        fully_shard(model.output_layer, mesh=init_device_mesh("cpu", (1,)))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert fused_loss_dtype(model, tokens, None, 0.0) is None
    finally:
        dist.destroy_process_group()


def test_lightning_refuses_fsdp_on_the_cpu_in_one_line(tmp_path, tiny_config) -> None:
    from experiments.training.config import parse_config
    from experiments.training.trainer import TrainerSettingsError, build_trainer

    config = parse_config(
        tiny_config(
            tmp_path,
            trainer={"strategy": "fsdp", "accelerator": "cpu", "precision": "bf16-mixed"},
        )
    )
    with pytest.raises(TrainerSettingsError, match="requires a GPU accelerator"):
        build_trainer(config, [])
