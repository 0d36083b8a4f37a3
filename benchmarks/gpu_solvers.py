"""The GPU check's adjoint phase (issue 50): the dopri5 ODE head with the adjoint, its peak
memory against the integration length and its host syncs per training step, for each
backend (torchdiffeq, torchode).

The head is a ``CausalODEHead`` (its MLP field of width ``d_model``, hidden ``d_ff``; dopri5
at the facade's default tolerances, ``adjoint=True``) on ``solver_rows`` encoder states,
integrated over ``[0, S]`` for ``S`` in ``LENGTHS`` and scored by cross-entropy over a
vocabulary of ``small_vocab`` words; the NFE per unit time of each length is recorded
(``nfe_per_unit_time``: forward and backward evaluations over ``S``), so the peaks are read
at equal NFE per unit time where those agree. The adjoint keeps no stage of the forward solve for backward, so its
peak memory (``torch.cuda.max_memory_allocated`` around forward and backward) should not
grow with ``S``: the target is the largest peak over ``S`` = 2, 4, 8 within 1.2x the smallest.

Host syncs on CUDA: ``torch.cuda.set_sync_debug_mode("warn")`` warns at every operation that
waits for the device; the warnings of one forward and backward are counted. On the CPU
(short mode) there is nothing to wait for: the reads of a value back to the host
(``.item()``, ``bool(t)``, ``float(t)``, ``.tolist()``) are counted instead, labelled so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from benchmarks.gpu_models import free, peak_memory_mb, ratio, sync
from benchmarks.gpu_phases import Context, attempt, fmt

LENGTHS = (2.0, 4.0, 8.0)
"""Integration times: 2 to 8 times the head's default of 1."""
BACKENDS = ("torchdiffeq", "torchode")
READS = ("item", "tolist", "__bool__", "__float__", "__int__")
"""The Python methods that read a tensor's value back to the host."""


@contextlib.contextmanager
def counted_reads() -> Iterator[list[str]]:
    """Inside it, each read of a tensor's value back to the host appends the method's name."""
    reads: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name: str) -> Callable[..., Any]:
        def read(self: torch.Tensor, *args: Any) -> Any:
            reads.append(name)
            return saved[name](self, *args)

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, counting(name))
        yield reads
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def host_syncs(call: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """The synchronising operations of ``call()`` on CUDA, or its host reads on the CPU."""
    if device.type != "cuda":
        with counted_reads() as reads:
            call()
        return {"host_reads": len(reads), "how": "reads back to the host, counted on the CPU"}
    sync(device)
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return {"syncs": len(syncs), "how": "torch.cuda.set_sync_debug_mode warnings"}


def _head(ctx: Context, backend: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Fill ``entry`` with one backend's peaks, NFE and host syncs; return it."""
    import torch.nn.functional as F

    from neuralode_lm import CausalODEHead

    sizes, device = ctx.sizes, ctx.device
    torch.manual_seed(0)
    solver = {"method": "dopri5", "adjoint": True, "backend": backend}
    head = CausalODEHead(sizes.d_model, sizes.small_vocab, field_hidden=sizes.d_ff, solver=solver)
    head = head.to(device).train()
    rows = sizes.solver_rows
    hidden = torch.randn(rows // sizes.small_seq, sizes.small_seq, sizes.d_model, device=device)
    targets = torch.randint(0, sizes.small_vocab, (hidden.shape[0] * sizes.small_seq,))
    targets = targets.to(device)
    nfe: dict[str, Any] = {}

    def step(length: float) -> None:
        head.zero_grad(set_to_none=True)
        head.integration_time = length
        logits, _ = head(hidden.clone().requires_grad_())
        F.cross_entropy(logits.flatten(0, 1).float(), targets).backward()
        stats = head.last_stats
        nfe[f"{length:g}"] = {"forward": stats.nfe_forward, "backward": stats.nfe_backward}

    step(LENGTHS[0])  # warm-up: imports, first kernels
    peaks = entry.setdefault("peak_memory_mb", {})
    for length in LENGTHS:
        ctx.check()
        free(device)
        step(length)
        sync(device)
        peaks[f"{length:g}"] = peak_memory_mb(device)
    entry["nfe"] = nfe
    entry["nfe_per_unit_time"] = {
        key: (value["forward"] + value["backward"]) / float(key) for key, value in nfe.items()
    }
    measured = [peak for peak in peaks.values() if isinstance(peak, float)]
    entry["memory_ratio"] = ratio(max(measured), min(measured)) if measured else None
    ctx.check()
    entry["per_step"] = host_syncs(lambda: step(LENGTHS[0]), device)
    return entry


def adjoint_head(ctx: Context, record: dict[str, Any]) -> None:
    """The adjoint dopri5 head's peak memory against ``S`` and host syncs, per backend."""
    sizes = ctx.sizes
    record["head"] = (
        f"CausalODEHead({sizes.d_model}, vocabulary {sizes.small_vocab}, field hidden "
        f"{sizes.d_ff}) on {sizes.solver_rows} states"
    )
    record["lengths"] = list(LENGTHS)
    if ctx.device.type != "cuda":
        record["peak_memory"] = "not measured on the CPU (torch.cuda.max_memory_allocated)"
    for backend in BACKENDS:
        ctx.check()
        if importlib.util.find_spec(backend) is None:
            record[backend] = {"skipped": f"{backend} is not installed (pip install {backend})"}
            continue
        entry = record.setdefault(backend, {})
        entry.update(attempt(partial(_head, ctx, backend, entry)))
    free(ctx.device)
    record["summary"] = "; ".join(_line(backend, record[backend]) for backend in BACKENDS)


def _line(backend: str, entry: dict[str, Any]) -> str:
    if "skipped" in entry or "error" in entry:
        return f"{backend}: {entry.get('skipped') or entry.get('error')}"
    syncs = entry.get("per_step", {})
    count = syncs.get("syncs", syncs.get("host_reads"))
    what = "syncs" if "syncs" in syncs else "host reads"
    return f"{backend}: peak memory max/min over S 2-8 {fmt(entry.get('memory_ratio'))}, {what}/step {count}"
