"""Where a run trains: ``trainer.accelerator`` as Lightning is given it.

``auto`` (the default) is a GPU when CUDA sees one, else the CPU, as ``--device auto`` of
``odelm eval/generate/discretize`` (``experiments.evaluation.devices``); Lightning's own
``auto`` would also take Apple's MPS or a TPU, where the harness is not tested (the pooled
perplexity is summed in float64, which MPS lacks). Other names go to Lightning unchanged.

The accelerator is where a run computes, not what it computes: ``auto`` is hashed as
``cpu``, the default before ``auto`` (``experiments.training.runs.IDENTITY_RENAMED``), so a
run made on the CPU keeps its hash and its folder, and resumes on a GPU.
"""

from __future__ import annotations

import torch

DEFAULT_ACCELERATOR = "auto"


def lightning_accelerator(name: str) -> str:
    """The accelerator handed to ``pl.Trainer`` for ``trainer.accelerator = name``."""
    if str(name).strip().lower() == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return name
