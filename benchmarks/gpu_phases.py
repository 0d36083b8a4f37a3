"""The GPU check's model phases (``benchmarks.gpu_check``): every family one step and
generation, and throughput against a plain PyTorch GPT; the phases' shared pieces.

Each phase is ``phase(ctx, record)``: it fills ``record`` as it goes (so a phase cut short
by its time guard keeps what it measured) and calls ``ctx.check()`` between its items.
One item failing is recorded (``attempt``) and the phase goes on.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import itertools
import logging
import math
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_models import (
    FAMILY_NEEDS,
    PlainGPT,
    Sizes,
    Stepper,
    build,
    family_specs,
    free,
    ode_transformer_spec,
    peak_memory_mb,
    random_batches,
    ratio,
    seconds_per_call,
    step_flops,
    sync,
    synthetic_batches,
)


class PhaseTimeout(BaseException):
    """A phase ran past its time budget (a BaseException: item handlers let it through)."""


@dataclass
class Context:
    """What every phase reads: the device, the sizes, the mode, the packages that failed to
    import, earlier phases' results, and the guard of the running phase."""

    device: torch.device
    sizes: Sizes
    short: bool
    out: Path
    repo: Path
    missing: dict[str, str] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    deadline: float = math.inf
    added_env: tuple[str, ...] = ()
    """Environment variables the check set for itself (a subprocess gets them unset)."""

    def check(self) -> None:
        """Raise ``PhaseTimeout`` once the running phase's budget is spent."""
        if time.monotonic() > self.deadline:
            raise PhaseTimeout

    def lacks(self, *modules: str) -> list[str]:
        """Those of ``modules`` that failed to import."""
        return [module for module in modules if module in self.missing]


def last_line(error: BaseException) -> str:
    """The last line of ``error``'s traceback (``Type: message``)."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


def attempt(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``call()``'s record, or ``{"error": ...}`` with the last line of its traceback."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - one item failing must not stop the phase
        return {"error": last_line(error)}


# ---------------------------------------------------------------------- 2. every family


def _one_step(spec: dict[str, Any], ctx: Context, bf16: bool, batch: torch.Tensor) -> Any:
    """One training step of a fresh model of ``spec``: its record and the model."""
    torch.manual_seed(0)
    model = build(spec, ctx.sizes.small_vocab).to(ctx.device)
    started = time.perf_counter()
    loss = float(Stepper(model, bf16)(batch))
    sync(ctx.device)
    entry: dict[str, Any] = {"loss": loss, "finite": math.isfinite(loss)}
    entry["seconds"] = time.perf_counter() - started
    entry["parameters_on"] = str(next(model.parameters()).device)
    return entry, model


def _generate(model: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    """Greedy and sampled continuations of a 4-token prompt on ``device``."""
    from odelm.decoding import generate

    prompt = torch.tensor([[1, 2, 3, 4]], device=device)
    greedy = generate(model, prompt, 6)
    generator = torch.Generator(device=device).manual_seed(0)
    sampled = generate(model, prompt, 6, strategy="sample", generator=generator)
    return {"greedy": greedy[0].tolist(), "sampled": sampled[0].tolist(), "on": str(greedy.device)}


def families(ctx: Context, record: dict[str, Any]) -> None:
    """Every family one step in fp32 and bf16 (autocast) on the device, then generation;
    then a tiny run trained on the CPU, loaded onto the device with ``load_run``."""
    batch = synthetic_batches(1, 4, 16, ctx.sizes.small_vocab, ctx.device)[0]
    table = record.setdefault("families", {})
    for name, spec in family_specs(ctx.sizes.small_vocab).items():
        ctx.check()
        entry = table.setdefault(name, {})
        lacking = ctx.lacks(*FAMILY_NEEDS.get(name, ()))
        if lacking:
            entry["skipped"] = f"needs {', '.join(lacking)}, which failed to import"
            continue
        for precision in ("fp32", "bf16"):
            try:
                entry[precision], model = _one_step(spec, ctx, precision == "bf16", batch)
            except Exception as error:  # noqa: BLE001 - recorded; the next item runs
                entry[precision] = {"error": last_line(error)}
                continue
            if precision == "fp32":
                entry["generate"] = attempt(partial(_generate, model, ctx.device))
    ctx.check()
    lacking = ctx.lacks("pytorch_lightning", "yaml", "jsonargparse")
    if lacking:
        record["load_run"] = {"skipped": f"needs {', '.join(lacking)} to train a run"}
    else:
        record["load_run"] = attempt(lambda: _load_run(ctx))
    steps = [v[p] for v in table.values() for p in ("fp32", "bf16") if p in v]
    ok = sum(bool(s.get("finite")) for s in steps)
    record["summary"] = f"{ok}/{len(steps)} steps finite; load_run {_status(record['load_run'])}"


def _status(entry: dict[str, Any]) -> str:
    return "skipped" if "skipped" in entry else "error" if "error" in entry else "ok"


def tiny_run_config(out_dir: str, threads: int, name: str = "tiny") -> dict[str, Any]:
    """A run config of a one-layer ODE Transformer on the grammar corpus, 4 CPU steps."""
    return {
        "name": name,
        "out_dir": out_dir,
        "seed": 3,
        "model": family_specs(100)["ode_transformer rk2"] | {"n_layers": 1},
        "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 64},
        "trainer": {
            "max_steps": 4,
            "val_every": 4,
            "checkpoint_every": 4,
            "val_batches": 1,
            "progress_bar": False,
            "logger": [],
            "accelerator": "cpu",
            "num_threads": threads,
        },
        "eval": {"bleu_sentences": 5, "continuation_sentences": 2},
    }


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Lightning's lines and warnings hidden, stdout swallowed, inside the block."""
    names = ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _load_run(ctx: Context) -> dict[str, Any]:
    """Train a tiny run on the CPU, load it onto the device, generate from it."""
    from experiments.evaluation.trained import load_run
    from experiments.training.config import parse_config
    from experiments.training.train import train

    entry: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        with quiet():
            train(parse_config(tiny_run_config(folder, 1 if ctx.short else 2)))
        entry["train_seconds"] = time.perf_counter() - started
        run_dir = Path(folder) / "tiny"
        run = load_run(run_dir, map_location=str(ctx.device))
        entry["parameters_on"] = str(next(run.model.parameters()).device)
        word = run.decode([5]).split()[0]
        for strategy in ("greedy", "sample"):
            call = lambda s=strategy: {"text": run.generate(word, 4, strategy=s)}
            entry[f"generate_{strategy}"] = attempt(call)
        if "device" in inspect.signature(load_run).parameters:
            other = load_run(run_dir, device=str(ctx.device))  # type: ignore[call-arg]
            entry["device_keyword"] = attempt(lambda: {"text": other.generate(word, 4)})
        else:
            entry["device_keyword"] = {"skipped": "load_run takes no device keyword"}
    return entry


# ------------------------------------------------------------------------ 3. throughput

THROUGHPUT = [
    ("plain", False),
    ("residual", False),
    ("plain", True),
    ("residual", True),
    ("rk2", False),
    ("rk2", True),
    ("rk4", False),
    ("rk4", True),
]
"""(model, bf16) in the order measured: the targets' pairs first."""


def _throughput(ctx: Context, name: str, bf16: bool) -> dict[str, Any]:
    """Tokens/s, peak memory and MFU of one model at the throughput size."""
    sizes, device = ctx.sizes, ctx.device
    free(device)
    torch.manual_seed(0)
    if name == "plain":
        model: torch.nn.Module = PlainGPT(sizes)
    else:
        model = build(ode_transformer_spec(sizes, name), sizes.vocab)
    step = Stepper(model.to(device), bf16, lr=1e-4)
    data = itertools.cycle(random_batches(4, sizes.batch, sizes.seq, sizes.vocab, device))
    flops = step_flops(lambda: step(next(data)))
    seconds = seconds_per_call(lambda: step(next(data)), device, sizes.warmup, sizes.timed)
    peaks = ctx.results.get("environment", {}).get("peak_tflops", {})
    peak = peaks.get("bf16" if bf16 else "fp32")
    tokens = sizes.batch * sizes.seq
    entry = {
        "tokens_per_s": tokens / seconds,
        "step_ms": seconds * 1e3,
        "peak_memory_mb": peak_memory_mb(device),
        "step_tflop": flops / 1e12,
        "mfu": flops / seconds / (peak * 1e12) if peak else None,
        "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
    }
    return entry


def throughput(ctx: Context, record: dict[str, Any]) -> None:
    """The throughput size's tokens/s, memory and MFU, the library against a plain GPT."""
    sizes = ctx.sizes
    record["size"] = {k: getattr(sizes, k) for k in ("d_model", "n_heads", "d_ff", "n_layers")}
    record["size"] |= {"batch": sizes.batch, "seq": sizes.seq, "vocab": sizes.vocab}
    record["timing"] = f"{sizes.warmup} warm-up steps, then the mean of {sizes.timed}"
    record["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    if ctx.device.type != "cuda":
        record["peak_memory"] = "not measured on the CPU (torch.cuda.max_memory_allocated)"
    runs = record.setdefault("runs", {})
    for name, bf16 in THROUGHPUT:
        ctx.check()
        key = f"{name} {'bf16' if bf16 else 'fp32'}"
        runs[key] = attempt(partial(_throughput, ctx, name, bf16))
        record["ratios"] = throughput_ratios(runs)
    free(ctx.device)
    residual = record["ratios"].get("residual/plain bf16", {})
    record["summary"] = (
        f"residual/plain bf16: tokens/s {fmt(residual.get('tokens_per_s'))}, memory "
        f"{fmt(residual.get('peak_memory_mb'))}, MFU {fmt(residual.get('mfu'))}"
    )


def throughput_ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each ODE model over the plain GPT per precision, and bf16 over fp32 per model."""
    ratios: dict[str, dict[str, Any]] = {}
    for name in ("residual", "rk2", "rk4"):
        for precision in ("fp32", "bf16"):
            mine, plain = runs.get(f"{name} {precision}", {}), runs.get(f"plain {precision}", {})
            ratios[f"{name}/plain {precision}"] = {
                key: ratio(mine.get(key), plain.get(key))
                for key in ("tokens_per_s", "peak_memory_mb", "mfu")
            }
    for name in ("plain", "residual", "rk2", "rk4"):
        fast, slow = runs.get(f"{name} bf16", {}), runs.get(f"{name} fp32", {})
        ratios[f"{name} bf16/fp32"] = {
            "tokens_per_s": ratio(fast.get("tokens_per_s"), slow.get("tokens_per_s"))
        }
    return ratios


def fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "n/a"
