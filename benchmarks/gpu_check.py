"""The GPU check (``odelm bench gpu --out DIR``, ``python -m benchmarks.gpu_check --out
DIR``): what the library does on a CUDA device, in twelve phases of at most 8 minutes in
all on one H100 or H200.

1. ``environment``: versions, the device, its memory; measured matmul peaks (bf16, fp32
   with TF32 off and on).
2. ``families``: every model family one training step in fp32 and bf16 and generation on
   the device; a tiny run trained on the CPU and loaded onto the device (``load_run``).
3. ``throughput``: tokens/s, peak memory and MFU of ``ode_transformer`` residual, RK2 and
   RK4 at d 512, 8 heads, FFN 2048, 6 layers, 32 x 256 tokens, 32k words, against a plain
   PyTorch GPT of the same size (SDPA ``is_causal``, ``F.cross_entropy``).
4. ``loss_paths``: the loss path the library picks on the device against ``F.cross_entropy``.
5. ``adaptive_solve``: dopri5 against a fixed grid at equal NFE, per field evaluation.
6. ``precision``: bf16 against fp32 over 30 steps from the same seed.
7. ``determinism``: two identical short trainings.
8. ``ddp_train``: ``odelm train`` with ``strategy: ddp`` on one device, in a subprocess.
9. ``adjoint_head``: the adjoint dopri5 head's peak memory at 2, 4 and 8 times the
   integration time and its host syncs per step, torchdiffeq and torchode
   (``benchmarks.gpu_solvers``).
10. ``packing``: runs per hour of a study's runs packed 1, 4, 8, 16 to the device
    (``benchmarks.gpu_packing``).
11. ``compile``: ``torch.compile`` of the residual model.
12. ``gpt2_small``: the residual, RK2, RK4 blocks and the node-transformer's shared field at
    GPT-2 small against a nanoGPT-class GPT, bf16, compiled (``benchmarks.gpu_gpt2``), last:
    the longest phase, cut to what the total leaves.

Each phase runs under its own wall-clock budget (a ``SIGALRM`` timer, and checks between
its items; also cut to what is left of the total), catches its own exceptions (recording
the traceback's last line) and writes ``DIR/NN-name.json`` as it ends, so a killed run
keeps what finished; ``DIR/summary.json`` is rewritten after every phase. Packages that
fail to import are recorded at the start and the phases needing them skipped with the
reason. ``--short`` (``--cpu``) runs every phase on the CPU at tiny sizes in seconds, so
the tests keep the script working; without CUDA and without ``--short`` only the first
phase runs. The summary lists issues 30 and 50's targets with the measured values, each
``met``, ``not met``, ``not measured`` or, in the short mode, ``not measured (CPU mode)``
(also printed, one line each, at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import platform
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADDED_ENV = () if "CUBLAS_WORKSPACE_CONFIG" in os.environ else ("CUBLAS_WORKSPACE_CONFIG",)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # for phase 7, before cuBLAS starts

import torch

from benchmarks import gpu_gpt2, gpu_packing, gpu_phases, gpu_runs, gpu_solvers
from benchmarks.gpu_models import FULL, SHORT, matmul_tflops
from benchmarks.gpu_phases import Context, PhaseTimeout, last_line
from odelm import files

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = ("transformers", "pytorch_lightning", "lightning", "torchdiffeq", "jsonargparse", "yaml")
"""Packages besides torch that phases need; each is imported once at the start."""
BUILD = ("yaml", "jsonargparse")  # experiments.models.build's model schemas
TOTAL_BUDGET_S = 480.0


@dataclass(frozen=True)
class Phase:
    """One phase: its function, its budget in seconds, the packages it needs."""

    name: str
    run: Callable[[Context, dict[str, Any]], None]
    budget_s: float
    needs: tuple[str, ...] = ()


def environment(ctx: Context, record: dict[str, Any]) -> None:
    """Versions, the device, its memory, and measured matmul peaks in TFLOP/s."""
    record["torch"], record["python"] = torch.__version__, platform.python_version()
    record["cuda_available"] = torch.cuda.is_available()
    record["cuda"], record["cudnn"] = torch.version.cuda, torch.backends.cudnn.version()
    record["imports_failed"] = ctx.missing
    record["versions"] = {name: _version(name) for name in OPTIONAL if name not in ctx.missing}
    record["cpu_count"] = os.cpu_count()
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        record["device_name"], record["capability"] = props.name, f"{props.major}.{props.minor}"
        record["memory_gb"] = props.total_memory / 2**30
        record["multiprocessors"] = props.multi_processor_count
    else:
        record["device_name"] = f"CPU ({platform.processor() or platform.machine()})"
        record["gpu_only"] = "device name, memory, TF32: no CUDA device in this mode"
    record["tf32"] = {
        "matmul": torch.backends.cuda.matmul.allow_tf32,
        "cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    peaks = record.setdefault("peak_tflops", {})
    if ctx.device.type == "cpu" and not ctx.short:
        record["summary"] = "no CUDA device: peaks not measured (--short measures the CPU's)"
        return
    n = ctx.sizes.matmul
    record["matmul_shape"] = f"{n} x {n} @ {n} x {n}"
    ctx.check()
    peaks["bf16"] = matmul_tflops(n, torch.bfloat16, ctx.device)
    ctx.check()
    peaks["fp32"] = matmul_tflops(n, torch.float32, ctx.device)
    if ctx.device.type == "cuda":
        ctx.check()
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            peaks["tf32"] = matmul_tflops(n, torch.float32, ctx.device)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    record["summary"] = f"{record['device_name']}, torch {torch.__version__}, peaks " + ", ".join(
        f"{k} {v:.3g}" for k, v in peaks.items()
    )


def _version(name: str) -> str | None:
    return getattr(importlib.import_module(name), "__version__", None)


PHASES = (
    Phase("environment", environment, 25),
    Phase("families", gpu_phases.families, 50, BUILD),
    Phase("throughput", gpu_phases.throughput, 80, BUILD),
    Phase("loss_paths", gpu_runs.loss_paths, 15),
    Phase("adaptive_solve", gpu_runs.adaptive_solve, 20, ("torchdiffeq",)),
    Phase("precision", gpu_runs.precision, 20, BUILD),
    Phase("determinism", gpu_runs.determinism, 20, BUILD),
    Phase("ddp_train", gpu_runs.ddp_train, 70, ("pytorch_lightning", *BUILD)),
    Phase("adjoint_head", gpu_solvers.adjoint_head, 30),
    Phase("packing", gpu_packing.packing_phase, 110, BUILD),
    Phase("compile", gpu_runs.compiled, 60, BUILD),
    Phase("gpt2_small", gpu_gpt2.gpt2_small, 270, BUILD),  # cut to what the total leaves
)


def failed_imports() -> dict[str, str]:
    """Each optional package that fails to import, with the error's last line."""
    missing = {}
    for name in OPTIONAL:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - a broken install is as good as absent
            missing[name] = last_line(error)
    return missing


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise ``PhaseTimeout`` in the main thread after ``seconds`` (a no-op off it)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise PhaseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_phase(index: int, phase: Phase, ctx: Context, start: float, total_s: float) -> dict:
    """Run one phase under its guard; write and print its record."""
    record: dict[str, Any] = {"phase": phase.name, "status": "ok", "device": str(ctx.device)}
    record["mode"] = "short" if ctx.short else "full"
    budget = min(phase.budget_s, start + total_s - time.monotonic())
    record["budget_s"] = round(budget, 1)
    lacking = ctx.lacks(*phase.needs)
    started = time.monotonic()
    if budget < 1:
        record["status"], record["reason"] = "timed out", "the total budget was spent"
    elif lacking:
        record["status"] = "skipped"
        record["reason"] = f"needs {', '.join(lacking)}, which failed to import"
    elif index > 1 and not ctx.short and ctx.device.type != "cuda":
        record["status"] = "skipped"
        record["reason"] = "no CUDA device; --short runs every phase on the CPU"
    else:
        ctx.deadline, threads = started + budget, torch.get_num_threads()
        try:
            with alarm(budget):
                phase.run(ctx, record)
        except PhaseTimeout:
            record["status"] = "timed out"
            record["reason"] = f"past its budget of {budget:.0f} s; the rest was skipped"
        except Exception as error:  # noqa: BLE001 - recorded; the next phase runs
            record["status"], record["error"] = "error", last_line(error)
        finally:
            ctx.deadline = math.inf
            torch.set_num_threads(threads)  # a run trained in a phase sets its own
    record["seconds"] = round(time.monotonic() - started, 2)
    ctx.results[phase.name] = record
    files.make_dir(ctx.out, root=ctx.out)  # the folder named; no write leaves it
    write_json(ctx.out / f"{index:02d}-{phase.name}.json", record)
    write_json(ctx.out / "summary.json", summary(ctx))
    detail = record.get("summary") or record.get("reason") or record.get("error") or ""
    print(f"[{index}/{len(PHASES)}] {phase.name}: {record['status']} in {record['seconds']:.1f} s"
          + (f"; {detail}" if detail else ""), flush=True)  # fmt: skip
    return record


def write_json(path: Path, values: dict[str, Any]) -> None:
    """``values`` as JSON (non-finite floats as null, unknown objects as text)."""
    files.write_text(path, json.dumps(_finite(values), indent=2, default=str) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def summary(ctx: Context) -> dict[str, Any]:
    """Each phase's status and seconds, and the issue's targets with the measured values."""
    return {
        "device": str(ctx.device),
        "mode": "short" if ctx.short else "full",
        "phases": {
            name: {"status": r["status"], "seconds": r["seconds"]}
            for name, r in ctx.results.items()
        },
        "targets": target_records(ctx.results, ctx.short),
    }


def _get(results: dict[str, Any], *path: str) -> Any:
    for key in path:
        results = results.get(key) if isinstance(results, dict) else None  # type: ignore[assignment]
    return results


def target_records(results: dict[str, Any], short: bool = False) -> list[dict[str, Any]]:
    """``odelm bench`` records of issues 30 and 50's targets (value None where not measured;
    no target in the short mode, whose tiny CPU sizes say nothing about a GPU), each with its
    ``status``: met, not met, not measured, or not measured (CPU mode)."""
    ratios, gpt2 = ("throughput", "ratios"), ("gpt2_small", "ratios")
    rows = [
        ("residual/plain tokens_per_s bf16", (*ratios, "residual/plain bf16", "tokens_per_s"), 0.8, "higher"),
        ("residual/plain tokens_per_s fp32", (*ratios, "residual/plain fp32", "tokens_per_s"), 0.8, "higher"),
        ("residual/plain peak_memory bf16", (*ratios, "residual/plain bf16", "peak_memory_mb"), 1.2, "lower"),
        ("residual bf16/fp32 tokens_per_s", (*ratios, "residual bf16/fp32", "tokens_per_s"), 2.0, "higher"),
        ("residual/plain mfu bf16", (*ratios, "residual/plain bf16", "mfu"), 0.8, "higher"),
        ("loss path / F.cross_entropy time", ("loss_paths", "library_over_cross_entropy"), 1.2, "lower"),
        ("dopri5/grid time per NFE", ("adaptive_solve", "forward", "dopri5_over_grid_per_nfe"), 1.5, "lower"),
        ("gpt2 plain mfu", ("gpt2_small", "runs", "plain", "mfu"), 0.35, "higher"),
        ("gpt2 residual/plain tokens_per_s", (*gpt2, "residual/plain", "tokens_per_s"), 0.9, "higher"),
        ("gpt2 residual/plain peak_memory", (*gpt2, "residual/plain", "peak_memory_mb"), 1.1, "lower"),
        ("gpt2 rk2/plain mfu", (*gpt2, "rk2/plain", "mfu"), 0.85, "higher"),
        ("gpt2 rk4/plain mfu", (*gpt2, "rk4/plain", "mfu"), 0.85, "higher"),
        ("adjoint peak memory max/min S 2-8 torchdiffeq", ("adjoint_head", "torchdiffeq", "memory_ratio"), 1.2, "lower"),
        ("adjoint peak memory max/min S 2-8 torchode", ("adjoint_head", "torchode", "memory_ratio"), 1.2, "lower"),
        ("packing runs/hour N=16 over N=1", ("packing", "speedup"), 6.0, "higher"),
    ]  # fmt: skip
    records = []
    for metric, path, target, better in rows:
        value = _get(results, *path)
        value = value if isinstance(value, (int, float)) else None
        met = None if value is None else value >= target if better == "higher" else value <= target
        status = {True: "met", False: "not met", None: "not measured"}[met]
        records.append(
            {
                "bench": "gpu",
                "metric": metric,
                "value": value,
                "target": None if short else target,
                "unit": "x",
                "better": better,
                "status": "not measured (CPU mode)" if short else status,
            }
        )
    return records


def run_check(
    out: str | Path = "gpu-check",
    short: bool = False,
    phases: list[str] | None = None,
    total_s: float = TOTAL_BUDGET_S,
) -> dict[str, dict[str, Any]]:
    """Run the phases (``phases``: their names, default all) into ``out``; their records."""
    start = time.monotonic()
    cuda = torch.cuda.is_available() and not short
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    ctx = Context(device, SHORT if short else FULL, short, Path(out), REPO, failed_imports())
    ctx.added_env = ADDED_ENV
    unknown = sorted(set(phases or ()) - {phase.name for phase in PHASES})
    if unknown:
        raise SystemExit(f"unknown phases {unknown}; valid: {[p.name for p in PHASES]}")
    try:
        for index, phase in enumerate(PHASES, 1):
            if phases and phase.name not in phases and phase.name != "environment":
                continue
            run_phase(index, phase, ctx, start, total_s)
    finally:
        gc.unfreeze()  # what the phases froze (benchmarks.gpu_models.free) is collectable again
    for target in target_records(ctx.results, short):
        print(f"target {target['metric']}: {target['status']} ({_number(target['value'])})")
    return ctx.results


def _number(value: float | None) -> str:
    return "no value" if value is None else f"{value:.3g}"


def gpu(out: str | None = None, short: bool = False) -> list[dict[str, Any]]:
    """``odelm bench gpu``: the check into ``out`` (default ``gpu-check``); the targets."""
    return target_records(run_check(out or "gpu-check", short=short), short)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.gpu_check``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check", help="folder of the JSON records")
    parser.add_argument("--short", "--cpu", action="store_true", help="CPU, tiny sizes")
    parser.add_argument("--phases", help="comma-separated phase names (environment always runs)")
    parser.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S, help="total seconds")
    args = parser.parse_args(argv)
    phases = args.phases.split(",") if args.phases else None
    run_check(args.out, args.short, phases, args.budget_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
