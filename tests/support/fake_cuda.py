"""Fake CUDA on a CPU-only machine: a model's forward with every parameter and
input a fake CUDA tensor under ``FakeTensorMode`` shows where a forward makes a tensor on
the CPU (a device mismatch raises) without a GPU.

Two things a CPU build of PyTorch cannot do with fake CUDA tensors are supplied here, by
patching ``FakeTensor``'s Python methods while ``fake_cuda`` is active: Python indexing
(``x[:, 1:]``), ``contiguous`` and ``new_tensor``, whose Python bindings set a CUDA device
guard first, are done by the aten ops they stand for; and a read of a value back to the host
(``.item()``, ``bool(t)``, ``float(t)``, which a fake tensor has no value for) is answered
with the value the same forward read at the same place in the code on real CPU tensors
(``recorded_reads``), so the fake forward takes the control flow of the real one.
Autograd through fake CUDA tensors needs a CUDA build: forwards only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")
"""The Python methods that read a tensor's value back to the host."""

Reads = list[tuple[tuple[tuple[str, int], ...], Any]]
"""Values read back to the host, each with its site in the code."""


def _site() -> tuple[tuple[str, int], ...]:
    """Where a read happens: the three innermost frames outside torch and this file."""
    frames = []
    frame = sys._getframe(2)
    while frame is not None and len(frames) < 3:
        name = frame.f_code.co_filename
        if f"{os.sep}torch{os.sep}" not in name and name != __file__:
            frames.append((name, frame.f_lineno))
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(frames)


@contextmanager
def _patched(cls: type, methods: dict[str, Any]) -> Iterator[None]:
    saved = {name: cls.__dict__.get(name) for name in methods}
    try:
        for name, method in methods.items():
            setattr(cls, name, method)
        yield
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(cls, name)
            else:
                setattr(cls, name, method)


@contextmanager
def recorded_reads() -> Iterator[Reads]:
    """Inside it, every value a real tensor reads back to the host is recorded, with its
    site, in order."""
    reads: Reads = []

    def recording(name: str) -> Any:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any) -> Any:
            out = original(self, *args)
            reads.append((_site(), out))
            return out

        return read

    with _patched(torch.Tensor, {name: recording(name) for name in READS}):
        yield reads


def _basic(x: torch.Tensor, index: Any) -> tuple[torch.Tensor, list[Any]]:
    """``x`` after the basic part of ``index`` (ints, slices, None, Ellipsis), and the
    advanced (tensor) indices by the dimension of the result they index."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(item is Ellipsis for item in items):
        at = next(i for i, item in enumerate(items) if item is Ellipsis)
        used = sum(1 for item in items if item is not None and item is not Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.dim() - used)
    aten = torch.ops.aten
    advanced: list[Any] = []
    dim = 0
    for item in items:
        if item is None:
            x = aten.unsqueeze.default(x, dim)
        elif isinstance(item, int):
            x = aten.select.int(x, dim, item)
            continue
        elif isinstance(item, slice):
            x = aten.slice.Tensor(x, dim, item.start or 0, item.stop, item.step or 1)
        elif isinstance(item, torch.Tensor) and item.dtype != torch.bool:
            advanced.extend([None] * (dim - len(advanced)) + [item])
        else:
            raise NotImplementedError(f"fake CUDA indexing by {type(item).__name__}")
        dim += 1
    return x, advanced


def _getitem(self: torch.Tensor, index: Any) -> torch.Tensor:
    x, advanced = _basic(self, index)
    return torch.ops.aten.index.Tensor(x, advanced) if advanced else x


def _setitem(self: torch.Tensor, index: Any, value: Any) -> None:
    x, advanced = _basic(self, index)
    if not isinstance(value, torch.Tensor):
        value = torch.full((), value, dtype=x.dtype, device=x.device)
    if advanced:
        torch.ops.aten.index_put_.default(x, advanced, value)
    else:
        torch.ops.aten.copy_.default(x, value)


def _new_tensor(self: torch.Tensor, data: Any, dtype: Any = None, device: Any = None,
                requires_grad: bool = False) -> torch.Tensor:  # fmt: skip
    out = torch.tensor(data, dtype=dtype or self.dtype, device=device or self.device)
    return out.requires_grad_(requires_grad)


def _contiguous(self: torch.Tensor, memory_format: Any = torch.contiguous_format) -> Any:
    if self.is_contiguous(memory_format=memory_format):
        return self
    return torch.ops.aten.clone.default(self, memory_format=memory_format)


@contextmanager
def fake_cuda(reads: Reads | None = None) -> Iterator[dict[str, int]]:
    """Inside it (and a ``FakeTensorMode``), fake tensors index as CUDA ones would, and each
    value read back to the host is the one ``reads`` recorded next at that site (code that
    checks the device may read less on CUDA: reads it skips are dropped). Yields counts."""
    pending = list(reads or [])
    counts = {"replayed": 0}

    def replay(self: torch.Tensor, *args: Any) -> Any:
        site = _site()
        while pending and pending[0][0] != site:
            pending.pop(0)
        assert pending, f"the fake forward read a value the real one did not, at {site}"
        counts["replayed"] += 1
        return pending.pop(0)[1]

    methods = {name: replay for name in READS}
    methods.update(
        __getitem__=_getitem, __setitem__=_setitem, contiguous=_contiguous, new_tensor=_new_tensor
    )
    with _patched(FakeTensor, methods):
        yield counts


def to_fake_cuda(model: nn.Module) -> nn.Module:
    """``model`` with every parameter and buffer replaced by a fake CUDA tensor of its shape
    and dtype (tied weights stay tied; no gradients: forwards only). Call it inside the
    ``FakeTensorMode``."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table, wrap in ((module._parameters, True), (module._buffers, False)):
            for name, tensor in list(table.items()):
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    fake = torch.empty(tensor.shape, dtype=tensor.dtype, device="cuda")
                    made[id(tensor)] = nn.Parameter(fake, requires_grad=False) if wrap else fake
                table[name] = made[id(tensor)]
    return model
