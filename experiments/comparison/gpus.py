"""GPUs for a grid's runs (issue 30): how many one run uses, and which ones a local job sees.

A run uses GPUs when its ``trainer.accelerator`` is ``gpu``/``cuda`` (or ``auto`` on a
machine where CUDA is visible): as many as its ``trainer.devices`` (a count, or a list),
one for ``auto``/``-1``. ``odelm compare --jobs N`` then hands each local job its own GPUs
(``CUDA_VISIBLE_DEVICES``, round robin over the free job slots) when several are visible,
Ray tasks ask for ``num_gpus``, and the submitit launcher starts one task per GPU. With one
visible GPU the local jobs share it (a study packed on one device, issue 50):
``MemoryGate`` starts a job only when the device has the memory ``run_memory_mb`` estimates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from odelm.errors import OdelmError

GPU_ACCELERATORS = ("gpu", "cuda")


def run_gpus(accelerator: str, devices: Any) -> int:
    """The GPUs one run trains on (0: the CPU)."""
    name = str(accelerator).lower()
    if name not in GPU_ACCELERATORS and not (name == "auto" and torch.cuda.is_available()):
        return 0
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    if isinstance(devices, list | tuple):
        return max(1, len(devices))
    if isinstance(devices, str) and devices.strip().isdigit() and int(devices) > 0:
        return int(devices)
    return 1  # "auto", -1: Lightning takes what it sees; one at least


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may hand out: its ``CUDA_VISIBLE_DEVICES``, else all CUDA sees."""
    environ = os.environ if environ is None else environ
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [gpu.strip() for gpu in given.split(",") if gpu.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]


def job_env(
    gpus: int, slot: int, environ: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The environment of the local job in ``slot`` (0, 1, ...): its own ``gpus`` GPUs,
    round robin, when the run uses GPUs and several are visible; None (inherit) otherwise."""
    environ = os.environ if environ is None else environ
    visible = visible_gpus(environ) if gpus else []
    if len(visible) < 2:
        return None
    chosen = [visible[(slot * gpus + index) % len(visible)] for index in range(gpus)]
    return {**environ, "CUDA_VISIBLE_DEVICES": ",".join(dict.fromkeys(chosen))}


def free_slot(busy: set[int]) -> int:
    """The lowest job slot not in ``busy``."""
    return next(slot for slot in range(len(busy) + 1) if slot not in busy)


# ------------------------------------------------------------- runs packed on one device

CONTEXT_MB = 600.0
"""What one process's CUDA context holds on the device before its first tensor (about
500 MiB on an H100, rounded up)."""
VOCAB_BOUND = 50_257
"""The vocabulary an estimate assumes (the largest of the library's tokenizers, GPT-2's): a
run's corpus is not loaded before it starts."""
MEMORY_WAIT_S = 600.0
"""How long a job waits for memory when no run of the grid is in flight to free some."""


class GPUMemoryError(OdelmError, RuntimeError):
    """A run does not fit on its GPU, or waited too long for memory to free up."""


def run_memory_mb(model: dict[str, Any], batch_size: int, window: int) -> float:
    """A generous estimate of the device memory one training run of the ``model`` section
    needs, in MiB: the CUDA context, weights, gradients and AdamW's two moments (16 bytes a
    parameter), and per token 12 bytes a logit (bf16 logits, their fp32 loss, the gradient)
    and 32 bytes per output of each linear map but the output layer (kept for backward,
    several RK stages each).
    The parameters are counted on the meta device; a model that cannot be built there is
    taken at 16 million parameters."""
    from torch import nn

    from experiments.models.build import build_model

    try:
        with torch.device("meta"):
            built = build_model(dict(model), VOCAB_BOUND)
        parameters = sum(p.numel() for p in built.parameters())
        linears = [m.out_features for m in built.modules() if isinstance(m, nn.Linear)]
        outputs = sum(width for width in linears if width != VOCAB_BOUND)  # not the logits
    except Exception:  # noqa: BLE001 - an estimate: a model that will not build gets a default
        parameters, outputs = 16_000_000, 16_384
    tokens = batch_size * window
    state = 16 * parameters + tokens * (12 * VOCAB_BOUND + 32 * outputs)
    return CONTEXT_MB + state / 2**20


def fitting_runs(need_mb: float, free_mb: float) -> int:
    """How many runs of ``need_mb`` fit in ``free_mb``."""
    return int(free_mb // need_mb) if need_mb > 0 else 0


class MemoryGate:
    """Checks, before a local GPU job starts, that its device has the memory the run needs:
    the free memory (``torch.cuda.mem_get_info``) less what the runs already started on that
    device may still claim (their estimates over what they hold is not known: the whole
    estimate is reserved while they run). A job that does not fit waits while a run of the
    grid is in flight on its device (one will end), at most ``wait_s`` seconds otherwise
    (the memory is held by processes odelm did not start), then is refused in one line; a
    run that needs more than the device has in all is refused before any job starts. Jobs
    on the CPU,
    remote launchers and machines without CUDA pass unchecked."""

    def __init__(
        self, launcher: str = "local", jobs: Sequence[Any] = (), wait_s: float = MEMORY_WAIT_S
    ) -> None:
        self.active = launcher == "local" and torch.cuda.is_available()
        self.wait_s = wait_s
        self.waiting_since: float | None = None
        self.slots: dict[str, int] = {}
        if self.active and any(job.gpus for job in jobs):
            self.check_sizes(jobs)

    def check_sizes(self, jobs: Sequence[Any]) -> None:
        """Refuse, before any job starts, a GPU run larger than the smallest visible GPU."""
        devices = range(max(1, len(visible_gpus())))
        total, device = min((torch.cuda.mem_get_info(d)[1] / 2**20, d) for d in devices)
        for job in jobs:
            if job.gpus and job.memory_mb > total:
                raise GPUMemoryError(
                    f"run {job.run} needs about {job.memory_mb:.0f} MiB but GPU {device} has "
                    f"{total:.0f} MiB in all; use a smaller model or batch, or a larger GPU"
                )

    def device(self, slot: int, gpus: int) -> int:
        """The index (in this process's numbering) of the first GPU slot ``slot`` gets."""
        return (slot * gpus) % max(1, len(visible_gpus()))

    def ready(self, job: Any, in_flight: Mapping[str, Any], clock: float | None = None) -> bool:
        """Whether ``job`` may start now (its slot reserved); False: wait; raises
        ``GPUMemoryError`` to refuse it. ``in_flight``: ``run_jobs``'s running jobs, run name
        -> ``(job, handle, started)``."""
        if not self.active or not job.gpus:
            return True
        running = [entry[0] for entry in in_flight.values()]
        slot = free_slot({self.slots[r.run] for r in running if r.run in self.slots})
        device = self.device(slot, job.gpus)
        free, total = (value / 2**20 for value in torch.cuda.mem_get_info(device))
        sharing = [r for r in running if self.device(self.slots.get(r.run, 0), r.gpus) == device]
        reserved = sum(r.memory_mb for r in sharing if r.gpus)
        if job.memory_mb <= min(free, total - reserved):
            self.slots[job.run], self.waiting_since = slot, None
            return True
        now = time.monotonic() if clock is None else clock
        self.waiting_since = now if self.waiting_since is None else self.waiting_since
        if not sharing and now - self.waiting_since > self.wait_s:
            raise GPUMemoryError(
                f"run {job.run} needs about {job.memory_mb:.0f} MiB but GPU {device} has "
                f"had {free:.0f} MiB free for {self.wait_s:.0f} s, held by other processes; "
                "free the GPU or lower --jobs"
            )
        return False
