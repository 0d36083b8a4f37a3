"""The end of a run: the weights it reports, tested, and its files written (the model, the
model card, ``result.json`` last: a run with one is finished)."""

from __future__ import annotations

import math
from typing import Any

from experiments.data.tokenization import LMData
from experiments.models.build import count_parameters, depth_kind
from experiments.training import runfolder
from experiments.training.cards import write_card
from experiments.training.checkpoints import select_weights
from experiments.training.config import RunConfig
from experiments.training.evaluate import EvalSettings, evaluate
from experiments.training.runs import (
    CONFIG_FILE,
    RESULT_FILE,
    config_sha256,
    save_run_model,
    split_checksums,
    write_json,
)
from experiments.training.throughput import peak_memory_mb
from experiments.training.trainer import FittedRun
from odelm.errors import OdelmError


class DivergedError(OdelmError, FloatingPointError):
    """The run ended with a non-finite perplexity."""


def finish_run(config: RunConfig, data: LMData, fitted: FittedRun) -> dict[str, Any]:
    """Select the weights, test them, write the run's model, card and ``result.json``;
    returns the result (global rank 0 only)."""
    model, task, budgeted, parts = fitted.model, fitted.task, fitted.budgeted, fitted.parts
    run_dir = config.run_dir
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
    written = save_run_model(model, run_dir, data.tokenizer)
    runfolder.record_run_files(run_dir, [CONFIG_FILE, "tokenizer", *written])
    write_card(config, result)  # RUN/README.md; before result.json: a finished run has one
    write_json(run_dir / RESULT_FILE, result)
    return result


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
