"""The GPU check's later phases (``benchmarks.gpu_check``): the loss paths, the
adaptive solve against a fixed grid, bf16 against fp32 over 30 steps, determinism,
``odelm train`` with ``strategy: ddp`` in a subprocess, and ``torch.compile`` (last: the
phase most likely to run long). Phases are written as in ``benchmarks.gpu_phases``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_models import (
    Stepper,
    build,
    family_specs,
    ode_transformer_spec,
    random_batches,
    ratio,
    seconds_per_call,
    sync,
    synthetic_batches,
)
from benchmarks.gpu_phases import Context, attempt, fmt

# ------------------------------------------------------------------------ 4. loss paths


def loss_paths(ctx: Context, record: dict[str, Any]) -> None:
    """Forward + backward time of the loss path the library picks for bf16 logits on the
    device, against ``F.cross_entropy`` (fp32, as autocast runs it) and the CPU's paths."""
    from experiments.training.losses import (
        chunked_cross_entropy,
        linear_cross_entropy,
        loss_path,
        training_nll,
    )

    sizes, device = ctx.sizes, ctx.device
    b, s, v, d = sizes.batch, sizes.seq, sizes.vocab, sizes.d_model
    torch.manual_seed(0)
    logits = torch.randn(b, s, v, device=device).bfloat16().requires_grad_(True)
    tokens = torch.randint(0, v, (b, s), device=device)
    targets = torch.cat([tokens[:, 1:], tokens.new_full((b, 1), -100)], 1).reshape(-1)
    hidden = torch.randn(b * s, d, device=device).bfloat16().requires_grad_(True)
    weight = (torch.randn(v, d, device=device) / math.sqrt(d)).bfloat16().requires_grad_(True)
    scored = targets.clamp(min=0)
    flat = logits.view(-1, v)
    calls = {
        "library": lambda: training_nll(logits, tokens, None, 0.0),
        "cross_entropy_fp32": lambda: F.cross_entropy(flat.float(), targets, ignore_index=-100),
        "cross_entropy_bf16": lambda: F.cross_entropy(flat, targets, ignore_index=-100),
        "cpu_chunked": lambda: chunked_cross_entropy(flat, targets),
        "linear_then_cross_entropy": lambda: F.cross_entropy(
            F.linear(hidden, weight).float(), scored
        ),
        "cpu_fused_linear": lambda: linear_cross_entropy(hidden, weight, None, scored),
    }
    record["rows"], record["vocab"] = b * s, v
    record["library_path"] = loss_path(device.type, torch.bfloat16)
    times = record.setdefault("ms", {})
    for name, call in calls.items():
        ctx.check()

        def step(call: Callable[[], torch.Tensor] = call) -> None:
            for tensor in (logits, hidden, weight):
                tensor.grad = None
            call().backward()

        result = attempt(lambda: {"ms": 1e3 * seconds_per_call(step, device, 2, sizes.timed)})
        times[name] = result.get("ms", result)
    record["library_over_cross_entropy"] = ratio(times.get("library"), times["cross_entropy_fp32"])
    record["summary"] = (
        f"path {record['library_path']}: {fmt(times.get('library'))} ms against "
        f"F.cross_entropy {fmt(times.get('cross_entropy_fp32'))} ms"
    )


# ---------------------------------------------------------------------- 5. adaptive solve


def adaptive_solve(ctx: Context, record: dict[str, Any]) -> None:
    """dopri5 (the facade's default tolerances) against Euler on a grid of the same number
    of field evaluations: seconds per evaluation, forward only and forward + backward."""
    from neuralode_lm import MLPField, solve

    sizes, device = ctx.sizes, ctx.device
    torch.manual_seed(0)
    field_ = MLPField(sizes.d_model, sizes.d_ff).to(device)
    y0 = torch.randn(sizes.solver_rows, sizes.d_model, device=device)
    t = torch.tensor([0.0, 1.0], device=device)
    with torch.no_grad():
        _, stats = solve(field_, y0, t, method="dopri5")
    nfe = stats.nfe_forward
    options: dict[str, dict[str, Any]] = {
        "dopri5": {"method": "dopri5"},
        "grid": {"method": "euler", "step_size": 1 / nfe},
    }
    record["field"] = f"MLPField({sizes.d_model}, {sizes.d_ff}) on {sizes.solver_rows} states"
    record["nfe"] = {"dopri5": nfe, "steps": stats.accepted_steps}
    for mode in ("forward", "forward_backward"):
        entry, grad = record.setdefault(mode, {}), mode != "forward"
        for name, option in options.items():
            ctx.check()
            counted: list[int] = []

            def call(
                option: dict[str, Any] = option, counted: list[int] = counted, grad: bool = grad
            ) -> None:
                field_.zero_grad(set_to_none=True)
                with torch.set_grad_enabled(grad):
                    states, stats = solve(field_, y0, t, **option)
                    if grad:
                        states[-1].square().mean().backward()
                counted.append(stats.nfe_forward)

            seconds = seconds_per_call(call, device, 1, max(3, sizes.timed // 2))
            entry[name] = {"ms": seconds * 1e3, "nfe": counted[-1], "ms_per_nfe": None}
            entry[name]["ms_per_nfe"] = seconds * 1e3 / counted[-1]
        entry["dopri5_over_grid_per_nfe"] = ratio(
            entry["dopri5"]["ms_per_nfe"], entry["grid"]["ms_per_nfe"]
        )
    record["summary"] = (
        f"NFE {nfe}; dopri5/grid per evaluation: forward "
        f"{fmt(record['forward']['dopri5_over_grid_per_nfe'])}, forward+backward "
        f"{fmt(record['forward_backward']['dopri5_over_grid_per_nfe'])}"
    )


# ------------------------------------------------------------------ 6. bf16 against fp32


def small_spec(ctx: Context) -> dict[str, Any]:
    """The small ``ode_transformer`` of phases 6 and 7: the ``small`` preset (d 128, 2
    layers, RK2), or the short mode's tiny one."""
    if ctx.short:
        return family_specs(ctx.sizes.small_vocab)["ode_transformer rk2"]
    return {"family": "ode_transformer", "preset": "small", "block": "rk2"}


def train_losses(ctx: Context, steps: int, bf16: bool = False, seed: int = 0) -> list[float]:
    """The training losses of ``steps`` AdamW steps of ``small_spec`` from ``seed`` on
    learnable synthetic windows (one host sync, at the end)."""
    sizes = ctx.sizes
    torch.manual_seed(seed)
    model = build(small_spec(ctx), sizes.small_vocab).to(ctx.device)
    step = Stepper(model, bf16)
    data = synthetic_batches(
        steps, sizes.small_batch, sizes.small_seq, sizes.small_vocab, ctx.device, seed
    )
    losses = [step(batch) for batch in data]
    return torch.stack(losses).float().tolist()


def precision(ctx: Context, record: dict[str, Any]) -> None:
    """30 steps in fp32 and under bf16 autocast from the same seed: the final losses."""
    record["model"], record["steps"] = small_spec(ctx), 30
    curves = record.setdefault("losses", {})
    for name in ("fp32", "bf16"):
        ctx.check()
        curves[name] = [round(x, 5) for x in train_losses(ctx, 30, bf16=name == "bf16")]
    fp32, bf16 = curves["fp32"][-1], curves["bf16"][-1]
    record["final"] = {"fp32": fp32, "bf16": bf16, "first": curves["fp32"][0]}
    record["difference"] = bf16 - fp32
    record["relative_difference"] = ratio(abs(bf16 - fp32), abs(fp32))
    record["summary"] = (
        f"final loss fp32 {fp32:.4f}, bf16 {bf16:.4f} (from {curves['fp32'][0]:.3f})"
    )


# ------------------------------------------------------------------------ 7. determinism


def determinism(ctx: Context, record: dict[str, Any]) -> None:
    """Two identical 10-step trainings, with torch's default algorithms and with
    ``torch.use_deterministic_algorithms`` (``CUBLAS_WORKSPACE_CONFIG`` set at start)."""
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    record["cublas_workspace_config"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        for mode in ("default", "deterministic"):
            ctx.check()
            torch.use_deterministic_algorithms(mode == "deterministic", warn_only=True)
            first, second = train_losses(ctx, 10), train_losses(ctx, 10)
            record[mode] = {
                "identical": first == second,
                "max_abs_difference": max(abs(a - b) for a, b in zip(first, second, strict=True)),
                "losses": first,
            }
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
    record["summary"] = ", ".join(
        f"{mode}: {'identical' if record[mode]['identical'] else 'differ'}"
        for mode in ("default", "deterministic")
        if mode in record
    )


# ------------------------------------------------------------------------- 8. odelm train


def ddp_command(ctx: Context, out_dir: str) -> list[str]:
    """``odelm train`` of the example config with ``strategy: ddp`` on one device."""
    command = [sys.executable, "-m", "experiments", "train"]
    command += ["--config", str(ctx.repo / "experiments" / "configs" / "example.yaml")]
    options = {
        "trainer.accelerator": "cpu" if ctx.device.type == "cpu" else "gpu",
        "trainer.devices": "1",
        "trainer.strategy": "ddp",
        "trainer.max_steps": "4" if ctx.short else "20",
        "trainer.val_every": "2" if ctx.short else "10",
        "trainer.checkpoint_every": "2" if ctx.short else "10",
        "trainer.val_batches": "2",
        "trainer.logger": "[csv]",
        "trainer.progress_bar": "false",
        "out_dir": out_dir,
        "name": "ddp",
        "eval.bleu_sentences": "5" if ctx.short else "20",
        "eval.continuation_sentences": "2" if ctx.short else "5",
    }
    if ctx.short:
        options |= {"model.d_model": "32", "model.d_ff": "64", "model.n_heads": "2"}
        options |= {"trainer.num_threads": "1"}
    for key, value in options.items():
        command += [f"--{key}", value]
    return [*command, "--quiet"]


def ddp_train(ctx: Context, record: dict[str, Any]) -> None:
    """``odelm train`` with ``strategy: ddp`` on one device (NCCL on a GPU, gloo on the
    CPU) in a subprocess: its exit status, its output's tail, what the run folder holds."""
    with tempfile.TemporaryDirectory() as folder:
        command = ddp_command(ctx, folder)
        record["command"] = " ".join(command[1:])
        env = {k: v for k, v in os.environ.items() if k not in ctx.added_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ctx.repo), env.get("PYTHONPATH")]))
        timeout = max(5.0, ctx.deadline - time.monotonic() - 3)
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command,
                check=False,
                cwd=ctx.repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            record["rc"], output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as error:
            record["rc"], output = "timed out", _text(error.stdout) + _text(error.stderr)
        record["seconds"] = time.perf_counter() - started
        record["tail"] = output[-2000:]
        run_dir = Path(folder) / "ddp"
        record["result_json_files"] = len(list(Path(folder).rglob("result.json")))
        record["config_yaml_files"] = len(list(Path(folder).rglob("config.yaml")))
        if (run_dir / "result.json").is_file():
            result = json.loads((run_dir / "result.json").read_text())
            keys = ("steps", "test_ppl", "valid_ppl", "train_tokens_per_s", "peak_memory_mb")
            record["result"] = {key: result.get(key) for key in keys}
    record["summary"] = f"rc {record['rc']} in {record['seconds']:.1f} s"
    if "result" in record:
        record["summary"] += f"; test ppl {fmt(record['result'].get('test_ppl'))}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


# ---------------------------------------------------------------------- 9. torch.compile


def compiled(ctx: Context, record: dict[str, Any]) -> None:
    """The residual model at the throughput size through the library's ``trainer.compile``
    (``torch.compile`` of the forward; inductor on a GPU, the eager backend in the short
    mode): the first step (which compiles) and a few steps after, against eager steps."""
    sizes, device = ctx.sizes, ctx.device
    bf16 = device.type == "cuda"
    backend = "eager" if ctx.short else "inductor"
    record["backend"], record["bf16"] = backend, bf16
    torch.manual_seed(0)
    model = build(ode_transformer_spec(sizes, "residual"), sizes.vocab).to(device)
    data = itertools.cycle(random_batches(4, sizes.batch, sizes.seq, sizes.vocab, device))
    eager = Stepper(model, bf16)
    record["eager_ms"] = 1e3 * seconds_per_call(lambda: eager(next(data)), device, 1, 3)
    ctx.check()
    step = Stepper(model, bf16, compile_backend=backend)
    started = time.perf_counter()
    loss = float(step(next(data)))
    sync(device)
    record["compile_s"], record["first_loss"] = time.perf_counter() - started, loss
    ctx.check()
    record["compiled_ms"] = 1e3 * seconds_per_call(lambda: step(next(data)), device, 1, 3)
    record["compiled_over_eager_speed"] = ratio(record["eager_ms"], record["compiled_ms"])
    counters = attempt(lambda: {"graphs": _graph_count()})
    record["graphs"] = counters.get("graphs", counters)
    record["summary"] = (
        f"compile {record['compile_s']:.1f} s; eager {record['eager_ms']:.1f} ms, compiled "
        f"{record['compiled_ms']:.1f} ms a step"
    )


def _graph_count() -> int:
    """Graphs dynamo compiled so far in this process (``torch._dynamo`` counters)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
