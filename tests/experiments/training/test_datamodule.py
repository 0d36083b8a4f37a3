"""``LMDataModule.from_corpus``: a corpus name to batches a plain ``pl.Trainer`` trains on."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.models.build import build_model
from experiments.training.config import ConfigError, DataConfig, OptimConfig, RunConfig
from experiments.training.datamodule import LMDataModule, SeededResumableSampler
from experiments.training.metrics import EvalSettings, perplexity
from experiments.training.task import LMTask
from experiments.training.train import prepare_data
from odelm.lightning import pl

TINY = {
    "family": "ode_transformer",
    "preset": "small",
    "n_layers": 1,
    "d_model": 16,
    "d_ff": 32,
    "n_heads": 2,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "relu_dropout": 0.0,
}


def test_from_corpus_trains_and_tests_under_a_plain_trainer(tmp_path) -> None:
    torch.manual_seed(0)
    datamodule = LMDataModule.from_corpus("grammar", batch_size=8)
    assert datamodule.vocab_size == datamodule.tokenizer.vocab_size > 10
    assert datamodule.config.batch_size == 8 and datamodule.config.bptt == 35
    assert datamodule.train_batches()[0].shape == (8, 36)  # bptt + 1 tokens per row
    task = LMTask(build_model(TINY, datamodule.vocab_size), OptimConfig(lr=3e-3))
    trainer = pl.Trainer(
        max_steps=5,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        limit_val_batches=2,
    )
    trainer.fit(task, datamodule=datamodule)
    assert trainer.global_step == 5
    (metrics,) = trainer.test(task, datamodule=datamodule, verbose=False)
    # test/ppl is the exact perplexity of the whole test split, as the harness computes it
    expected = perplexity(task.model.eval(), datamodule.data, "test", EvalSettings(eval_window=128))
    assert metrics["test/ppl"] == pytest.approx(expected["ppl"], rel=1e-5)
    assert 1 < metrics["test/ppl"] < datamodule.vocab_size
    assert math.isfinite(metrics["test/nfe"])


@pytest.mark.slow
def test_from_corpus_encodes_as_odelm_train_does() -> None:
    ours = LMDataModule.from_corpus("grammar", protocol="mini", corpus_seed=3, batching="sentences")
    harness = prepare_data(
        RunConfig(data=DataConfig(corpus="grammar", protocol="mini", seed=3, batching="sentences"))
    )
    assert ours.config.batching == "sentences" and "seed 3)-mini" in ours.data.protocol
    assert ours.tokenizer.fingerprint() == harness.tokenizer.fingerprint()
    for split in ("train", "valid", "test"):
        assert torch.equal(ours.data.split(split).ids, harness.split(split).ids)


def test_from_corpus_names_an_unknown_option() -> None:
    with pytest.raises(ConfigError, match=r"unknown data option\(s\) \['bpt'\]; valid: .*bptt"):
        LMDataModule.from_corpus("grammar", bpt=20)


def _window_indices(datamodule: LMDataModule) -> list[int]:
    """The index in ``train_batches()`` of each window one training epoch reads, in order."""
    windows = datamodule.train_batches()
    return [
        next(index for index, window in enumerate(windows) if torch.equal(window, batch))
        for batch in datamodule.train_dataloader()
    ]


@pytest.mark.slow
def test_shuffle_false_reads_the_training_windows_in_stream_order() -> None:
    """``data.shuffle: false`` walks the windows in stream order, as pytorch/examples'
    word_language_model does; the default draws a seeded permutation of them."""
    in_order = _window_indices(LMDataModule.from_corpus("grammar", batch_size=8, shuffle=False))
    assert in_order == list(range(len(in_order)))
    shuffled = _window_indices(LMDataModule.from_corpus("grammar", batch_size=8))
    assert sorted(shuffled) == in_order and shuffled != in_order


def _epoch_orders(seed: int, order: int, size: int = 94, epochs: int = 60) -> list[tuple]:
    sampler = SeededResumableSampler(size, seed, order=order)
    return [tuple(sampler._index(epoch * size + i) for i in range(size)) for epoch in range(epochs)]


@pytest.mark.slow
def test_seeds_share_no_epoch_permutation_under_the_default_order() -> None:
    """Version 2 (the default): the 300 (seed, epoch) permutations of seeds 1-5 over 60
    epochs of PTB-mini's 94 windows are all different; version 1 (seed + epoch) shares
    all but a few, which is why it was replaced."""
    assert SeededResumableSampler(10, 0).order == 2
    assert DataConfig().order == 2
    new = [p for seed in range(1, 6) for p in _epoch_orders(seed, 2)]
    assert len(set(new)) == len(new) == 300
    old = [p for seed in range(1, 6) for p in _epoch_orders(seed, 1)]
    assert len(set(old)) == 64  # seeds 1-5 over epochs 0-59 use seeds + epochs 1..64


def test_order_one_is_the_published_seed_plus_epoch_order() -> None:
    """Runs published before data.order keep their windows to the digit."""
    size, seed = 37, 3
    sampler = SeededResumableSampler(size, seed, order=1)
    for epoch in (0, 1, 5):
        expected = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch))
        assert [sampler._index(epoch * size + i) for i in range(size)] == expected.tolist()
