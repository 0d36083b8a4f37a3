"""The run folder's files, written by a callback of the run's trainer (``RunFiles``): its
config and tokenizer when fit sets up (as LightningCLI's ``SaveConfigCallback`` writes its
config), and when fit ends the weights it reports, tested, the model, the model card, and
``result.json`` last (a run with one is finished)."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import yaml

from experiments.data.tokenization import LMData
from experiments.models.build import count_parameters, depth_kind
from experiments.training import runfolder
from experiments.training.cards import save_run_model, write_card
from experiments.training.checkpoints import CheckpointAverager, RunCheckpoint, select_weights
from experiments.training.config import RunConfig
from experiments.training.metrics import EvalSettings, evaluate
from experiments.training.runs import (
    CONFIG_FILE,
    RESULT_FILE,
    config_sha256,
    write_json,
)
from experiments.training.task import LMTask
from experiments.training.throughput import ThroughputMeter, peak_memory_mb
from odelm import files
from odelm.errors import OdelmError
from odelm.lightning import pl

C = TypeVar("C", bound=pl.Callback)


class DivergedError(OdelmError, FloatingPointError):
    """The run ended with a non-finite perplexity."""


class RunFiles(pl.Callback):
    """The run folder's files on global rank 0: ``config.yaml`` and the tokenizer at
    ``setup``, the tested model, card and ``result.json`` at ``on_fit_end``.

    The folder's identity is checked before the trainer is built
    (``experiments.training.train``): resuming reads the folder's checkpoint and trims its
    logs, which must not happen to another config's run.
    """

    def __init__(self, config: RunConfig, data: LMData) -> None:
        self.config, self.data = config, data

    def setup(self, trainer: pl.Trainer, task: pl.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            run_dir = self.config.run_dir
            config = yaml.safe_dump(self.config.to_dict(), sort_keys=False)
            files.write_text(run_dir / CONFIG_FILE, config)
            self.data.tokenizer.save(run_dir / "tokenizer")

    def on_fit_end(self, trainer: pl.Trainer, task: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            assert isinstance(task, LMTask)
            finish_run(self.config, self.data, trainer, task)


def finish_run(
    config: RunConfig, data: LMData, trainer: pl.Trainer, task: LMTask
) -> dict[str, Any]:
    """Select the weights, test them, write the run's model, card and ``result.json``
    (with the step budget the trainer ran under: ``max_steps`` and ``val_every``); returns
    the result."""
    model, run_dir = task.model, config.run_dir
    checkpoint = callback(trainer, RunCheckpoint)
    averager = next((c for c in trainer.callbacks if isinstance(c, CheckpointAverager)), None)
    meter = callback(trainer, ThroughputMeter)
    device = trainer.strategy.root_device  # Lightning moves the model to the CPU after fit
    model.to(device)  # the test evaluation runs where training ran
    if checkpoint.best_score is None:
        checkpoint.reload_state()
    selected = select_weights(model, checkpoint, averager)
    settings = EvalSettings.from_config(config)
    # one shared adaptive solve per batch, as training: recorded results reproduce unchanged
    metrics = evaluate(model, data, settings=settings, allow_noncausal=True, batch_invariant=False)
    result = {
        "name": config.name,
        "depth": depth_kind(config.model, model),
        "model": describe_model(config.model),
        "recipe": config.recipe or "custom",
        "parameters": count_parameters(model),
        **{
            f"test_{k}": v
            for k, v in metrics.items()
            if k not in ("protocol", "is_causal", "split")
        },
        "valid_ppl": checkpoint.best_score,
        "is_causal": metrics["is_causal"],
        "protocol": metrics["protocol"],
        "selected": selected,
        "steps": trainer.global_step,
        "best_step": checkpoint.best_step,  # with the budget: results.csv's cap_bound
        "max_steps": trainer.max_steps,
        "val_every": trainer.val_check_interval,
        "train_seconds": task.elapsed(),
        "train_tokens_per_s": meter.tokens_per_second,
        "train_mfu": meter.utilisation(),
        **task.adjoint_record(),
        "peak_memory_mb": peak_memory_mb(device),
        "seed": config.seed,
        "matmul_precision": config.trainer.matmul_precision,
        "config_sha256": config_sha256(config),
        "data_sha256": runfolder.split_checksums(data),
    }
    check_finite(result, trainer.global_step)
    written = save_run_model(model, run_dir, data.tokenizer)
    runfolder.record_run_files(
        run_dir, [CONFIG_FILE, "tokenizer", *written], data_sha256=result["data_sha256"]
    )
    write_card(config, result)  # RUN/README.md; before result.json: a finished run has one
    write_json(run_dir / RESULT_FILE, result)
    return result


def callback(trainer: pl.Trainer, kind: type[C]) -> C:
    """The trainer's callback of type ``kind`` (``build_trainer`` adds one of each)."""
    return next(c for c in trainer.callbacks if isinstance(c, kind))


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
