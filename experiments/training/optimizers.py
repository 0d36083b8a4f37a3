"""The optimizers, rate schedules and epoch budgets that training recipes name (the named
presets are configuration data, ``experiments/configs/recipes``, named by ``RECIPES`` in
``experiments.training.run_schema``).

A run config, a grid's ``shared`` section or one grid run says ``recipe: NAME``; the
recipe's settings lie underneath the config, so whatever the config sets explicitly wins.
Recipes set only how a model is optimised and in what order it reads the training stream
(``optim`` and ``data.stateful``), never which tokens or how many, so a grid may give each
model its family's best-known recipe and stay a fair comparison. ``result.json`` records
the recipe's name (``custom`` without one).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from experiments.training.config import OptimConfig, RunConfig, TrainerConfig


def devices_per_node(trainer: TrainerConfig) -> int:
    """The processes Lightning starts per node for ``trainer.devices``: a count, a list of
    indices (``"0,1"``), or ``auto``/``-1``: every CUDA device where the run trains on CUDA
    (``accelerator: cuda``/``gpu``, or ``auto`` with CUDA available), else one (the CPU)."""
    devices = trainer.devices
    if isinstance(devices, (list, tuple)):
        return max(1, len(devices))
    text = str(devices).strip().strip("[]")
    if "," in text:
        return len([part for part in text.split(",") if part.strip()])
    if text.lstrip("-").isdigit() and int(text) > 0:
        return int(text)
    on_cuda = trainer.accelerator in ("cuda", "gpu") or (
        trainer.accelerator == "auto" and torch.cuda.is_available()
    )
    return max(1, torch.cuda.device_count()) if on_cuda else 1


def world_size(trainer: TrainerConfig, environ: Mapping[str, str] = os.environ) -> int:
    """The processes a run trains on: ``WORLD_SIZE`` where a launcher (``torchrun``,
    Lightning's own DDP children) set it, else ``devices_per_node * num_nodes``."""
    launched = environ.get("WORLD_SIZE", "")
    if launched.isdigit() and int(launched) > 0:
        return int(launched)
    return max(1, devices_per_node(trainer) * trainer.num_nodes)


def training_budget(
    trainer: TrainerConfig, batches_per_epoch: int, world: int | None = None
) -> tuple[int, int]:
    """``(max_steps, val_every)`` in optimizer steps.

    ``max_epochs`` converts exactly: an epoch is one pass over the training batches, shared
    out over the run's ``world`` processes (default: ``world_size(trainer)``), each taking
    every ``world``-th batch. With both budgets, the first reached ends the run.
    ``val_every: epoch`` validates once per epoch.
    """
    world = world_size(trainer) if world is None else max(1, world)
    steps_per_epoch = math.ceil(batches_per_epoch / world)
    budgets = [trainer.max_steps] if trainer.max_steps is not None else []
    if trainer.max_epochs is not None:
        budgets.append(trainer.max_epochs * steps_per_epoch)
    val_every = steps_per_epoch if trainer.val_every == "epoch" else int(trainer.val_every)
    return min(budgets), val_every


def with_budget(config: RunConfig, batches_per_epoch: int, world: int | None = None) -> RunConfig:
    """The config with its budget in steps (``max_steps``, ``val_every``; see
    ``training_budget``), for building the trainer; the run's own config keeps its words."""
    max_steps, val_every = training_budget(config.trainer, batches_per_epoch, world)
    trainer = replace(config.trainer, max_steps=max_steps, max_epochs=None, val_every=val_every)
    return replace(config, trainer=trainer)


def build_optimizer(parameters: Any, optim: OptimConfig) -> torch.optim.Optimizer:
    """Adam, AdamW or SGD (with optional momentum) as the config says. Adam and AdamW over
    CUDA parameters take PyTorch's fused kernel (one launch for every parameter, as nanoGPT's
    AdamW), elsewhere its default (the CPU's unchanged)."""
    parameters = list(parameters)
    if optim.optimizer == "sgd":
        return torch.optim.SGD(
            parameters, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay
        )
    cls = torch.optim.AdamW if optim.optimizer == "adamw" else torch.optim.Adam
    fused = bool(parameters) and all(p.device.type == "cuda" for p in parameters)
    return cls(
        parameters,
        lr=optim.lr,
        betas=tuple(optim.betas),
        weight_decay=optim.weight_decay,
        fused=fused or None,
    )


def inverse_sqrt_lambda(warmup_steps: int):
    """Linear warmup then ``1/sqrt(step)`` decay, normalised to 1 at the end of warmup."""
    warmup = max(1, warmup_steps)

    def factor(step: int) -> float:
        step = step + 1
        return step / warmup if step < warmup else math.sqrt(warmup / step)

    return factor


def warmup_cosine_lambda(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Linear warmup to the peak rate over ``warmup_steps``, then a cosine decay that reaches
    0 after ``total_steps`` optimizer steps: the rate is a function of the step alone, so no
    validation (noisy on a small split) can move it."""
    warmup = max(1, warmup_steps)
    decay = max(1, total_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / decay)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class PlateauAnnealer:
    """Divides the learning rate by ``factor`` after ``patience`` validations in a row
    without a new best (the classic word-level LM recipe: ``factor=4, patience=1``).

    Fed once per validation with the validation perplexity; its state (best, count) goes
    into checkpoints so a resumed run anneals as the uninterrupted one would. The rate
    itself lives in the optimizer's state.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, factor: float, patience: int) -> None:
        self.optimizer, self.factor, self.patience = optimizer, factor, patience
        self.best = math.inf
        self.bad_validations = 0

    def step(self, metric: float) -> None:
        if metric < self.best:
            self.best, self.bad_validations = metric, 0
            return
        self.bad_validations += 1
        if self.bad_validations >= self.patience:
            for group in self.optimizer.param_groups:
                group["lr"] /= self.factor
            self.bad_validations = 0

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_validations = state["best"], state["bad_validations"]
