"""What the library runs on a GPU at GPT-2-small size, checked without one.

- The GPU branch of attention: on (fake) CUDA tensors, bf16 included, self-attention calls
  ``F.scaled_dot_product_attention`` with ``is_causal`` and no mask (FlashAttention's
  path); CPU bf16 keeps the library's own mixed-precision attention.
- ``trainer.compile`` off the CPU: the forward and the loss compile as one graph
  (``CompiledModel.loss``), which ``torch.compile(fullgraph=True)`` takes whole for an RK4
  block and the node-transformer's shared field (no graph break; checked on the CPU in
  fp32, the branches a GPU takes), and ``LMTask`` routes an unmasked CUDA batch there.
- Adam and AdamW take the fused kernel over CUDA parameters, as nanoGPT's AdamW does.
- The GPU check's GPT-2-small phase: the batch that fills the memory, halving on running
  out of it (bounded), and the whole phase in the short CPU mode.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode

from benchmarks import gpu_gpt2
from benchmarks.gpu_check import target_records
from benchmarks.gpu_models import SHORT
from benchmarks.gpu_phases import Context
from experiments.models.build import build_model
from experiments.training import task as task_module
from experiments.training.compiled import CompiledModel, compiled_loss_applies
from experiments.training.config import OptimConfig
from experiments.training.optimizers import build_optimizer
from experiments.training.task import LMTask
from ode_transformer.layers import MultiHeadSelfAttention
from tests.support.fake_cuda import fake_cuda

TINY = {"d_model": 16, "n_heads": 2, "d_ff": 32, "max_positions": 32}
SPECS = {
    "rk4": {"family": "ode_transformer", **TINY, "n_layers": 2, "block": "rk4"},
    "node-shared": {"family": "neuralode_lm", "name": "node-transformer", **TINY,
                    "solver": {"method": "euler"}, "steps": 3},
}  # fmt: skip


def _sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    original = F.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> torch.Tensor:
        calls.append({"device": q.device.type, "dtype": q.dtype, **options})
        return original(q, k, v, **options)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_on_cuda_goes_through_sdpa_is_causal(monkeypatch, dtype) -> None:
    calls = _sdpa_calls(monkeypatch)
    attention = MultiHeadSelfAttention(16, 2).to(dtype).train()
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=False), fake_cuda():
        weight = torch.empty(48, 16, dtype=dtype, device="cuda")
        bias = torch.empty(48, dtype=dtype, device="cuda")
        out_weight = torch.empty(16, 16, dtype=dtype, device="cuda")
        out_bias = torch.empty(16, dtype=dtype, device="cuda")
        attention.qkv.weight = torch.nn.Parameter(weight, requires_grad=False)
        attention.qkv.bias = torch.nn.Parameter(bias, requires_grad=False)
        attention.out.weight = torch.nn.Parameter(out_weight, requires_grad=False)
        attention.out.bias = torch.nn.Parameter(out_bias, requires_grad=False)
        y = attention(torch.empty(2, 8, 16, dtype=dtype, device="cuda"))
    assert y.device.type == "cuda" and y.shape == (2, 8, 16)
    assert calls == [{"device": "cuda", "dtype": dtype, "attn_mask": None, "dropout_p": 0.0,
                      "is_causal": True}]  # fmt: skip


def test_cpu_bf16_attention_keeps_its_own_path(monkeypatch) -> None:
    calls = _sdpa_calls(monkeypatch)
    attention = MultiHeadSelfAttention(16, 2).to(torch.bfloat16)
    attention(torch.randn(2, 8, 16, dtype=torch.bfloat16))
    assert calls == []


def test_the_compiled_loss_is_chosen_off_the_cpu_for_unmasked_batches() -> None:
    tokens = torch.zeros(2, 5, dtype=torch.long)
    assert not compiled_loss_applies(tokens, None)
    with FakeTensorMode():
        cuda_tokens = torch.zeros(2, 5, dtype=torch.long, device="cuda")
        assert compiled_loss_applies(cuda_tokens, None)
        assert not compiled_loss_applies(cuda_tokens, torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.slow  # torch.compile, a second or more: the full suite runs it
@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_forward_and_loss_compile_as_one_graph(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(SPECS[name], 40).train()
    compiled = CompiledModel(model, backend="eager")
    tokens = torch.randint(0, 40, (2, 9))
    whole = torch.compile(compiled.forward_loss, fullgraph=True, backend="eager", dynamic=False)
    torch.manual_seed(1)
    loss, aux = whole(tokens)
    torch.manual_seed(1)
    eager, _ = compiled.forward_loss(tokens)
    assert math.isfinite(float(loss)) and float(loss) == pytest.approx(float(eager), rel=1e-6)
    assert aux["nfe"] == (8 if name == "rk4" else 3)


@pytest.mark.slow  # torch.compile, a second or more: the full suite runs it
def test_lmtask_sends_a_gpu_batch_through_the_compiled_loss(monkeypatch) -> None:
    torch.manual_seed(0)
    task = LMTask(build_model(SPECS["rk4"], 40), OptimConfig(), compile=True).train()
    task.compiled = CompiledModel(task.model, backend="eager")
    seen: list[torch.Tensor] = []
    original = CompiledModel.loss

    def spy(self: CompiledModel, tokens: torch.Tensor, label_smoothing: float = 0.0) -> Any:
        seen.append(tokens)
        return original(self, tokens, label_smoothing)

    monkeypatch.setattr(CompiledModel, "loss", spy)
    tokens = torch.randint(0, 40, (2, 9))
    torch.manual_seed(1)
    eager_loss = task._loss(tokens)[0]  # the CPU: forward compiled, loss eager
    assert seen == []
    monkeypatch.setattr(task_module, "compiled_loss_applies", lambda tokens, mask: True)
    torch.manual_seed(1)
    loss, aux = task._loss(tokens)
    assert len(seen) == 1 and float(loss) == pytest.approx(float(eager_loss), rel=1e-6)
    assert aux["nfe"] == 8


def test_the_batch_fills_the_memory_and_halves_when_it_runs_out(monkeypatch) -> None:
    gib = 2**30
    # 80 GiB free, 2 GiB of weights and state, 1 GiB a sequence: 0.8 * 80 - 2 = 62 -> 32
    assert gpu_gpt2.fill_batch(80 * gib, 2 * gib, gib) == 32
    assert gpu_gpt2.fill_batch(80 * gib, 2 * gib, gib / 64) == gpu_gpt2.MAX_BATCH
    assert gpu_gpt2.fill_batch(gib, 2 * gib, gib) == 1
    tried: list[int] = []

    def runs_out_above_4(ctx: Any, sizes: Any, name: str, batch: int) -> dict[str, Any]:
        tried.append(batch)
        if batch > 4:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return {"batch": batch}

    monkeypatch.setattr(gpu_gpt2, "_measure", runs_out_above_4)
    ctx = Context(torch.device("cpu"), SHORT, True, Path("."), Path("."))
    assert gpu_gpt2.measure(ctx, gpu_gpt2.GPT2_SHORT, "rk4", 32) == {"batch": 4}
    assert tried == [32, 16, 8, 4]
    tried.clear()
    with pytest.raises(torch.OutOfMemoryError):
        gpu_gpt2.measure(ctx, gpu_gpt2.GPT2_SHORT, "rk4", 1024)
    assert tried == [1024, 512, 256, 128, 64]  # HALVINGS: bounded


@pytest.mark.slow  # torch.compile, a second or more: the full suite runs it
def test_the_gpt2_phase_runs_every_model_in_the_short_mode(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ctx = Context(torch.device("cpu"), SHORT, True, tmp_path, tmp_path)
    ctx.results["environment"] = {"peak_tflops": {"fp32": 0.05}}
    record: dict[str, Any] = {}
    try:
        gpu_gpt2.gpt2_small(ctx, record)
    finally:
        torch.set_num_threads(threads)
    runs = record["runs"]
    assert list(runs) == list(gpu_gpt2.GPT2_MODELS)
    assert all(run["tokens_per_s"] > 0 and run["mfu"] > 0 for run in runs.values()), runs
    same = {runs[name]["parameters"] for name in ("plain", "residual", "rk2", "rk4")}
    assert len(same) == 1  # the same shape: the same parameters as the plain GPT
    assert runs["node-shared"]["parameters"] < runs["residual"]["parameters"]  # one field
    assert record["ratios"]["rk4/plain"]["peak_memory_mb"] is None  # the CPU: not measured
    targets = {r["metric"]: r for r in target_records({"gpt2_small": record}, short=True)}
    assert targets["gpt2 plain mfu"]["status"] == "not measured (CPU mode)"
    full = {r["metric"]: r for r in target_records({"gpt2_small": record})}
    assert full["gpt2 rk4/plain mfu"]["status"] in ("met", "not met")


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_adam_takes_the_fused_kernel_on_cuda_only(name: str) -> None:
    optim = OptimConfig(optimizer=name)
    cpu = build_optimizer([torch.nn.Parameter(torch.zeros(3))], optim)
    assert not cpu.defaults["fused"]
    with FakeTensorMode():
        weight = torch.nn.Parameter(torch.empty(3, device="cuda"))
        assert build_optimizer([weight], optim).defaults["fused"] is True
