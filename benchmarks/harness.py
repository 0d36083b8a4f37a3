"""``odelm bench harness-throughput``: the library's training loop against a plain PyTorch
loop on the same model and batches, in one process, alternating.

The library side is the trainer a run gets (``experiments.training.trainer.build_trainer``: its
loggers, callbacks, per-step logging and gradient clipping) fitting an ``LMTask``; its
step time is the interval between consecutive batch starts, so everything the loop does
per step counts. The plain side is the reference example's loop (pytorch/examples
``word_language_model``): forward over 35 tokens, cross-entropy against the next 35,
backward, clipping at 0.25, SGD, the LSTM's state carried across windows.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from experiments.training.config import RunConfig, TrainerConfig
from experiments.training.speed import BATCH, BPTT, SGD, VOCAB, batches, bench_threads, build_task
from experiments.training.task import StreamWindow
from experiments.training.trainer import build_trainer, lightning_settings
from odelm.contract import detach_state
from odelm.lightning import pl

STATEFUL = {"lstm": True, "transformer": False}


class StepClock(pl.Callback):
    """Seconds between consecutive training-batch starts."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.seconds: list[float] = []

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.seconds.append(now - self.last)
        self.last = now


def library_steps(name: str, data: list[torch.Tensor], folder: Path) -> Any:
    """A call fitting the library's trainer for ``len(data)`` steps; returns its step times."""
    task = build_task(name)
    task.stateful = STATEFUL[name]
    items: list[Any] = data
    if task.stateful:
        items = [StreamWindow(window, index == 0) for index, window in enumerate(data)]
    trainer_config = TrainerConfig(
        max_steps=len(data),
        val_every=10**9,
        checkpoint_every=10**9,
        progress_bar=False,
        num_threads=torch.get_num_threads(),
    )
    config = RunConfig(name=name, out_dir=str(folder), optim=SGD, trainer=trainer_config)

    initial = copy.deepcopy(task.model.state_dict())

    def run() -> list[float]:
        task.model.load_state_dict(initial)  # every round starts where the plain loop's does
        clock = StepClock()
        trainer = build_trainer(config, [clock])
        loader = DataLoader(items, batch_size=None)
        with lightning_settings():
            trainer.fit(task, train_dataloaders=loader)
        return clock.seconds[1:]  # the first interval includes the loop's start

    return run


def plain_steps(name: str, data: list[torch.Tensor]) -> Any:
    """A call running the reference example's loop over ``data``; returns its step times."""
    model = build_task(name).model
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD.lr)
    initial = copy.deepcopy(model.state_dict())

    def run() -> list[float]:
        model.load_state_dict(initial)
        seconds, state, last = [], None, None
        for window in data:
            now = time.perf_counter()
            if last is not None:
                seconds.append(now - last)
            last = now
            inputs, targets = window[:, :-1], window[:, 1:]
            if STATEFUL[name]:
                logits, aux = model(inputs, state=state)
                state = detach_state(aux["state"])
            else:
                logits, _ = model(inputs)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), SGD.grad_clip)
            optimizer.step()
        seconds.append(time.perf_counter() - last)
        return seconds[1:]

    return run


def harness_throughput(rounds: int = 4, steps: int = 11) -> list[dict[str, Any]]:
    """Library training tokens/s over the plain loop's, for the LSTM and the reference
    Transformer: ``rounds`` rounds of ``steps`` steps each side, alternating which side
    goes first; a round's step time is its mean (the first step left out, so the ten
    others hold one step that writes logs, as every tenth step of a run does), and the
    median over rounds is reported."""
    torch.set_num_threads(bench_threads())
    data = batches(steps)
    records = []
    with tempfile.TemporaryDirectory() as folder:
        for name in STATEFUL:
            sides = {
                "library": library_steps(name, data, Path(folder)),
                "plain": plain_steps(name, data),
            }
            seconds: dict[str, list[float]] = {side: [] for side in sides}
            for index in range(rounds + 1):  # round 0 warms up and is not counted
                order = list(sides) if index % 2 == 0 else list(sides)[::-1]
                for side in order:
                    measured = sides[side]()
                    if index:
                        seconds[side].append(statistics.fmean(measured))
            median = {side: statistics.median(values) for side, values in seconds.items()}
            ratio = median["plain"] / median["library"]
            print(
                f"harness-throughput {name}: library {median['library'] * 1e3:.0f} ms/step, "
                f"plain loop {median['plain'] * 1e3:.0f} ms/step, ratio {ratio:.2f}"
            )
            records.append(
                {
                    "bench": "harness-throughput",
                    "metric": f"tokens_per_s_library_over_plain {name}",
                    "value": ratio,
                    "target": 1.0,
                    "unit": "x",
                    "better": "higher",
                    "library_ms_per_step": median["library"] * 1e3,
                    "plain_ms_per_step": median["plain"] * 1e3,
                    "tokens_per_step": BATCH * BPTT,
                    "threads": torch.get_num_threads(),
                    "iterations": f"{rounds} rounds of {steps} steps each side, alternating; "
                    "median over rounds of each round's mean step",
                }
            )
    return records
