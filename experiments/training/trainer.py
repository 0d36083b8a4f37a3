"""The Lightning side of a run: its ``Trainer`` and callbacks (``build_trainer``), and the
model and task fitted under them (``fit_run``, resuming from ``last.ckpt``). Called by
``experiments.training.train``; the ``LightningModule`` is ``experiments.training.task``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch

from experiments.data.tokenization import LMData
from experiments.models.build import build_model
from experiments.training.checkpoints import (
    AtomicCheckpointIO,
    CheckpointAverager,
    RunCheckpoint,
    resume_point,
)
from experiments.training.config import RunConfig
from experiments.training.datamodule import LMDataModule
from experiments.training.loggers import build_loggers
from experiments.training.optimizers import with_budget
from experiments.training.progress import PROGRESS_FILE, ProgressFile
from experiments.training.task import LMTask
from experiments.training.throughput import ThroughputMeter
from neuralode_lm.solvers import SolverError
from odelm.errors import OdelmError
from odelm.lightning import check_trainer, pl
from odelm.mixed_precision import emulated_products

Callback, MisconfigurationException = pl.Callback, pl.utilities.exceptions.MisconfigurationException


class TrainerSettingsError(OdelmError, ValueError):
    """Lightning rejected the trainer settings (accelerator, devices, strategy, ...)."""


class TrainingStoppedError(OdelmError, RuntimeError):
    """The ODE solver stopped training (non-finite state, step cap)."""


def lightning_accelerator(name: str) -> str:
    """The accelerator handed to ``pl.Trainer`` for ``trainer.accelerator = name``.

    ``auto`` (the default) is a GPU when CUDA sees one, else the CPU, as ``--device auto`` of
    ``odelm eval/generate/discretize`` (``experiments.evaluation.devices``); Lightning's own
    ``auto`` would also take Apple's MPS or a TPU, where the harness is not tested (the pooled
    perplexity is summed in float64, which MPS lacks). Other names go to Lightning unchanged.
    The accelerator is where a run computes, not what it computes: ``auto`` is hashed as
    ``cpu``, the default before ``auto`` (the field's ``hashed_as``, ``experiments.training.identity``), so
    a run made on the CPU keeps its hash and its folder, and resumes on a GPU.
    """
    if str(name).strip().lower() == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return name


def build_trainer(
    config: RunConfig, callbacks: list[Callback], keep_logs_before: int | None = None
) -> pl.Trainer:
    """The Lightning trainer of a run: its budget, devices, loggers and checkpoint cycle.
    Its one ``Timer`` counts the training time across resumptions (``LMTask.elapsed``) and
    stops the run at ``trainer.max_time_s`` when set."""
    cfg, run_dir = config.trainer, config.run_dir
    checkpoint = RunCheckpoint(run_dir / "checkpoints", cfg.checkpoint_every, cfg.val_every)
    meter = ThroughputMeter()
    budget = timedelta(seconds=cfg.max_time_s) if cfg.max_time_s else None
    averager = CheckpointAverager(cfg.average_last) if cfg.average_last else None
    extra: list[Callback] = [averager] if averager else []
    extra.append(ProgressFile(run_dir / PROGRESS_FILE))  # read by odelm compare's status lines
    if cfg.early_stopping_patience:
        extra.append(
            pl.callbacks.EarlyStopping(
                monitor="val/ppl", mode="min", patience=cfg.early_stopping_patience
            )
        )
    loggers = build_loggers(cfg.logger, run_dir, config.name, keep_csv_before=keep_logs_before)
    if loggers:
        extra.append(pl.callbacks.LearningRateMonitor(logging_interval="step"))
    # The constructor reports unknown accelerator, strategy and precision names as ValueError.
    with lightning_settings(rejected=(MisconfigurationException, ValueError)):
        trainer = pl.Trainer(
            max_steps=cfg.max_steps,
            val_check_interval=cfg.val_every,
            check_val_every_n_epoch=None,
            num_sanity_val_steps=0,
            log_every_n_steps=cfg.log_every,
            gradient_clip_val=config.optim.grad_clip,
            accelerator=lightning_accelerator(cfg.accelerator),
            devices=cfg.devices,
            num_nodes=cfg.num_nodes,
            strategy=cfg.strategy,
            precision=cfg.precision,
            deterministic=cfg.deterministic,
            enable_progress_bar=cfg.progress_bar,
            enable_model_summary=False,
            enable_checkpointing=True,
            use_distributed_sampler=False,
            logger=loggers,
            callbacks=[checkpoint, meter, *extra, *callbacks, pl.callbacks.Timer(budget)],
            plugins=[AtomicCheckpointIO()],
            default_root_dir=run_dir,
        )
    return trainer


def fit_run(config: RunConfig, data: LMData, callbacks: list[Callback]) -> None:
    """Build the run's model, task, data module and trainer, and fit (from ``last.ckpt``
    when the run has one)."""
    model = build_model(config.model, data.tokenizer.vocab_size)
    task = LMTask(
        model, config.optim, stateful=config.data.stateful, compile=config.trainer.compile
    )
    resume_from, resume_step = resume_point(config.run_dir)
    datamodule = LMDataModule(data, config.data, config.seed, config.trainer.val_batches)
    budgeted = with_budget(config, len(datamodule.train_batches()))
    trainer = build_trainer(budgeted, callbacks, keep_logs_before=resume_step)
    fit(trainer, task, datamodule, resume_from)


def fit(
    trainer: pl.Trainer, task: LMTask, datamodule: LMDataModule, ckpt_path: Path | None
) -> None:
    """``trainer.fit``, with Lightning's configuration and solver errors as one-line errors
    (``trainer`` must be the chosen Lightning package's: ``odelm.lightning``)."""
    check_trainer(trainer)
    try:
        with lightning_settings(), emulated_products(trainer.precision):
            trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path)
    except SolverError as error:
        raise TrainingStoppedError(
            f"training stopped at step {trainer.global_step}: {error}"
        ) from error


@contextmanager
def lightning_settings(
    rejected: tuple[type[Exception], ...] = (MisconfigurationException,),
) -> Iterator[None]:
    """Lightning's own configuration errors (``rejected``) as ``TrainerSettingsError``;
    its warnings that say nothing about the run silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended.*")
        warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*")
        try:
            yield
        except rejected as error:
            raise TrainerSettingsError(
                f"Lightning rejected the trainer settings: {error}"
            ) from None
