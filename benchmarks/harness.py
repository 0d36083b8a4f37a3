"""``odelm bench harness-throughput``: the library's training loop against a plain PyTorch
loop on the same model and batches, in one process, alternating.

The library side is the trainer a run gets (``experiments.training.trainer.build_trainer``: its
loggers, callbacks, per-step logging and gradient clipping) fitting an ``LMTask``; its
step time is the interval between consecutive batch starts, so everything the loop does
per step counts. The plain side is the reference example's loop (pytorch/examples
``word_language_model``): forward over 35 tokens, cross-entropy against the next 35,
backward, clipping at 0.25, SGD, the LSTM's state carried across windows.

With ``neighbour`` (``odelm bench harness-throughput --neighbour``) every model is also
measured beside one other single-thread training process, started for the purpose and
killed after (``benchmarks.neighbour``): the way the study grids train (``--jobs 2`` on
two cores). A step that does more work on the side, or more of it outside the plain
loop's few large operations, loses more there than on an idle machine. Each record also
holds the ratio of the training thread's CPU time per step (``cpu_ratio``): the work of
each side, which other processes leave unchanged, next to the wall-clock ratio they move.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.neighbour import neighbour as neighbour_process
from experiments.training.config import RunConfig, TrainerConfig
from experiments.training.speed import BATCH, BPTT, SGD, VOCAB, batches, bench_threads, build_task
from experiments.training.task import StreamWindow
from experiments.training.trainer import build_trainer, lightning_settings
from odelm.contract import detach_state
from odelm.lightning import pl

STATEFUL = {"lstm": True, "transformer": False}
TARGET = 0.95
"""The library's tokens/s over the plain loop's it should reach, idle and beside a neighbour."""


Step = tuple[float, float]
"""One step's wall-clock seconds and the seconds of CPU time the training thread spent."""


class Ticker:
    """Wall-clock and thread CPU seconds between consecutive ticks."""

    def __init__(self) -> None:
        self.last: Step | None = None
        self.steps: list[Step] = []

    def tick(self) -> None:
        now = (time.perf_counter(), time.thread_time())
        if self.last is not None:
            self.steps.append((now[0] - self.last[0], now[1] - self.last[1]))
        self.last = now


class StepClock(pl.Callback):
    """The wall-clock and CPU seconds between consecutive training-batch starts."""

    def __init__(self) -> None:
        self.ticker = Ticker()

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        self.ticker.tick()


def library_steps(name: str, data: list[torch.Tensor], folder: Path) -> Any:
    """A call fitting the library's trainer for ``len(data)`` steps; returns its steps."""
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

    def run() -> list[Step]:
        task.model.load_state_dict(initial)  # every round starts where the plain loop's does
        clock = StepClock()
        trainer = build_trainer(config, [clock])
        loader = DataLoader(items, batch_size=None)
        with lightning_settings():
            trainer.fit(task, train_dataloaders=loader)
        return clock.ticker.steps[1:]  # the first interval includes the loop's start

    return run


def plain_steps(name: str, data: list[torch.Tensor]) -> Any:
    """A call running the reference example's loop over ``data``; returns its steps."""
    model = build_task(name).model
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD.lr)
    initial = copy.deepcopy(model.state_dict())

    def run() -> list[Step]:
        model.load_state_dict(initial)
        ticker, state = Ticker(), None
        for window in data:
            ticker.tick()
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
        ticker.tick()
        return ticker.steps[1:]

    return run


CONDITIONS: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "": contextlib.nullcontext,
    " beside a neighbour": neighbour_process,
}
"""Each condition's suffix of the metric, and the context it is measured in."""


def harness_throughput(
    rounds: int = 4, steps: int = 11, neighbour: bool = False
) -> list[dict[str, Any]]:
    """Library training tokens/s over the plain loop's, for the LSTM and the reference
    Transformer: ``rounds`` rounds of ``steps`` steps each side, alternating which side
    goes first; a round's step time is its mean (the first step left out, so the ten
    others hold one step that writes logs, as every tenth step of a run does), and the
    median over rounds is reported. With ``neighbour``, once more beside one other
    single-thread training process."""
    torch.set_num_threads(bench_threads())
    data = batches(steps)
    records = []
    conditions = list(CONDITIONS) if neighbour else [""]
    with tempfile.TemporaryDirectory() as folder:
        for condition in conditions:
            with CONDITIONS[condition]():
                for name in STATEFUL:
                    record = _ratio(name, data, Path(folder), rounds)
                    record["metric"] += condition
                    print(
                        f"harness-throughput {name}{condition}: library "
                        f"{record['library_ms_per_step']:.0f} ms/step, plain loop "
                        f"{record['plain_ms_per_step']:.0f} ms/step, ratio {record['value']:.2f} "
                        f"(CPU time {record['cpu_ratio']:.2f})"
                    )
                    records.append(record)
    return records


def _ratio(name: str, data: list[torch.Tensor], folder: Path, rounds: int) -> dict[str, Any]:
    """The record of one model: the plain loop's median step time over the library's, and
    the same of the training thread's CPU time, which other processes do not change."""
    sides = {"library": library_steps(name, data, folder), "plain": plain_steps(name, data)}
    means: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for index in range(rounds + 1):  # round 0 warms up and is not counted
        order = list(sides) if index % 2 == 0 else list(sides)[::-1]
        for side in order:
            steps = sides[side]()
            if index:
                wall_s, cpu_s = zip(*steps)
                means[side].append((statistics.fmean(wall_s), statistics.fmean(cpu_s)))
    wall = {side: statistics.median(m[0] for m in values) for side, values in means.items()}
    cpu = {side: statistics.median(m[1] for m in values) for side, values in means.items()}
    return {
        "bench": "harness-throughput",
        "metric": f"tokens_per_s_library_over_plain {name}",
        "value": wall["plain"] / wall["library"],
        "target": TARGET,
        "unit": "x",
        "better": "higher",
        "library_ms_per_step": wall["library"] * 1e3,
        "plain_ms_per_step": wall["plain"] * 1e3,
        "cpu_ratio": cpu["plain"] / cpu["library"],
        "round_ratios": [  # each round's sides ran back to back, under the same load
            round(plain[0] / library[0], 3)
            for plain, library in zip(means["plain"], means["library"], strict=True)
        ],
        "library_cpu_ms_per_step": cpu["library"] * 1e3,
        "plain_cpu_ms_per_step": cpu["plain"] * 1e3,
        "tokens_per_step": BATCH * BPTT,
        "threads": torch.get_num_threads(),
        "iterations": f"{rounds} rounds of {len(data)} steps each side, alternating; "
        "median over rounds of each round's mean step",
    }
