"""Process-wide kernel settings of a run: the precision of float32 matrix products.

PyTorch's defaults differ by kernel: matrix products in true fp32 but cuDNN (LSTMs,
convolutions) in TF32 on GPUs that have it. ``trainer.matmul_precision`` sets both:
``highest`` is true fp32 everywhere (the default; on the CPU it is PyTorch's own default, so
CPU runs compute what they always did), ``high`` and ``medium`` allow TF32 (and on
``medium`` lower-precision internal products) for speed on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

MATMUL_PRECISIONS = ("highest", "high", "medium")


@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """Run the body under ``precision`` (``MATMUL_PRECISIONS``) for float32 matrix
    products and cuDNN, restoring the process's settings afterwards."""
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = precision != "highest"
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
