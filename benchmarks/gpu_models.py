"""What the GPU check's phases share (``benchmarks.gpu_check``): the sizes of its two
modes, the model families, a plain PyTorch GPT, a training step, synthetic data, timing.

The library's side of every step is the harness's loss (``LMTask._loss``: the loss path
``experiments.training.losses.loss_path`` picks for the device) when Lightning imports,
else ``experiments.training.losses.training_nll`` on the model's logits; the optimizer
is AdamW. Times on CUDA come from CUDA events around a synchronised loop; on the CPU from
``time.perf_counter``.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Sizes:
    """The sizes of one mode: the throughput model, the loss rows, the solver, the steps."""

    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int
    batch: int
    seq: int
    vocab: int
    warmup: int
    timed: int
    matmul: int
    solver_rows: int
    small_vocab: int
    small_batch: int
    small_seq: int


FULL = Sizes(512, 8, 2048, 6, 32, 256, 32000, 3, 10, 8192, 8192, 1000, 16, 64)
"""The GPU size of issue 30: d 512, 8 heads, FFN 2048, 6 layers, 32 x 256 tokens, 32k."""
SHORT = Sizes(32, 2, 64, 2, 4, 16, 100, 1, 2, 256, 64, 100, 4, 16)
"""The CPU short mode: every phase in seconds."""


def family_specs(vocab: int) -> dict[str, dict[str, Any]]:
    """One small ``model`` section per family (``experiments.models.build`` keys)."""
    small = {"family": "ode_transformer", "preset": "small", "d_model": 32, "d_ff": 64}
    small |= {"n_heads": 2, "n_layers": 2}
    lstm = {"family": "neuralode_lm", "embed_dim": 32, "hidden_dim": 32}
    gpt2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 128, "vocab_size": vocab}
    return {
        "ode_transformer residual": {**small, "block": "residual"},
        "ode_transformer rk2": {**small, "block": "rk2"},
        "ode_transformer rk4": {**small, "block": "rk4"},
        "reference transformer": {
            "family": "reference",
            "name": "transformer",
            "d_model": 32,
            "n_heads": 2,
            "d_ff": 64,
            "n_layers": 2,
        },
        "lstm": {**lstm, "name": "lstm"},
        "ode-lstm dopri5": {
            **lstm,
            "name": "ode-lstm",
            "field_hidden": 16,
            "solver": {"method": "dopri5"},
        },
        "node-transformer": {
            "family": "neuralode_lm",
            "name": "node-transformer",
            "d_model": 32,
            "n_heads": 2,
            "d_ff": 64,
            "n_layers": 1,
        },
        "gpt2": {"family": "neuralode_lm", "name": "gpt2", "config": gpt2},
    }


FAMILY_NEEDS = {
    "gpt2": ("transformers",),
    "ode-lstm dopri5": ("torchdiffeq",),
    "node-transformer": ("torchdiffeq",),
}
"""Packages a family needs beyond torch and the library (the node-transformer's default
solve, dopri5 with the adjoint, goes through torchdiffeq)."""


def build(spec: dict[str, Any], vocab: int) -> nn.Module:
    """The library's model of a ``model`` section
    ([`experiments.models.build.build_model`][experiments.models.build.build_model])."""
    from experiments.models.build import build_model

    return build_model(dict(spec), vocab)


def ode_transformer_spec(sizes: Sizes, block: str) -> dict[str, Any]:
    """The throughput-size ``ode_transformer`` with ``block`` (the ``base`` preset's shape)."""
    return {
        "family": "ode_transformer",
        "preset": "base",
        "d_model": sizes.d_model,
        "n_heads": sizes.n_heads,
        "d_ff": sizes.d_ff,
        "n_layers": sizes.n_layers,
        "max_positions": max(512, sizes.seq + 1),
        "block": block,
    }


class _Block(nn.Module):
    """A pre-norm GPT block: SDPA attention (``is_causal``), a ReLU FFN, dropouts."""

    def __init__(self, d: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        p = self.dropout if self.training else 0.0
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.proj(attn.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.fc2(self.drop(F.relu(self.fc1(self.ln2(x))))))


class PlainGPT(nn.Module):
    """A plain PyTorch GPT (learned positions, tied output embedding) of the throughput size,
    the yardstick of the library's models."""

    def __init__(self, sizes: Sizes, dropout: float = 0.1) -> None:
        super().__init__()
        d = sizes.d_model
        self.embed, self.pos = nn.Embedding(sizes.vocab, d), nn.Embedding(sizes.seq + 1, d)
        self.blocks = nn.ModuleList(
            _Block(d, sizes.n_heads, sizes.d_ff, dropout) for _ in range(sizes.n_layers)
        )
        self.norm, self.drop = nn.LayerNorm(d), nn.Dropout(dropout)
        self.head = nn.Linear(d, sizes.vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.embed(tokens) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of ``tokens [B, T + 1]`` (``F.cross_entropy``)."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def harness_loss(
    model: nn.Module, compile_backend: str | None = None, harness: bool = True
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The library's training loss of ``model``: ``LMTask._loss`` where Lightning imports
    (and ``harness``), else ``training_nll`` of the model's logits (plus its regulariser). With
    ``compile_backend`` the forward goes through ``trainer.compile``'s
    ``CompiledModel`` (its ``torch.compile`` given that backend; on a GPU the forward and
    the loss compile as one graph)."""
    if isinstance(model, PlainGPT):  # compiled as nanoGPT is: the forward with its loss
        if compile_backend is None:
            return model.loss
        return torch.compile(model.loss, dynamic=False, backend=compile_backend)  # type: ignore[return-value]
    from experiments.training.compiled import CompiledModel

    compiled = None if compile_backend is None else CompiledModel(model, compile_backend)
    try:
        if not harness:
            raise ImportError("the harness's loss not asked for")
        from experiments.training.config import OptimConfig
        from experiments.training.task import LMTask
    except ImportError:
        from experiments.training.losses import training_nll
        from odelm.contract import call_model

        def loss(tokens: torch.Tensor) -> torch.Tensor:
            logits, aux = call_model(compiled or model, tokens)
            value = training_nll(logits, tokens, None, 0.0)
            return value + aux["reg"] if "reg" in aux else value

        return loss
    task = LMTask(model, OptimConfig(grad_clip=None)).train()
    task.compiled = compiled
    return lambda tokens: task._loss(tokens)[0]


class Stepper:
    """One AdamW training step of ``model`` on a batch, in fp32 or under bf16 autocast
    (through ``torch.compile`` with ``compile_backend``; ``fused``: the fused AdamW;
    ``harness``: the harness's loss, else ``harness_loss``'s without Lightning)."""

    def __init__(
        self,
        model: nn.Module,
        bf16: bool = False,
        lr: float = 1e-3,
        compile_backend: str | None = None,
        fused: bool = False,
        harness: bool = True,
    ) -> None:
        self.model, self.bf16 = model.train(), bf16
        self.device = next(model.parameters()).device
        self.loss = harness_loss(model, compile_backend, harness)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused or None)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """The step's loss, detached (no host sync)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.loss(tokens)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def synthetic_batches(
    count: int, batch: int, seq: int, vocab: int, device: torch.device, seed: int = 0
) -> list[torch.Tensor]:
    """``count`` learnable windows ``[batch, seq + 1]``: each row steps through the
    vocabulary with its own stride, so the loss falls as a model learns."""
    generator = torch.Generator().manual_seed(seed)
    windows = []
    for _ in range(count):
        start = torch.randint(0, vocab, (batch, 1), generator=generator)
        stride = torch.randint(1, 8, (batch, 1), generator=generator)
        windows.append(((start + stride * torch.arange(seq + 1)) % vocab).to(device))
    return windows


def random_batches(
    count: int, batch: int, seq: int, vocab: int, device: torch.device, seed: int = 0
) -> list[torch.Tensor]:
    """``count`` uniform random windows ``[batch, seq + 1]``."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, seq + 1)
    return [torch.randint(0, vocab, shape, generator=generator).to(device) for _ in range(count)]


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(
    call: Callable[[], Any], device: torch.device, warmup: int, reps: int
) -> float:
    """Mean seconds of ``call`` over ``reps`` calls after ``warmup`` untimed ones (CUDA
    events around the loop on CUDA, synchronised before and after)."""
    for _ in range(warmup):
        call()
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / reps
    started = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - started) / reps


def matmul_tflops(n: int, dtype: torch.dtype, device: torch.device, reps: int = 10) -> float:
    """TFLOP/s of ``n x n @ n x n`` in ``dtype`` on ``device``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = seconds_per_call(lambda: torch.mm(a, b), device, warmup=2, reps=reps)
    return 2 * n**3 / seconds / 1e12


def free(device: torch.device) -> None:
    """On CUDA: collect garbage (then freeze the survivors, so that the next collection
    scans only new objects: a full one takes a second after Lightning's imports), release
    cached memory and reset the peak counter. Nothing on the CPU."""
    if device.type == "cuda":
        gc.collect()
        gc.freeze()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` in MiB on CUDA; None on the CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def step_flops(step: Callable[[], Any]) -> int:
    """FLOPs of one call of ``step`` (forward and backward), counted by the library's
    counter (``experiments.models.flops.flop_counter``)."""
    from experiments.models.flops import flop_counter

    with flop_counter() as counter:
        step()
    return counter.get_total_flops()


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite number."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def ratio(top: Any, bottom: Any) -> float | None:
    """``top / bottom`` when both are finite numbers and ``bottom`` is not 0, else None."""
    return top / bottom if finite(top) and finite(bottom) and bottom else None
