"""GPUs for a grid's runs (issue 30): how many one run uses, and which ones a local job sees.

A run uses GPUs when its ``trainer.accelerator`` is ``gpu``/``cuda`` (or ``auto`` on a
machine where CUDA is visible): as many as its ``trainer.devices`` (a count, or a list),
one for ``auto``/``-1``. ``odelm compare --jobs N`` then hands each local job its own GPUs
(``CUDA_VISIBLE_DEVICES``, round robin over the free job slots) when several are visible,
Ray tasks ask for ``num_gpus``, and the submitit launcher starts one task per GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

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
