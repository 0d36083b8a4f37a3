"""``train(config)``: one run from config to a tested model, resumable, with results on disk.

A run directory holds ``config.yaml``, the tokenizer, the checkpoints of one crash-consistent
validate/checkpoint cycle (``experiments.training.checkpoints``), logs (``trainer.logger``: CSV,
kept across resumptions, and TensorBoard by default), the final model (``model/``:
``config.json`` + ``model.safetensors``, loadable with no corpus by
``experiments.load_run``) and ``result.json`` (test perplexity,
per-word perplexity, both BLEUs, NFE, throughput, peak memory, parameters, protocol, the
config's hash). A run whose ``result.json`` exists is finished; one with a ``last.ckpt``
resumes from it; either is reused only under the config it was made with
(``experiments.training.runs``).

``train`` is in parts: ``build_trainer`` (the Lightning trainer and the callbacks the
result reads), ``fit``, ``select_weights`` (best, averaged or last weights), then
``experiments.evaluation.evaluate.evaluate`` and the result written atomically.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from experiments.data.loading import load_data
from experiments.data.tokenization import LMData
from experiments.evaluation.evaluate import EvalSettings, evaluate
from experiments.evaluation.trained import save_run_model, split_checksums
from experiments.models.build import build_model, count_parameters, depth_kind
from experiments.training import runfolder
from experiments.training.cards import write_card
from experiments.training.checkpoints import (
    LAST_FILE,
    AtomicCheckpointIO,
    CheckpointAverager,
    CorruptCheckpointError,
    RunCheckpoint,
    disk_full_is_one_line,
    read_checkpoint,
)
from experiments.training.config import RunConfig
from experiments.training.config_checks import check_threads
from experiments.training.datamodule import LMDataModule
from experiments.training.kernels import matmul_precision
from experiments.training.loggers import build_loggers
from experiments.training.progress import PROGRESS_FILE, ProgressFile
from experiments.training.recipes import with_budget
from experiments.training.runs import CONFIG_FILE, check_same_config, config_sha256, write_json
from experiments.training.task import LMTask
from experiments.training.threads import set_threads
from experiments.training.throughput import ThroughputMeter, peak_memory_mb
from neuralode_lm.solvers import SolverError
from odelm.errors import OdelmError
from odelm.lightning import check_trainer, pl

Callback, MisconfigurationException = pl.Callback, pl.utilities.exceptions.MisconfigurationException

RESULT_FILE = "result.json"


class OutputDirError(OdelmError, OSError):
    """The run directory cannot be written."""


class TrainerSettingsError(OdelmError, ValueError):
    """Lightning rejected the trainer settings (accelerator, devices, strategy, ...)."""


class TrainingStoppedError(OdelmError, RuntimeError):
    """The ODE solver stopped training (non-finite state, step cap)."""


class DivergedError(OdelmError, FloatingPointError):
    """The run ended with a non-finite perplexity."""


def prepare_data(config: RunConfig) -> LMData:
    """Load, tokenize and encode the run's corpus."""
    return load_data(config.data)


def check_writable(folder: Path) -> None:
    """Fail before training when the run directory cannot be written (global rank 0 only:
    the other processes of a distributed run would race on the probe)."""
    if runfolder.is_worker_process():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise OutputDirError(
            f"cannot write to run directory {folder} ({error.strerror}); pick another out_dir"
        ) from None


def train(
    config: RunConfig,
    *,
    callbacks: list[Callback] | None = None,
    overwrite: bool = False,
    data: LMData | None = None,
) -> dict[str, Any]:
    """Train, select, evaluate on test, and write the run directory; returns the result.

    A finished run with the same config returns its stored result; a half-finished one
    resumes; a run directory made by another config is refused unless ``overwrite``. The
    run's name must be one safe folder name, a non-empty folder odelm did not make is
    refused, and the folder is locked while this process uses it
    (``experiments.training.runfolder``).
    """
    run_dir = config.run_dir
    runfolder.check_run_name(config.name)
    check_threads(config.trainer.num_threads)  # the machine's, before the folder is made
    if not runfolder.is_worker_process():  # rank 0 may be making the folder meanwhile
        runfolder.check_not_foreign(run_dir)
    check_writable(run_dir)
    with (
        runfolder.claimed_run(run_dir, overwrite=overwrite),
        disk_full_is_one_line(run_dir),
        matmul_precision(config.trainer.matmul_precision),
    ):
        return _train_locked(config, callbacks, data)


def _train_locked(
    config: RunConfig, callbacks: list[Callback] | None, data: LMData | None
) -> dict[str, Any]:
    run_dir = config.run_dir
    main = not runfolder.is_worker_process()  # global rank 0 writes the run folder's files
    if main:
        check_same_config(run_dir, config)
    result_path = run_dir / RESULT_FILE
    if result_path.is_file():
        return json.loads(result_path.read_text())
    devices = config.trainer.devices  # the threads policy shares the cores among the processes
    processes = devices if isinstance(devices, int) else 1
    config.trainer.num_threads = set_threads(config.trainer.num_threads, processes)
    if main:
        (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    pl.seed_everything(config.seed, workers=True, verbose=False)
    data = data or prepare_data(config)
    if main:
        data.tokenizer.save(run_dir / "tokenizer")
    model = build_model(config.model, data.tokenizer.vocab_size)
    task = LMTask(
        model, config.optim, stateful=config.data.stateful, compile=config.trainer.compile
    )
    resume_from, resume_step = resume_point(run_dir)
    datamodule = LMDataModule(data, config.data, config.seed, config.trainer.val_batches)
    budgeted = with_budget(config, len(datamodule.train_batches()))
    parts = build_trainer(budgeted, callbacks or [], keep_logs_before=resume_step)
    fit(parts.trainer, task, datamodule, resume_from)
    if parts.trainer.global_rank != 0:
        return {}
    device = parts.trainer.strategy.root_device  # Lightning moves the model to the CPU after fit
    model.to(device)  # the test evaluation runs where training ran
    if parts.checkpoint.best_score is None:
        parts.checkpoint.reload_state()
    selected = select_weights(model, parts.checkpoint, parts.averager)
    metrics = evaluate(model, data, settings=EvalSettings.from_config(config), allow_noncausal=True)
    result = {
        "name": config.name,
        "family": depth_kind(config.model, model),
        "model": describe_model(config.model),
        "recipe": config.recipe or "custom",
        "parameters": count_parameters(model),
        **{
            f"test_{k}": v
            for k, v in metrics.items()
            if k not in ("protocol", "is_causal", "split")
        },
        "valid_ppl": parts.checkpoint.best_score,
        "is_causal": metrics["is_causal"],
        "protocol": metrics["protocol"],
        "selected": selected,
        "steps": parts.trainer.global_step,
        "best_step": parts.checkpoint.best_step,  # with the budget: results.csv's cap_bound
        **{key: getattr(budgeted.trainer, key) for key in ("max_steps", "val_every")},
        "train_seconds": task.elapsed(),
        "train_tokens_per_s": parts.meter.tokens_per_second,
        "train_mfu": parts.meter.utilisation(),
        **task.adjoint_record(),
        "peak_memory_mb": peak_memory_mb(device),
        "seed": config.seed,
        "matmul_precision": config.trainer.matmul_precision,
        "config_sha256": config_sha256(config),
        "data_sha256": split_checksums(data),
    }
    check_finite(result, parts.trainer.global_step)
    save_run_model(model, run_dir, data.tokenizer)
    runfolder.record_run_files(run_dir, [CONFIG_FILE, "tokenizer", "model"])
    write_card(config, result)  # RUN/README.md; before result.json: a finished run has one
    write_json(result_path, result)
    return result


@dataclass
class TrainerParts:
    """A Lightning trainer and the callbacks whose state the result reads."""

    trainer: pl.Trainer
    checkpoint: RunCheckpoint
    meter: ThroughputMeter
    averager: CheckpointAverager | None


def build_trainer(
    config: RunConfig, callbacks: list[Callback], keep_logs_before: int | None = None
) -> TrainerParts:
    """The Lightning trainer of a run: its budget, devices, loggers and checkpoint cycle."""
    cfg, run_dir = config.trainer, config.run_dir
    checkpoint = RunCheckpoint(run_dir / "checkpoints", cfg.checkpoint_every, cfg.val_every)
    meter = ThroughputMeter()
    averager = CheckpointAverager(cfg.average_last) if cfg.average_last else None
    extra: list[Callback] = [averager] if averager else []
    extra.append(ProgressFile(run_dir / PROGRESS_FILE))  # read by odelm compare's status lines
    if cfg.early_stopping_patience:
        extra.append(
            pl.callbacks.EarlyStopping(monitor="val/ppl", mode="min", patience=cfg.early_stopping_patience)
        )
    loggers = build_loggers(cfg.logger, run_dir, config.name, keep_csv_before=keep_logs_before)
    if loggers:
        extra.append(pl.callbacks.LearningRateMonitor(logging_interval="step"))
    # The constructor reports unknown accelerator, strategy and precision names as ValueError.
    with lightning_settings(rejected=(MisconfigurationException, ValueError)):
        trainer = pl.Trainer(
            max_steps=cfg.max_steps,
            max_time={"seconds": cfg.max_time_s} if cfg.max_time_s else None,
            val_check_interval=cfg.val_every,
            check_val_every_n_epoch=None,
            num_sanity_val_steps=0,
            log_every_n_steps=cfg.log_every,
            gradient_clip_val=config.optim.grad_clip,
            accelerator=cfg.accelerator,
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
            callbacks=[checkpoint, meter, *extra, *callbacks],
            plugins=[AtomicCheckpointIO()],
            default_root_dir=run_dir,
        )
    return TrainerParts(trainer, checkpoint, meter, averager)


def resume_point(run_dir: Path) -> tuple[Path | None, int | None]:
    """``last.ckpt`` and its step when the run has one (checked readable), else (None, None).

    Partial files left by a process killed mid-write are removed (by global rank 0).
    """
    folder = run_dir / "checkpoints"
    for partial in [] if runfolder.is_worker_process() else folder.glob("*.partial"):
        partial.unlink(missing_ok=True)
    last = folder / LAST_FILE
    if not last.is_file():
        return None, None
    step = read_checkpoint(last).get("global_step")
    if not isinstance(step, int):
        raise CorruptCheckpointError(f"{last} has no global_step; delete it or use --overwrite")
    return last, step


def fit(
    trainer: pl.Trainer, task: LMTask, datamodule: LMDataModule, ckpt_path: Path | None
) -> None:
    """``trainer.fit``, with Lightning's configuration and solver errors as one-line errors
    (``trainer`` must be the chosen Lightning package's: ``odelm.lightning``)."""
    check_trainer(trainer)
    try:
        with lightning_settings():
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


def select_weights(
    model: nn.Module, checkpoint: RunCheckpoint, averager: CheckpointAverager | None
) -> str:
    """Load the weights the run reports into ``model``; returns how they were chosen."""
    if averager and averager.snapshots:
        model.load_state_dict(averager.average())
        return f"average of last {len(averager.snapshots)} validations"
    if checkpoint.best_model_path is not None:
        state = read_checkpoint(checkpoint.best_model_path)["state_dict"]
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
        return "best validation"
    return "last"


def check_finite(result: dict[str, Any], step: int) -> None:
    """A diverged run ends with an error, never with NaN results written as results."""
    values = {key: result.get(key) for key in ("test_ppl", "valid_ppl")}
    bad = [key for key, value in values.items() if value is not None and not math.isfinite(value)]
    if bad:
        raise DivergedError(
            f"the run diverged by step {step} ({', '.join(f'{k} = {result[k]}' for k in bad)}); "
            "no result was written. Lower optim.lr or set optim.grad_clip"
        )


def describe_model(spec: dict[str, Any]) -> str:
    """A short label such as ``ode_transformer small block=rk2``."""
    rest = " ".join(f"{k}={v}" for k, v in spec.items() if k not in ("family", "preset", "name"))
    return " ".join(str(x) for x in (spec.get("preset") or spec.get("name", ""), rest) if x)
