"""The training loss's path is chosen by device type and dtype: the CPU's
blocked paths on the CPU, PyTorch's ``F.cross_entropy`` on CUDA and every other device.

A CPU-only machine checks the CUDA path on the ``meta`` device (forward and backward; a
device that is not the CPU takes the CUDA path) and with fake CUDA tensors under
``FakeTensorMode`` (forward only: autograd and Python indexing of a fake CUDA tensor need a
CUDA build), counting the aten ops each path dispatches.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.training.config import OptimConfig
from experiments.training.losses import (
    chunked_cross_entropy,
    cross_entropy_nll,
    fused_loss_dtype,
    linear_cross_entropy,
    loss_path,
    training_inputs,
    training_nll,
)
from experiments.training.task import LMTask
from ode_transformer import ODETransformerConfig, ODETransformerLM

CROSS_ENTROPY_OPS = 24
"""The most aten ops :func:`training_nll` may take forward and backward off the CPU (16
measured: the padded targets, a cast, log-softmax, NLL, their backwards, a cast back,
detaches); the blocked path takes about 1,700 for 4,096 rows."""

TABLE = [
    ("cpu", torch.bfloat16, "blocked"),
    ("cpu", torch.float16, "blocked"),
    ("cpu", torch.float32, "cross_entropy"),
    ("cpu", torch.float64, "cross_entropy"),
    ("cpu", None, "cross_entropy"),
    ("cuda", torch.bfloat16, "cross_entropy"),
    ("cuda", torch.float16, "cross_entropy"),
    ("cuda", torch.float32, "cross_entropy"),
    ("meta", torch.bfloat16, "cross_entropy"),
    ("mps", torch.float16, "cross_entropy"),
    ("xpu", torch.bfloat16, "cross_entropy"),
]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("device", "dtype", "path"), TABLE)
def test_the_loss_path_is_a_function_of_device_type_and_dtype(
    device: str, dtype: torch.dtype | None, path: str
) -> None:
    assert loss_path(device, dtype) == path


def _loss_ops(device: str, rows: int = 512, vocab: int = 100) -> tuple[list[str], torch.Tensor]:
    """The aten ops of :func:`training_nll`'s forward and backward on bf16 logits."""
    logits = torch.randn(4, rows // 4, vocab).to(device=device, dtype=torch.bfloat16)
    logits.requires_grad_(True)
    tokens = torch.randint(0, vocab, (4, rows // 4)).to(device)
    with OpCounter() as counter:
        training_nll(logits, tokens, None, 0.0).backward()
    return counter.ops, logits.grad


def test_bf16_logits_off_the_cpu_take_a_handful_of_ops_forward_and_backward() -> None:
    cpu_ops, _ = _loss_ops("cpu")
    meta_ops, grad = _loss_ops("meta")
    assert "aten.nll_loss_forward.default" in meta_ops
    assert len(meta_ops) <= CROSS_ENTROPY_OPS, meta_ops
    assert grad.dtype == torch.bfloat16 and grad.shape == (4, 128, 100)
    assert len(cpu_ops) > 5 * CROSS_ENTROPY_OPS  # the blocked path: a loop over row blocks


def test_fake_cuda_logits_take_the_cross_entropy_path_in_a_handful_of_ops() -> None:
    """32 x 256 rows of a 32k vocabulary: on a CPU the blocked path loops 128 times."""
    with FakeTensorMode():
        logits = torch.empty(32 * 256, 32000, device="cuda", dtype=torch.bfloat16)
        targets = torch.zeros(32 * 256, device="cuda", dtype=torch.long)
        assert loss_path(logits.device.type, logits.dtype) == "cross_entropy"
        with OpCounter() as counter:
            loss = cross_entropy_nll(logits, targets)
    assert loss.device.type == "cuda" and loss.dtype == torch.float32
    assert "aten.nll_loss_forward.default" in counter.ops
    assert len(counter.ops) <= CROSS_ENTROPY_OPS // 2, counter.ops


class _Exposed(torch.nn.Module):
    """A model exposing ``features`` and ``output_layer`` (the fusable contract)."""

    def __init__(self) -> None:
        super().__init__()
        self.output_layer = torch.nn.Linear(8, 16)

    def features(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        return torch.zeros(*tokens.shape, 8, device=tokens.device), {}


def test_the_output_layer_is_fused_under_autocast_on_the_cpu_only() -> None:
    model = _Exposed()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_loss_dtype(model, torch.zeros(2, 5, dtype=torch.long), None, 0.0) is (
            torch.bfloat16
        )
    with FakeTensorMode():
        tokens = torch.zeros(2, 5, device="cuda", dtype=torch.long)
        before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", True)  # torch.autocast("cuda") needs a CUDA build
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        try:
            assert torch.is_autocast_enabled("cuda")
            assert fused_loss_dtype(model, tokens, None, 0.0) is None
        finally:
            torch.set_autocast_enabled("cuda", before[0])
            torch.set_autocast_dtype("cuda", before[1])


def test_the_cuda_path_on_cpu_tensors_equals_the_cpu_paths() -> None:
    generator = torch.Generator().manual_seed(0)
    rows, vocab = 300, 1000
    logits = (3 * torch.randn(rows, vocab, generator=generator)).bfloat16()
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    targets[::7] = -100  # not scored
    blocked = logits.clone().requires_grad_(True)
    plain = logits.clone().requires_grad_(True)
    blocked_loss = chunked_cross_entropy(blocked, targets)
    plain_loss = cross_entropy_nll(plain, targets)
    (blocked_loss + plain_loss).backward()
    assert abs(blocked_loss.item() - plain_loss.item()) <= 1e-5
    assert torch.allclose(blocked.grad.float(), plain.grad.float(), atol=1e-5)

    hidden = torch.randn(rows, 32, generator=generator, requires_grad=True)
    layer = torch.nn.Linear(32, vocab)
    rows_targets = targets.clamp(min=0)
    fused = linear_cross_entropy(hidden, layer.weight, layer.bias, rows_targets, torch.float32)
    reference = cross_entropy_nll(layer(hidden), rows_targets)
    assert abs(fused.item() - reference.item()) <= 1e-5


def test_training_nll_on_the_cpu_is_the_blocked_path_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 20, 50, generator=generator).bfloat16()
    tokens = torch.randint(0, 50, (3, 20), generator=generator)
    targets = torch.cat([tokens[:, 1:], torch.full((3, 1), -100)], 1).reshape(-1)
    expected = chunked_cross_entropy(logits.reshape(-1, 50), targets)
    assert torch.equal(training_nll(logits, tokens, None, 0.0), expected)
    full = logits.float()
    assert torch.equal(
        training_nll(full, tokens, None, 0.0),
        F.cross_entropy(full.reshape(-1, 50), targets, ignore_index=-100),
    )


class _Recorder(torch.nn.Module):
    """A model that records the lengths of the token batches its forward runs on."""

    def __init__(self, exactly_causal: bool | None) -> None:
        super().__init__()
        self.is_causal = True
        if exactly_causal is not None:
            self.exactly_causal = exactly_causal
        self.embedding = torch.nn.Embedding(11, 11)
        self.lengths: list[int] = []

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        self.lengths.append(tokens.shape[1])
        return self.embedding(tokens), {}


@pytest.mark.parametrize(
    ("exactly_causal", "masked", "length"),
    [(None, False, 5), (True, False, 5), (False, False, 6), (None, True, 6)],
)
def test_a_training_forward_runs_on_the_positions_that_predict(
    exactly_causal: bool | None, masked: bool, length: int
) -> None:
    """The last position of a window predicts nothing: an exactly causal model's fp32
    training forward leaves it out (the fused bf16 loss always did); a model whose
    positions share adaptive steps (``exactly_causal`` False) and a masked batch keep every
    position."""
    model = _Recorder(exactly_causal)
    tokens = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 6, dtype=torch.bool) if masked else None
    assert training_inputs(model, tokens, mask).shape[1] == length
    model.lengths.clear()
    loss, _ = LMTask(model, OptimConfig())._loss((tokens, mask) if masked else tokens)
    assert model.lengths == [length]
    full = F.cross_entropy(
        model.embedding(tokens[:, :-1]).reshape(-1, 11), tokens[:, 1:].reshape(-1)
    )
    assert abs(loss.item() - full.item()) < 1e-6


def test_an_exactly_causal_transformer_loses_nothing_by_the_dropped_position() -> None:
    """fp32, dropout off: the loss and every gradient of a Transformer LM trained on the
    window's first T - 1 positions equal those of its forward over all T (to float
    precision: causal attention never reads the last position for an earlier one)."""
    torch.manual_seed(0)
    config = ODETransformerConfig(
        vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_positions=16,
        block="rk2", dropout=0.0, attention_dropout=0.0, relu_dropout=0.0,
    )  # fmt: skip
    model = ODETransformerLM(config)
    tokens = torch.randint(0, 40, (4, 9), generator=torch.Generator().manual_seed(1))
    task = LMTask(model, OptimConfig())
    loss, _ = task._loss(tokens)
    loss.backward()
    dropped = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits, _ = model(tokens)
    full = training_nll(logits, tokens, None, 0.0)
    full.backward()
    assert abs(loss.item() - full.item()) < 1e-6
    for short, whole in zip(dropped, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(short, whole, atol=1e-6)
