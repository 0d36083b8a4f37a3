"""Training-speed benchmarks (``odelm bench precision-speedup``, ``compile-speedup``,
``peak``, ``harness-throughput``), on the models and step of ``experiments.training.speed``.

* ``precision-speedup``: training tokens/s under ``bf16-mixed`` over ``32-true`` for the
  LSTM, the reference Transformer, an RK4 ``ode_transformer`` and a fixed-grid
  ``node-transformer`` (target 2.0 on the Transformers, reported for all).
* ``compile-speedup``: training tokens/s with ``trainer.compile`` over eager for the RK4
  ``ode_transformer``, the fixed-grid ``node-transformer`` and the reference Transformer;
  the compile time (the first compiled step) is reported apart.
* ``peak``: the matrix-product peak of this machine (``torch.matmul`` at 700 x 200 @
  200 x 10,000), fp32 and bf16, at one thread and at every available thread.

Each prints a table on stderr; ``ODELM_BENCH_THREADS`` sets the thread count (default 1).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import torch
import torch._inductor.config

from experiments.training.speed import (
    BATCH,
    BPTT,
    CUDA_PEAK_SIZE,
    PEAK_SHAPE,
    SPEED_MODELS,
    TrainingStep,
    alternate,
    batches,
    bench_threads,
    build_task,
    cuda_matmul_gflops,
    matmul_gflops,
)

TRANSFORMERS = ("transformer", "ode_transformer rk4", "node-transformer rk4 grid")


def _cycling_step(step: TrainingStep, data: list[torch.Tensor]) -> Any:
    """A call running ``step`` on the next batch of ``data`` (round robin)."""
    source = itertools.cycle(data)
    return lambda: step(next(source))


def precision_speedup(rounds: int = 20) -> list[dict[str, Any]]:
    """Training tokens/s with ``bf16-mixed`` over ``32-true``, per model: one training step
    (20 x 35 tokens, SGD, clipping 0.25) alternating between two copies of the same model,
    ``rounds`` steps each after two warm-up steps, medians."""
    torch.set_num_threads(bench_threads())
    data = batches(4)
    records = []
    for name in SPEED_MODELS:
        calls = {
            precision: _cycling_step(TrainingStep(build_task(name), precision), data)
            for precision in ("32-true", "bf16-mixed")
        }
        seconds = alternate(calls, rounds, warmup=2)
        tokens = BATCH * BPTT
        ratio = seconds["32-true"] / seconds["bf16-mixed"]
        print(
            f"precision-speedup {name}: fp32 {tokens / seconds['32-true']:.0f} tok/s, "
            f"bf16 {tokens / seconds['bf16-mixed']:.0f} tok/s, ratio {ratio:.2f}"
        )
        records.append(
            {
                "bench": "precision-speedup",
                "metric": f"tokens_per_s_bf16_over_fp32 {name}",
                "value": ratio,
                "target": 2.0 if name in TRANSFORMERS else None,
                "unit": "x",
                "better": "higher",
                "fp32_tokens_per_s": tokens / seconds["32-true"],
                "bf16_tokens_per_s": tokens / seconds["bf16-mixed"],
                "threads": torch.get_num_threads(),
                "iterations": f"{rounds} steps each, alternating, medians",
            }
        )
    return records


def peak() -> list[dict[str, Any]]:
    """Matrix-product GFLOP/s, fp32 and bf16 alternating, at 1 and at all threads; on a
    machine with a CUDA device also the GPU's (``cuda_peak``)."""
    counts = sorted({1, os.cpu_count() or 1})
    records = []
    for threads in counts:
        torch.set_num_threads(threads)
        measured: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for index in range(6):
            order = [("fp32", torch.float32), ("bf16", torch.bfloat16)]
            for label, dtype in order if index % 2 == 0 else order[::-1]:
                measured[label].append(matmul_gflops(dtype, repeats=3))
        for label, values in measured.items():
            gflops = sorted(values)[len(values) // 2]
            print(f"peak {label} at {threads} thread(s): {gflops:.0f} GFLOP/s")
            records.append(
                {
                    "bench": "peak",
                    "metric": f"matmul_gflops {label} {threads} thread(s)",
                    "value": gflops,
                    "target": None,
                    "unit": "GFLOP/s",
                    "better": "higher",
                    "shape": "{} x {} @ {} x {}".format(*PEAK_SHAPE[:2], *PEAK_SHAPE[1:]),
                    "threads": threads,
                }
            )
    torch.set_num_threads(bench_threads())
    return records + (cuda_peak() if torch.cuda.is_available() else [])


def cuda_peak(device: str = "cuda") -> list[dict[str, Any]]:
    """A CUDA device's matrix-product GFLOP/s, fp32 (at the current TF32 setting) and bf16
    alternating, each product timed with CUDA events (``cuda_matmul_gflops``), medians of 3:
    the peak a training run on that device divides its model FLOPs utilisation by."""
    name, n = torch.cuda.get_device_name(device), CUDA_PEAK_SIZE
    measured: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for index in range(3):
        order = [("fp32", torch.float32), ("bf16", torch.bfloat16)]
        for label, dtype in order if index % 2 == 0 else order[::-1]:
            measured[label].append(cuda_matmul_gflops(dtype, device))
    records = []
    for label, values in measured.items():
        gflops = sorted(values)[len(values) // 2]
        print(f"peak {label} on {name}: {gflops:.0f} GFLOP/s")
        records.append(
            {
                "bench": "peak",
                "metric": f"matmul_gflops {label} cuda",
                "value": gflops,
                "target": None,
                "unit": "GFLOP/s",
                "better": "higher",
                "shape": f"{n} x {n} @ {n} x {n}",
                "device": name,
                "tf32": torch.backends.cuda.matmul.allow_tf32,
            }
        )
    return records


COMPILED = ("ode_transformer rk4", "node-transformer rk4 grid", "transformer")


def compile_speedup(rounds: int = 8) -> list[dict[str, Any]]:
    """Training tokens/s with ``trainer.compile`` over eager, per model, at ``32-true``:
    the first compiled step (which compiles) is timed alone and left out of the ratio."""
    torch.set_num_threads(bench_threads())
    data = batches(4)
    records = []
    for name in COMPILED:
        compiled_step = TrainingStep(build_task(name, compile=True))
        started = time.perf_counter()
        with torch._inductor.config.patch(force_disable_caches=True):  # a cold compile
            compiled_step(data[0])
        first_step = time.perf_counter() - started
        calls = {
            "eager": _cycling_step(TrainingStep(build_task(name)), data),
            "compiled": _cycling_step(compiled_step, data),
        }
        seconds = alternate(calls, rounds, warmup=1)
        ratio = seconds["eager"] / seconds["compiled"]
        tokens = BATCH * BPTT
        print(
            f"compile-speedup {name}: eager {tokens / seconds['eager']:.0f} tok/s, compiled "
            f"{tokens / seconds['compiled']:.0f} tok/s, ratio {ratio:.2f}; first compiled "
            f"step (compiling) {first_step:.1f} s"
        )
        records.append(
            {
                "bench": "compile-speedup",
                "metric": f"tokens_per_s_compiled_over_eager {name}",
                "value": ratio,
                "target": 1.0,
                "unit": "x",
                "better": "higher",
                "eager_tokens_per_s": tokens / seconds["eager"],
                "compiled_tokens_per_s": tokens / seconds["compiled"],
                "compile_s": first_step,
                "threads": torch.get_num_threads(),
                "iterations": f"{rounds} steps each after a warm-up, alternating, medians; "
                "compile_s is the first compiled step, inductor's caches off",
            }
        )
    return records
