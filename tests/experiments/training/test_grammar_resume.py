"""Training on the streamed grammar corpus: batch ``k`` is a function of ``k`` alone, so a run
killed mid-way resumes to the uninterrupted run's result."""

from __future__ import annotations

import pytest
import torch

from experiments.training.config import DataConfig, parse_config
from experiments.training.datamodule import (
    LMDataModule,
    SeededResumableSampler,
    StreamedBatches,
    load_data,
)
from experiments.training.train import train
from tests.support.runs import kill_at_first_checkpoint


def test_the_data_module_reads_batch_k_of_the_stream_at_step_k() -> None:
    config = DataConfig(grammar_depth=2, batch_size=4, bptt=8)
    module = LMDataModule(load_data(config), config, seed=9)
    loader = iter(module.train_dataloader())
    stream = module.data.stream
    assert stream is not None
    for step in range(3):
        assert torch.equal(next(loader), stream.batch(9, step, 4, 8))
    batches = module.train_batches()
    assert isinstance(batches, StreamedBatches)
    resumed = SeededResumableSampler(len(batches), 9, 5, rank=1, world_size=2, stream=True)
    assert list(resumed)[:3] == [11, 13, 15]  # (step, rank) -> one index, never reused


@pytest.mark.slow
def test_sigkill_mid_run_on_the_stream_then_resume_matches_uninterrupted(tmp_path, tiny_config):
    def config(name: str) -> dict:
        data = {"grammar_depth": 2, "batching": "sentences", "eval_batch_size": 64}
        return tiny_config(tmp_path, name, data=data, trainer={"max_steps": 40})

    reference = train(parse_config(config("reference")))
    kill_at_first_checkpoint(config("killed"), tmp_path / "killed", 40)
    resumed = train(parse_config(config("killed")))
    assert resumed["steps"] == 40
    assert resumed["valid_ppl"] == pytest.approx(reference["valid_ppl"], abs=1e-6)
    assert resumed["test_ppl"] == pytest.approx(reference["test_ppl"], abs=1e-6)
    assert resumed["test_excess_nll_per_token"] == pytest.approx(
        reference["test_excess_nll_per_token"], abs=1e-9
    )
