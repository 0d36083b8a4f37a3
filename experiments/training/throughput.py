"""What a run measures of its machine: training throughput and model FLOPs utilisation
(``ThroughputMeter``), and peak memory (``peak_memory_mb``)."""

from __future__ import annotations

import math
import resource
import time
from typing import Any

import torch

from experiments.models.flops import forward_flops_per_token, training_flops
from experiments.training.datamodule import StreamWindow
from experiments.training.speed import training_peak_gflops
from odelm.lightning import pl


class ThroughputMeter(pl.Callback):
    """Training tokens per second, logged per step and summed over the run (a resumed
    run's sums travel in the checkpoints), and the model FLOPs utilisation
    (``train/mfu``): 3 x the forward FLOPs per token of the first training batch
    (``experiments.models.flops.forward_flops_per_token``) per second over the
    matrix-product peak at the run's precision, chosen by device type
    (``experiments.training.speed.training_peak_gflops``).

    On the CPU the seconds are the training's CPU time against the peak per CPU-second, so
    other processes change neither; on an idle machine it is the wall-clock utilisation.
    On CUDA, where kernels run asynchronously, each step is timed with CUDA events recorded
    at its start and end, read (one synchronisation) only on steps whose logs are written,
    at checkpoints and at the end of training, against the device's measured peak.
    """

    def __init__(self) -> None:
        self.tokens, self.seconds, self.cpu_seconds = 0, 0.0, 0.0
        self._started = self._cpu_started = 0.0
        self.peak: float | None = None  # GFLOP per CPU-second on the CPU, per second on CUDA
        self.flops_per_token: float | None = None
        self.device_type = "cpu"
        self._step_start: Any = None  # CUDA: the event recorded at the step's start
        self._pending: list[tuple[Any, Any]] = []  # CUDA: (start, end) events not yet read

    def setup(self, trainer, task, stage: str) -> None:
        device = trainer.strategy.root_device
        if stage == "fit" and device.type == "cuda":  # before the fit resets the memory peak
            self.peak = training_peak_gflops(str(trainer.precision), device)

    def on_train_start(self, trainer, task) -> None:
        self.device_type = task.device.type
        if self.device_type == "cpu":
            self.peak = training_peak_gflops(str(trainer.precision), task.device)

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        self._started, self._cpu_started = time.perf_counter(), time.process_time()
        if self.device_type == "cuda":
            self._step_start = _recorded_event()

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx) -> None:
        tokens = batch[0] if isinstance(batch, (tuple, list)) else batch
        seconds = time.perf_counter() - self._started
        cpu_seconds = time.process_time() - self._cpu_started
        count = tokens[:, 1:].numel() * trainer.world_size
        cuda = self.device_type == "cuda"
        if cuda:
            self._pending.append((self._step_start, _recorded_event()))
        else:
            self.seconds += seconds
        self.cpu_seconds += cpu_seconds
        self.tokens += count
        if self.peak is not None and self.flops_per_token is None:
            plain = isinstance(batch, StreamWindow) or not isinstance(batch, (tuple, list))
            self.flops_per_token = forward_flops_per_token(task.model, [tokens if plain else batch])
        if trainer.global_step % trainer.log_every_n_steps == 0:  # a step whose logs are written
            if cuda:
                seconds = self._settle()
            task.log("train/tokens_per_s", count / max(seconds, 1e-9))
            mfu = self.utilisation(count, seconds if cuda else cpu_seconds)
            if mfu is not None:  # None: no peak here, or a model without matrix products
                task.log("train/mfu", mfu)

    def on_train_end(self, trainer, task) -> None:
        self._settle()

    def _settle(self) -> float:
        """CUDA: wait for the last step recorded, add the seconds of the steps not yet
        read to the run's, and return the last step's (0 with none pending)."""
        if not self._pending:
            return 0.0
        self._pending[-1][1].synchronize()
        steps = [start.elapsed_time(end) / 1e3 for start, end in self._pending]
        self._pending.clear()
        self.seconds += sum(steps)
        return steps[-1]

    def utilisation(self, tokens: int | None = None, seconds: float | None = None) -> float | None:
        """Forward + backward FLOPs of ``tokens`` per second over the peak (default: the run
        so far); the seconds are CPU seconds on the CPU, CUDA-timed seconds on CUDA. None
        without a peak or where the time was not recorded."""
        tokens = self.tokens if tokens is None else tokens
        if seconds is None:
            self._settle()
            seconds = self.seconds if self.device_type == "cuda" else self.cpu_seconds
        if not (self.peak and self.flops_per_token and tokens and seconds > 0):
            return None
        return training_flops(self.flops_per_token, tokens) / seconds / (self.peak * 1e9)

    def state_dict(self) -> dict[str, Any]:
        self._settle()
        return {"tokens": self.tokens, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tokens, self.seconds = state_dict["tokens"], state_dict["seconds"]
        self.cpu_seconds = state_dict.get("cpu_seconds", math.nan)  # an older checkpoint

    @property
    def tokens_per_second(self) -> float | None:
        self._settle()
        return self.tokens / self.seconds if self.seconds else None


def _recorded_event() -> torch.cuda.Event:
    """A CUDA timing event recorded on the current stream (no synchronisation)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
