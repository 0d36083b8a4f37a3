"""The training time is the trainer's Lightning ``Timer``: one in every trainer odelm builds,
one added to a plain trainer without it, a user's own kept, and its count carried across a
resumption, from the Timer's checkpoint state or an older checkpoint's ``elapsed_s``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from experiments.reference import BigramLM
from experiments.training.checkpoints import atomic_save, read_checkpoint
from experiments.training.config import OptimConfig, parse_config
from experiments.training.task import LMTask, Timer
from experiments.training.trainer import build_trainer
from odelm.lightning import pl


def _fit(
    root: Path, steps: int, callbacks: list[Any] | None = None, ckpt: Path | None = None
) -> tuple[pl.Trainer, LMTask]:
    """``steps`` steps of a bigram model under a plain ``pl.Trainer``."""
    task = LMTask(BigramLM(7), OptimConfig())
    trainer = pl.Trainer(
        max_steps=steps,
        callbacks=callbacks,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    tokens = torch.randint(0, 7, (16, 9), generator=torch.Generator().manual_seed(0))
    trainer.fit(task, train_dataloaders=DataLoader(tokens, batch_size=4), ckpt_path=ckpt)
    return trainer, task


def _timers(trainer: pl.Trainer) -> list[Timer]:
    return [c for c in trainer.callbacks if isinstance(c, Timer)]


@pytest.mark.parametrize("max_time_s", [None, 90.0])
def test_every_built_trainer_has_one_timer_with_the_budget(tmp_path, tiny_config, max_time_s):
    config = parse_config(tiny_config(tmp_path, trainer={"max_time_s": max_time_s}))
    (timer,) = _timers(build_trainer(config, []))
    assert timer.time_remaining() == (None if max_time_s is None else pytest.approx(90.0))


def test_plain_trainer_gets_a_timer_and_a_users_timer_is_kept(tmp_path):
    trainer, task = _fit(tmp_path, 2)
    (timer,) = _timers(trainer)
    assert timer.time_remaining() is None
    assert task.elapsed() == timer.time_elapsed("train") > 0
    own = Timer(duration=timedelta(hours=1))
    trainer, task = _fit(tmp_path, 2, callbacks=[own])
    assert _timers(trainer) == [own]
    assert task.elapsed() == own.time_elapsed("train") > 0


@pytest.mark.parametrize("old_format", [False, True])
def test_resumed_training_time_includes_the_first_processs(tmp_path, old_format):
    trainer, _ = _fit(tmp_path, 2)
    path = tmp_path / "two.ckpt"
    trainer.save_checkpoint(path)
    state = read_checkpoint(path)
    assert "elapsed_s" not in state and state["callbacks"]["Timer"]["time_elapsed"]["train"] > 0
    if old_format:  # written before the Timer: the time as elapsed_s, no Timer state
        del state["callbacks"]["Timer"]
        state["elapsed_s"] = 1000.0
    else:  # pretend the first process trained for 1000 s
        state["callbacks"]["Timer"]["time_elapsed"]["train"] = 1000.0
    atomic_save(state, path)
    trainer, task = _fit(tmp_path, 4, ckpt=path)
    assert trainer.global_step == 4
    assert 1000.0 < task.elapsed() < 1100.0
    trainer.save_checkpoint(tmp_path / "four.ckpt")  # and the next resumption counts it all
    assert read_checkpoint(tmp_path / "four.ckpt")["callbacks"]["Timer"]["time_elapsed"][
        "train"
    ] == pytest.approx(task.elapsed())
