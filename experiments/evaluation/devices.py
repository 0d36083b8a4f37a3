"""Where a finished run is evaluated: ``--device`` of ``odelm eval/generate/discretize`` and
``load_run(device=...)``. ``auto`` is CUDA when a GPU is visible, else the CPU; a device this
machine lacks is refused in one line before the run loads."""

from __future__ import annotations

import torch

from odelm.errors import OdelmError

DEVICE_CHOICES = "cpu, auto (cuda when a GPU is visible, else cpu), cuda or cuda:N"


class DeviceError(OdelmError, ValueError):
    """A device name that is not one, or a device this machine does not have."""


def resolve_device(name: str | torch.device) -> torch.device:
    """``name`` as a ``torch.device`` (``auto``: ``cuda`` when available, else ``cpu``),
    refusing an unknown name and a CUDA device that is not visible."""
    if isinstance(name, torch.device):
        device = name
    elif str(name).strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(str(name).strip())
        except (RuntimeError, ValueError):
            raise DeviceError(f"device {name!r} is not a device; use {DEVICE_CHOICES}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index is not None and device.index >= count):
            seen = f"{count} CUDA device{'s' * (count != 1)}" if count else "no CUDA device"
            raise DeviceError(
                f"device {str(name)!r} is not available: this machine has {seen}; use cpu or auto"
            )
    return device
