"""A neighbour for the speed benchmarks: one other single-thread training process.

The study grids run ``--jobs 2`` on two cores, so each run trains beside another. A
benchmark that should hold there measures inside ``with neighbour():``, which starts
``python -m benchmarks.neighbour``: a plain PyTorch training loop (the reference
Transformer of ``experiments.training.speed`` at one thread, SGD on fixed random
batches) that runs until it is killed. The context waits for its first step, so the
neighbour is training before the first measurement, and kills it on the way out,
whatever happened inside; the process also ends on its own after ``LIMIT_S`` seconds or
as soon as the process that started it is gone, so none is ever left running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LIMIT_S = 1800.0
"""The longest a neighbour trains: a bound should its starter fail to end it."""
READY = "training"
"""The line the neighbour prints once its first step is done."""


class NeighbourError(RuntimeError):
    """The neighbour process ended before its first training step."""


@contextmanager
def neighbour(limit_s: float = LIMIT_S) -> Iterator[subprocess.Popen]:
    """Run one single-thread training process beside the block; yields its ``Popen``."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "benchmarks.neighbour", str(limit_s), str(os.getpid())]
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        if line.strip() != READY:
            raise NeighbourError(
                f"the neighbour process ended before training (exit {process.wait()})"
            )
        yield process
    finally:
        process.kill()
        process.wait()
        if process.stdout:
            process.stdout.close()


def train(limit_s: float, parent: int) -> None:
    """The neighbour's loop: plain training steps at one thread until ``limit_s`` seconds
    pass or ``parent`` is no longer this process's parent."""
    import torch
    from torch import nn

    from experiments.training.speed import SGD, VOCAB, batches, build_task

    torch.set_num_threads(1)
    model: nn.Module = build_task("transformer", seed=1).model
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD.lr)
    data = batches(4, seed=1)
    ends = time.monotonic() + limit_s
    step = 0
    while time.monotonic() < ends and os.getppid() == parent:
        window = data[step % len(data)]
        logits, _ = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), SGD.grad_clip)
        optimizer.step()
        if step == 0:
            print(READY, flush=True)
        step += 1


if __name__ == "__main__":
    train(float(sys.argv[1]), int(sys.argv[2]))
