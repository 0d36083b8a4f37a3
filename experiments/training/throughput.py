"""What a run measures of its machine: training throughput and model FLOPs utilisation
(``ThroughputMeter``), and peak memory (``peak_memory_mb``)."""

from __future__ import annotations

import math
import resource
import time
from typing import Any

import torch

from experiments.evaluation.flops import forward_flops_per_token
from experiments.training.datamodule import StreamWindow
from experiments.training.speed import peak_gflops_per_cpu_second
from odelm.lightning import pl


class ThroughputMeter(pl.Callback):
    """Training tokens per second, logged per step and summed over the run (a resumed
    run's sums travel in the checkpoints); on CPU also the model FLOPs utilisation
    (``train/mfu``): 3 x the forward FLOPs per token of the first training batch
    (``experiments.evaluation.flops.forward_flops_per_token``) per second of the
    training's CPU time, over the matrix-product peak per CPU-second at the run's precision
    (``experiments.training.speed.peak_gflops_per_cpu_second``). Both count CPU time, so
    other processes change neither; on an idle machine it is the wall-clock utilisation.
    """

    def __init__(self) -> None:
        self.tokens, self.seconds, self.cpu_seconds = 0, 0.0, 0.0
        self._started = self._cpu_started = 0.0
        self.peak: float | None = None  # GFLOP per CPU-second
        self.flops_per_token: float | None = None

    def on_train_start(self, trainer, task) -> None:
        if task.device.type == "cpu":
            self.peak = peak_gflops_per_cpu_second(str(trainer.precision))

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        self._started, self._cpu_started = time.perf_counter(), time.process_time()

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx) -> None:
        tokens = batch[0] if isinstance(batch, (tuple, list)) else batch
        seconds = time.perf_counter() - self._started
        cpu_seconds = time.process_time() - self._cpu_started
        count = tokens[:, 1:].numel() * trainer.world_size
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds
        self.tokens += count
        if self.peak is not None and self.flops_per_token is None:
            plain = isinstance(batch, StreamWindow) or not isinstance(batch, (tuple, list))
            self.flops_per_token = forward_flops_per_token(task.model, [tokens if plain else batch])
        if trainer.global_step % trainer.log_every_n_steps == 0:  # a step whose logs are written
            task.log("train/tokens_per_s", count / max(seconds, 1e-9))
            mfu = self.utilisation(count, cpu_seconds)
            if mfu is not None:  # None: off CPU, or a model without matrix products
                task.log("train/mfu", mfu)

    def utilisation(
        self, tokens: int | None = None, cpu_seconds: float | None = None
    ) -> float | None:
        """Forward + backward FLOPs of ``tokens`` per CPU-second over the peak (default:
        the run so far); None off CPU or where CPU time was not recorded."""
        tokens = self.tokens if tokens is None else tokens
        cpu_seconds = self.cpu_seconds if cpu_seconds is None else cpu_seconds
        if not (self.peak and self.flops_per_token and tokens and cpu_seconds > 0):
            return None
        return 3 * self.flops_per_token * tokens / cpu_seconds / (self.peak * 1e9)

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tokens, self.seconds = state_dict["tokens"], state_dict["seconds"]
        self.cpu_seconds = state_dict.get("cpu_seconds", math.nan)  # an older checkpoint

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
