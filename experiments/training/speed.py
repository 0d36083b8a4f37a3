"""What the speed benchmarks share: the models, the library's training step, alternating
timing, and the machine's matrix-product peak (the denominator of model FLOPs utilisation).

The benchmarks (``benchmarks.training_speed``) time the library's own training step
(``TrainingStep``: the task's loss under Lightning's precision plugin, backward,
gradient clipping, the optimizer) on fixed random 20 x 35 batches with a 10k vocabulary,
one thread unless ``ODELM_BENCH_THREADS`` says otherwise. Configurations are timed in one
process, alternating which goes first, and medians are reported, so a machine whose load
changes during the run moves all of them alike.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from experiments.models.build import build_model
from experiments.training.allocator import keep_freed_memory
from experiments.training.config import OptimConfig
from experiments.training.task import LMTask
from odelm.errors import OdelmError
from odelm.lightning import pl
from odelm.mixed_precision import emulated_products
from odelm.timing import alternating, medians

VOCAB, BATCH, BPTT = 10_000, 20, 35
"""The reference example's word-level setting: 10k words, 20 x 35-token windows."""

SPEED_MODELS: dict[str, dict[str, Any]] = {
    "lstm": {
        "family": "neuralode_lm",
        "name": "lstm",
        "embed_dim": 200,
        "hidden_dim": 200,
        "n_layers": 2,
        "dropout": 0.2,
        "input_dropout": 0.2,
        "init_range": 0.1,
        "tie_embeddings": True,
    },
    "transformer": {
        "family": "reference",
        "name": "transformer",
        "d_model": 200,
        "n_heads": 2,
        "d_ff": 200,
        "n_layers": 2,
        "dropout": 0.2,
    },
    "ode_transformer rk4": {
        "family": "ode_transformer",
        "preset": "small",
        "d_model": 200,
        "n_heads": 2,
        "d_ff": 200,
        "n_layers": 2,
        "block": "rk4",
    },
    "node-transformer rk4 grid": {
        "family": "neuralode_lm",
        "name": "node-transformer",
        "d_model": 200,
        "n_heads": 2,
        "d_ff": 200,
        "n_layers": 2,
        "solver": {"method": "rk4"},
        "steps": 1,
    },
}
"""The benchmarked models at the reference example's size (d 200, 2 layers, FFN 200)."""

SGD = OptimConfig(optimizer="sgd", lr=5.0, grad_clip=0.25)
"""The reference example's optimizer: plain SGD, gradient norm clipped at 0.25."""


class PrecisionNameError(OdelmError, ValueError):
    """A precision the speed benchmarks cannot run."""


def bench_threads() -> int:
    """Threads the speed benchmarks use: ``$ODELM_BENCH_THREADS``, else 1."""
    return int(os.environ.get("ODELM_BENCH_THREADS", "1"))


def precision_plugin(precision: str, device: str = "cpu") -> pl.plugins.precision.Precision:
    """Lightning's precision plugin of a ``trainer.precision`` name."""
    if precision in ("32-true", "32"):
        return pl.plugins.precision.Precision()
    try:
        return pl.plugins.precision.MixedPrecision(precision, device)  # type: ignore[arg-type]
    except (pl.utilities.exceptions.MisconfigurationException, ValueError) as error:
        raise PrecisionNameError(
            f"precision {precision!r} cannot be benchmarked ({error}); use 32-true or bf16-mixed"
        ) from None


def batches(count: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` fixed random windows ``[BATCH, BPTT + 1]`` of the 10k vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, BPTT + 1), generator=generator) for _ in range(count)]


def build_task(
    name: str, optim: OptimConfig = SGD, seed: int = 0, *, compile: bool = False
) -> LMTask:
    """The training task of ``SPEED_MODELS`` ``name`` (seeded initialisation)."""
    torch.manual_seed(seed)
    return LMTask(build_model(SPEED_MODELS[name], VOCAB), optim, compile=compile).train()


class TrainingStep:
    """One optimizer step of ``task`` as Lightning's loop runs it: the task's loss under
    the precision plugin's autocast region, backward, gradient clipping, the optimizer;
    with the allocator setting a training process has (``LMTask.on_fit_start``)."""

    def __init__(self, task: LMTask, precision: str = "32-true") -> None:
        if task.device.type == "cpu":
            keep_freed_memory()
        self.task, self.plugin, self.precision = task, precision_plugin(precision), precision
        self.optimizer = task.configure_optimizers()["optimizer"]
        self.parameters = [p for p in task.parameters() if p.requires_grad]

    def __call__(self, batch: torch.Tensor) -> float:
        with emulated_products(self.precision):  # as training runs (experiments.training.trainer)
            with self.plugin.forward_context():
                loss, _ = self.task._loss(batch)
            self.optimizer.zero_grad()
            loss.backward()
            if self.task.optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.parameters, self.task.optim.grad_clip)
            self.optimizer.step()
        return float(loss.detach())


def alternate(
    calls: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds of each call over ``rounds`` rounds, alternating which goes first
    (each call runs ``warmup`` times untimed before): [`odelm.timing`][odelm.timing]'s medians."""
    return medians(alternating(calls, rounds, warmup=warmup))


PEAK_SHAPE = (700, 200, 10_000)
"""``[M, K] @ [K, N]``: a 20 x 35 batch of width 200 through a 10k-word output layer."""

_PEAKS: dict[tuple[torch.dtype, int], float] = {}
_CPU_PEAKS: dict[torch.dtype, float] = {}
_CUDA_PEAKS: dict[tuple[torch.dtype, str, bool], float] = {}

CUDA_PEAK_SIZE = 8192
"""``n`` of the ``n x n @ n x n`` product that measures a CUDA device's peak."""


def _peak_dtype(precision: str) -> torch.dtype:
    """The matrix-product dtype of a run's precision: bf16 for ``bf16-*``, else fp32."""
    return torch.bfloat16 if precision.startswith("bf16") else torch.float32


def _products(dtype: torch.dtype) -> AbstractContextManager[None]:
    """The context the products of a run in ``dtype`` run in: on a CPU without native bf16
    products, bf16 ones are emulated (``odelm.mixed_precision.emulated_products``), and so is
    the peak they are measured against."""
    return emulated_products("bf16-mixed" if dtype == torch.bfloat16 else "32-true")


def _peak_operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    m, k, n = PEAK_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(dtype)
    return a, torch.randn(k, n, generator=generator).to(dtype)


def matmul_gflops(dtype: torch.dtype, repeats: int = 10) -> float:
    """GFLOP/s of ``torch.matmul`` at ``PEAK_SHAPE`` in ``dtype`` at the current thread
    count (median of ``repeats``)."""
    a, b = _peak_operands(dtype)
    with _products(dtype):
        seconds = alternate({"matmul": lambda: torch.matmul(a, b)}, repeats, warmup=2)["matmul"]
    return 2 * math.prod(PEAK_SHAPE) / seconds / 1e9


def peak_gflops(precision: str = "32-true", threads: int | None = None) -> float:
    """This machine's matrix-product peak (GFLOP/s) at a run's precision (bf16 for
    ``bf16-mixed``/``bf16-true``, else fp32) and thread count, measured once per process."""
    dtype = _peak_dtype(precision)
    threads = threads or torch.get_num_threads()
    if (dtype, threads) not in _PEAKS:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            _PEAKS[dtype, threads] = matmul_gflops(dtype)
        finally:
            torch.set_num_threads(before)
    return _PEAKS[dtype, threads]


def peak_gflops_per_cpu_second(precision: str = "32-true", repeats: int = 10) -> float:
    """The matrix-product peak per second of CPU time (one thread, ``PEAK_SHAPE``, the
    fastest of ``repeats``), measured once per process.

    CPU time, unlike wall time, does not count the time other processes hold the core, so
    the figure is the same on a loaded machine as on an idle one, and a utilisation
    computed against it from the training's own CPU time is too (a wall-clock peak
    measured at a busy moment made utilisations of over 100%).
    """
    dtype = _peak_dtype(precision)
    if dtype not in _CPU_PEAKS:
        a, b = _peak_operands(dtype)
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with _products(dtype):
                for _ in range(2):
                    torch.matmul(a, b)
                fastest = math.inf
                for _ in range(repeats):
                    started = time.thread_time()
                    torch.matmul(a, b)
                    fastest = min(fastest, time.thread_time() - started)
        finally:
            torch.set_num_threads(before)
        _CPU_PEAKS[dtype] = 2 * math.prod(PEAK_SHAPE) / max(fastest, 1e-9) / 1e9
    return _CPU_PEAKS[dtype]


def cuda_matmul_gflops(
    dtype: torch.dtype,
    device: torch.device | str = "cuda",
    n: int = CUDA_PEAK_SIZE,
    repeats: int = 10,
) -> float:
    """GFLOP/s of ``torch.matmul`` of ``n x n @ n x n`` in ``dtype`` on a CUDA device, at
    the current TF32 setting: each product timed with CUDA events after a synchronised
    warm-up (kernels run asynchronously, so host clocks would time the launch), the fastest
    of ``repeats``."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.matmul(a, b)
    torch.cuda.synchronize(device)
    fastest = math.inf
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        fastest = min(fastest, start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * n**3 / max(fastest, 1e-9) / 1e9


def cuda_peak_gflops(precision: str = "32-true", device: torch.device | str = "cuda") -> float:
    """A CUDA device's matrix-product peak (GFLOP/s, ``cuda_matmul_gflops``) at a run's
    precision (bf16 for ``bf16-*``, else fp32 at the current TF32 setting), measured once
    per process and device."""
    dtype = _peak_dtype(precision)
    key = (dtype, str(torch.device(device)), torch.backends.cuda.matmul.allow_tf32)
    if key not in _CUDA_PEAKS:
        _CUDA_PEAKS[key] = cuda_matmul_gflops(dtype, device)
    return _CUDA_PEAKS[key]


def training_peak_gflops(precision: str, device: torch.device) -> float | None:
    """The peak a training run's model FLOPs utilisation divides by, chosen by device
    type: per CPU-second on the CPU (``peak_gflops_per_cpu_second``), per second on a CUDA
    device (``cuda_peak_gflops``); None elsewhere."""
    if device.type == "cpu":
        return peak_gflops_per_cpu_second(precision)
    if device.type == "cuda":
        return cuda_peak_gflops(precision, device)
    return None
