"""The GPU check's GPT-2-small phase (issue 50): the library's blocks at the size researchers
use a GPU for, each against a nanoGPT-class plain GPT of the same shape in the same process.

Size: 12 layers, d 768, 12 heads, FFN 3,072, 1,024 tokens, a 50,257-word vocabulary, tied
embeddings, learned positions, no dropout (about 124M parameters); bf16 autocast,
``torch.compile`` (inductor) and the fused AdamW for every model. The plain GPT
(``benchmarks.gpu_models.PlainGPT``: SDPA with ``is_causal``, ``F.cross_entropy``) is compiled
with its loss, as nanoGPT is; the library's models go through ``trainer.compile``'s
``CompiledModel``, which on a GPU compiles the forward and the loss as one graph. Models, in
the order measured (the targets' models first, the cheapest compiles first, so a phase cut
short keeps them): ``plain``, ``residual``, ``rk2``, ``rk4``, ``node-shared`` (the
``node-transformer``'s one shared field, 12 Euler steps on [0, 1]: the FLOPs of 12 layers,
the parameters of one).

The batch fills the device: an eager step of the plain GPT at batch 1 gives the memory of
the weights and optimizer state and of one sequence's activations; the batch is the power
of two that fills ``FILL`` of the free memory with them (at most ``MAX_BATCH``), the same
for every model but the RK blocks, which take it over their stages (``STAGES``); a model
that runs out of memory there halves it (at most ``HALVINGS``
times; its ``batch`` is recorded). Each model: the first step (which compiles) and its
``compile_s``, then tokens/s, ``torch.cuda.max_memory_allocated`` and MFU against the bf16
matmul peak the environment phase measured (FLOPs counted by ``FlopCounterMode`` on an
eager step of one sequence, times the batch). The short mode runs it all on the CPU at
tiny sizes in fp32 (the branches a GPU takes: SDPA attention, ``F.cross_entropy``) with the
``eager`` compile backend, to keep the code working.
"""

from __future__ import annotations

import itertools
import time
from functools import partial
from typing import Any

import torch
from torch import nn

from benchmarks.gpu_models import (
    PlainGPT,
    Sizes,
    Stepper,
    build,
    free,
    peak_memory_mb,
    random_batches,
    ratio,
    seconds_per_call,
    step_flops,
    sync,
)
from benchmarks.gpu_phases import Context, attempt, fmt

GPT2 = Sizes(768, 12, 3072, 12, 8, 1024, 50257, 2, 8, 8192, 8192, 1000, 16, 64)
"""GPT-2 small (``batch``: the CPU's batch; on a GPU it is chosen to fill the memory)."""
GPT2_SHORT = Sizes(32, 2, 64, 2, 4, 16, 100, 1, 2, 256, 64, 100, 4, 16)
"""The short mode's tiny stand-in."""
GPT2_MODELS = ("plain", "residual", "rk2", "rk4", "node-shared")
STAGES = {"rk2": 2, "rk4": 4}
"""Evaluations of the field per layer: an RK block keeps each one's activations for backward,
so it starts from the plain GPT's batch over its stages (no second compile after running out
of memory)."""
FILL, MAX_BATCH, HALVINGS = 0.8, 128, 4


def gpt2_spec(sizes: Sizes, name: str) -> dict[str, Any]:
    """The library's ``model`` section of ``name`` at ``sizes`` (no dropout, as nanoGPT)."""
    shape: dict[str, Any] = {"d_model": sizes.d_model, "n_heads": sizes.n_heads}
    shape["d_ff"] = sizes.d_ff
    shape |= {"max_positions": sizes.seq + 1, "dropout": 0.0}
    if name == "node-shared":
        return {"family": "neuralode_lm", "name": "node-transformer", **shape, "n_layers": 1}
    return {
        "family": "ode_transformer",
        **shape,
        "n_layers": sizes.n_layers,
        "attention_dropout": 0.0,
        "relu_dropout": 0.0,
        "block": name,
    }


def _node_shared(spec: dict[str, Any], sizes: Sizes) -> dict[str, Any]:
    return spec | {"field_dropout": 0.0, "solver": {"method": "euler"}, "steps": sizes.n_layers}


def make_model(sizes: Sizes, name: str) -> nn.Module:
    """A fresh model ``name`` of ``GPT2_MODELS`` at ``sizes`` (seed 0), on the CPU."""
    torch.manual_seed(0)
    if name == "plain":
        return PlainGPT(sizes, dropout=0.0)
    spec = gpt2_spec(sizes, name)
    return build(_node_shared(spec, sizes) if name == "node-shared" else spec, sizes.vocab)


def choose_batch(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """The batch that fills the device (see the module docstring); ``sizes.batch`` on the CPU."""
    device = ctx.device
    if device.type != "cuda":
        return {"batch": sizes.batch, "how": "the CPU: the short mode's fixed batch"}
    free(device)
    model = make_model(sizes, "plain").to(device)
    step = Stepper(model, bf16=True, fused=True)
    step(random_batches(1, 1, sizes.seq, sizes.vocab, device)[0])
    sync(device)
    static = torch.cuda.memory_allocated(device)  # weights, gradients, AdamW's state
    per_row = max(1, torch.cuda.max_memory_allocated(device) - static)
    del model, step
    free(device)
    available = torch.cuda.mem_get_info(device)[0]
    return {
        "batch": fill_batch(available, static, per_row),
        "how": f"{FILL:.0%} of {available / 2**30:.1f} GiB free over one eager sequence's "
        f"{per_row / 2**20:.0f} MiB, past {static / 2**20:.0f} MiB of weights and state",
    }


def fill_batch(available: float, static: float, per_row: float) -> int:
    """The largest power of two of rows (at most ``MAX_BATCH``, at least 1) whose
    activations, ``per_row`` bytes each, fit in ``FILL`` of ``available`` bytes past
    ``static``."""
    rows = max(1, int((FILL * available - static) // per_row))
    return min(MAX_BATCH, 1 << (rows.bit_length() - 1))


def measure(ctx: Context, sizes: Sizes, name: str, batch: int) -> dict[str, Any]:
    """One model's record, halving the batch on running out of memory (bounded)."""
    for _ in range(HALVINGS):
        try:
            return _measure(ctx, sizes, name, batch)
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
        free(ctx.device)  # out of the handler: its traceback, holding the model, is gone
        batch //= 2
    return _measure(ctx, sizes, name, batch)


def _measure(ctx: Context, sizes: Sizes, name: str, batch: int) -> dict[str, Any]:
    device, cuda = ctx.device, ctx.device.type == "cuda"
    free(device)
    model = make_model(sizes, name).to(device)
    one = random_batches(1, 1, sizes.seq, sizes.vocab, device)[0]
    eager = Stepper(model, bf16=cuda, lr=1e-4, fused=cuda)
    flops = step_flops(partial(eager, one)) * batch  # FLOPs scale with the rows
    del eager
    free(device)
    backend = "inductor" if cuda else "eager"
    step = Stepper(model, bf16=cuda, lr=1e-4, compile_backend=backend, fused=cuda)
    data = itertools.cycle(random_batches(2, batch, sizes.seq, sizes.vocab, device))
    started = time.perf_counter()
    step(next(data))
    sync(device)
    first = time.perf_counter() - started
    ctx.check()
    seconds = seconds_per_call(lambda: step(next(data)), device, sizes.warmup, sizes.timed)
    peak = ctx.results.get("environment", {}).get("peak_tflops", {}).get("bf16" if cuda else "fp32")
    return {
        "batch": batch,
        "tokens_per_s": batch * sizes.seq / seconds,
        "step_ms": seconds * 1e3,
        "peak_memory_mb": peak_memory_mb(device),
        "step_tflop": flops / 1e12,
        "mfu": flops / seconds / (peak * 1e12) if peak else None,
        "compile_s": max(0.0, first - seconds),
        "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "backend": backend,
    }


def gpt2_ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each library model over the plain GPT: tokens/s, peak memory, MFU."""
    plain = runs.get("plain", {})
    return {
        f"{name}/plain": {
            key: ratio(runs.get(name, {}).get(key), plain.get(key))
            for key in ("tokens_per_s", "peak_memory_mb", "mfu")
        }
        for name in GPT2_MODELS[1:]
    }


def gpt2_small(ctx: Context, record: dict[str, Any]) -> None:
    """GPT-2 small: every model of ``GPT2_MODELS`` against the plain GPT (the module docstring)."""
    sizes = GPT2_SHORT if ctx.short else GPT2
    record["size"] = {k: getattr(sizes, k) for k in ("d_model", "n_heads", "d_ff", "n_layers")}
    record["size"] |= {"seq": sizes.seq, "vocab": sizes.vocab}
    record["timing"] = f"the first step (compiles), {sizes.warmup} warm-up, mean of {sizes.timed}"
    record["node-shared"] = "node-transformer, one field, n_layers Euler steps on [0, 1]"
    if ctx.device.type != "cuda":
        record["peak_memory"] = "not measured on the CPU (torch.cuda.max_memory_allocated)"
    record["batch"] = choose_batch(ctx, sizes)
    runs, batch = record.setdefault("runs", {}), record["batch"]["batch"]
    for name in GPT2_MODELS:
        ctx.check()
        runs[name] = attempt(
            partial(measure, ctx, sizes, name, max(1, batch // STAGES.get(name, 1)))
        )
        record["ratios"] = gpt2_ratios(runs)
    free(ctx.device)
    residual = record["ratios"]["residual/plain"]
    record["summary"] = (
        f"plain MFU {fmt(runs['plain'].get('mfu'))}; residual/plain tokens/s "
        f"{fmt(residual['tokens_per_s'])}, memory {fmt(residual['peak_memory_mb'])}; MFU/plain "
        + ", ".join(f"{n} {fmt(record['ratios'][f'{n}/plain']['mfu'])}" for n in GPT2_MODELS[2:])
    )
