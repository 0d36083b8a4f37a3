"""The training loss: next-token cross-entropy without copying the logits, and for
low-precision logits in fp32, a block of rows at a time; under mixed precision, for a model
that exposes its output layer, the output layer and the loss as one operation.

Under ``bf16-mixed`` the output layer returns bf16 logits ``[N, V]``. The plain way to
score them in fp32 (``F.cross_entropy(logits.float(), ...)``) materialises an fp32 copy of
all ``N x V`` logits, then the log-softmax, then in backward the one-hot fill, the
log-softmax gradient and a cast of it back to bf16: seven passes over ``N x V`` memory,
about half of a bf16 training step of a 10k-word model on a CPU.
``chunked_cross_entropy`` computes the same fp32 arithmetic (log-sum-exp per row;
gradient ``softmax - onehot``) on blocks of rows that stay in cache, keeping only the
per-row log-sum-exp between forward and backward.

``linear_cross_entropy`` goes one step further (the fused linear + cross-entropy of
Liger Kernel and of "cut cross-entropy", Wijmans et al. 2024): from the final hidden states
and the output layer's weights it forms the low-precision logits in one matrix product,
then for each block of rows, in fp32 while the block is in cache, the softmax (one
exponential per logit, in base 2: the logits come out of the product scaled by
``log2(e)``), the loss and the gradient ``softmax - onehot``, written back over the block's
logits in the low precision; the output layer's bias gradient is summed there too. Backward is two
matrix products in the low precision. Nothing of size ``N x V`` is kept but the one
low-precision buffer, and the last position of each window, which predicts nothing, is
never computed.

Both are tuned for a CPU, where a Python loop over blocks costs little next to the
arithmetic; on a GPU the same loops launch small kernels by the thousand (about 1,700 aten
ops forward and backward for 4,096 rows, against 16 for ``F.cross_entropy``).
``loss_path`` chooses by device type and dtype: the blocked paths on the CPU, PyTorch's
own ``F.cross_entropy`` on the logits (``cross_entropy_nll``) on CUDA and every other
device.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from experiments.data.batching import lm_nll
from odelm.mixed_precision import product

IGNORE_INDEX = -100  # cross-entropy's default: a target that is not scored
ROWS_PER_BLOCK = 64
"""Rows per block: 64 x a 10k vocabulary in fp32 is 2.5 MB, within a core's L2."""
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453
LOW_PRECISION = (torch.bfloat16, torch.float16)

LossPath = Literal["blocked", "cross_entropy"]
"""``blocked``: the CPU's paths in blocks of rows (``linear_cross_entropy`` where the
model exposes its output layer and the batch allows, else ``chunked_cross_entropy``);
``cross_entropy``: ``F.cross_entropy`` on fp32 logits (``cross_entropy_nll``)."""


def loss_path(device_type: str, dtype: torch.dtype | None) -> LossPath:
    """The training loss's path for logits (or an autocast region) of ``dtype`` on a
    ``device_type`` device: ``blocked`` for bf16/fp16 on the CPU, else ``cross_entropy``
    (fp32 on the CPU; any dtype on CUDA and other devices, where the blocked paths' Python
    loops launch small kernels by the thousand)."""
    if device_type == "cpu" and dtype in LOW_PRECISION:
        return "blocked"
    return "cross_entropy"


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean NLL of ``targets`` under ``logits`` (rows with ``ignore_index`` not scored).

    Where the logits need a gradient, the forward pass also computes it for an upstream
    gradient of 1 (what a training loss receives), on each block while it is in cache, so
    backward does not read the logits again; any other upstream gradient is recomputed
    from the saved logits by the same arithmetic.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int):
        keep = targets != ignore_index
        safe = targets.masked_fill(~keep, 0)
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        picked = torch.empty_like(lse)
        count = keep.sum().clamp(min=1)
        unit = None
        if ctx.needs_input_grad[0]:
            unit = torch.empty_like(logits)
            unit_scale = (torch.ones((), device=logits.device) / count) * keep
        block_buffer = torch.empty(ROWS_PER_BLOCK, logits.shape[1], device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            for start in range(0, logits.shape[0], ROWS_PER_BLOCK):
                rows = slice(start, start + ROWS_PER_BLOCK)
                block = block_buffer[: logits[rows].shape[0]].copy_(logits[rows])  # fp32
                lse[rows] = torch.logsumexp(block, dim=1)
                picked[rows] = block.gather(1, safe[rows, None])[:, 0]
                if unit is not None:
                    unit[rows] = _gradient_block(block, lse[rows], safe[rows], unit_scale[rows])
        ctx.save_for_backward(logits, safe, lse, keep, count, unit)
        return ((lse - picked) * keep).sum() / count

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, safe, lse, keep, count, unit = ctx.saved_tensors
        if unit is not None and bool(grad == 1):
            return unit, None, None
        scale = (grad / count) * keep
        out = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ROWS_PER_BLOCK):
            rows = slice(start, start + ROWS_PER_BLOCK)
            block = logits[rows].float()
            out[rows] = _gradient_block(block, lse[rows], safe[rows], scale[rows])
        return out, None, None


def _gradient_block(
    block: torch.Tensor, lse: torch.Tensor, safe: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """``(softmax - onehot) * scale`` of a block of fp32 logits, computed in place."""
    block.sub_(lse[:, None]).exp_()  # softmax, in fp32
    minus_one = torch.full((block.shape[0], 1), -1.0, device=block.device)
    block.scatter_add_(1, safe[:, None], minus_one)
    return block.mul_(scale[:, None])


def chunked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets, ignore_index=...)`` (mean over scored
    rows) for ``logits [N, V]`` of any float dtype, in fp32 blocks of rows; the gradient
    comes back in ``logits``' dtype."""
    return _ChunkedCrossEntropy.apply(logits, targets, ignore_index)


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean NLL of ``targets`` under ``hidden @ weight.T + bias`` (every row scored), the
    logits in ``dtype`` and their softmax in fp32 (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype):
        rows = hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):
            x, w = hidden.to(dtype), weight.to(dtype)
            # logits in base 2 (times log2(e)): their softmax is exp2's, a vectorised
            # exponential 3x faster on a CPU than torch.exp's
            gradient = torch.mm((hidden * LOG2E).to(dtype), w.t())  # becomes the gradient
            sums = torch.zeros((), dtype=torch.float32, device=hidden.device)
            bias_grad = None
            if bias is not None and ctx.needs_input_grad[2]:
                bias_grad = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)
            bias2 = None if bias is None else bias.float() * LOG2E
            buffer = torch.empty(min(ROWS_PER_BLOCK, rows), w.shape[0], device=w.device)
            for start in range(0, rows, ROWS_PER_BLOCK):
                block = slice(start, start + ROWS_PER_BLOCK)
                logits = buffer[: gradient[block].shape[0]].copy_(gradient[block])  # fp32
                if bias2 is not None:
                    logits.add_(bias2)
                picked = logits.gather(1, targets[block, None])
                top = logits.amax(1, keepdim=True)
                exps = torch.exp2(logits.sub_(top), out=logits)
                total = exps.sum(1, keepdim=True)
                sums += (top + total.log2() - picked).sum()  # log2-sum-exp2 - target logit
                exps.scatter_add_(1, targets[block, None], -total)  # softmax - onehot, x total
                scale = total.reciprocal_()
                if bias_grad is not None:
                    bias_grad.addmv_(exps.t(), scale[:, 0])
                torch.mul(exps, scale, out=gradient[block])
        ctx.save_for_backward(x, w, gradient, bias_grad)
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        return sums * (LN2 / max(rows, 1))

    @staticmethod
    def backward(ctx, grad):
        x, w, gradient, bias_grad = ctx.saved_tensors
        scale = grad.float() / max(x.shape[0], 1)  # the mean's 1/N and the upstream gradient
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = product(gradient, w).float().mul_(scale).to(ctx.hidden_dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = product(gradient.t(), x).float().mul_(scale).to(ctx.weight_dtype)
        if bias_grad is not None:
            grad_bias = bias_grad * scale
        return grad_hidden, grad_weight, grad_bias, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).float(), targets)`` for ``hidden
    [N, D]`` with every row scored: the matrix products in ``dtype``, the softmax, the loss
    and the bias gradient in fp32, a block of rows at a time, without materialising fp32
    logits (see the module docstring). Gradients come back in the inputs' dtypes."""
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, dtype)


def fused_loss_dtype(
    model: Any, tokens: torch.Tensor, mask: torch.Tensor | None, label_smoothing: float
) -> torch.dtype | None:
    """The low precision of autocast when a training loss of ``model`` on ``tokens`` can
    fuse the output layer (``features_training_nll``): a mixed-precision region, a model
    exposing ``features`` and ``output_layer`` ([`odelm.contract`][odelm.contract]) whose weight
    is not sharded by FSDP, an unmasked batch, no label smoothing, on a device whose
    ``loss_path`` is ``blocked`` (the CPU). None otherwise: full-precision training and GPUs
    are not touched."""
    device = tokens.device.type
    if mask is not None or label_smoothing or not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    if loss_path(device, dtype) != "blocked":
        return None
    layer = getattr(model, "output_layer", None)
    if not (callable(getattr(model, "features", None)) and isinstance(layer, torch.nn.Linear)):
        return None
    if _sharded(layer.weight):  # read outside its module, FSDP's shard is not the weight
        return None
    return dtype


def _sharded(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is a shard managed by FSDP (a ``DTensor`` under ``fully_shard``,
    or a flattened parameter), which only the module's own forward gathers. Lightning's
    ``fsdp`` strategy needs a GPU, where the fused path is never taken; this keeps a
    ``fully_shard`` model on the CPU on the plain path too."""
    return type(weight).__name__ == "DTensor" or bool(getattr(weight, "_fsdp_flattened", False))


def training_inputs(model: Any, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The tokens a training forward of ``model`` runs on: ``tokens[:, :-1]`` for an
    exactly causal model on an unmasked batch (the last position predicts nothing, and no
    earlier position depends on it), every token otherwise. A model says so by
    ``exactly_causal`` (a continuous-depth model whose adaptive steps are shared across
    positions is causal but not exactly), else by ``is_causal``."""
    exact = getattr(model, "exactly_causal", getattr(model, "is_causal", False))
    return tokens[:, :-1] if mask is None and exact is True else tokens


def fused_training_nll(
    model: Any, tokens: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The mean next-token NLL of ``model`` on an unmasked batch by
    ``features_training_nll``, and ``aux``; the model runs on ``training_inputs``."""
    hidden, aux = model.features(training_inputs(model, tokens, None))
    return features_training_nll(hidden, model.output_layer, tokens, dtype), aux


def features_training_nll(
    hidden: torch.Tensor, output_layer: torch.nn.Linear, tokens: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``training_nll`` of ``output_layer(hidden)`` for an unmasked batch, by
    ``linear_cross_entropy`` (``hidden [B, T or T - 1, D]``; the last position of a
    full-length ``hidden`` predicts nothing and is left out)."""
    if hidden.shape[1] == tokens.shape[1]:
        hidden = hidden[:, :-1]
    rows = hidden.reshape(-1, hidden.shape[-1])
    targets = tokens[:, 1:].reshape(-1)
    return linear_cross_entropy(rows, output_layer.weight, output_layer.bias, targets, dtype)


def training_nll(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None, label_smoothing: float
) -> torch.Tensor:
    """The mean next-token NLL of ``lm_nll``. Where the logits cover every position
    of an unmasked batch, the last position (which predicts nothing) is ignored instead of
    sliced off: no copy of the logits forward or backward, the same gradients bit for bit
    (the loss value may differ in its last bit, a different summation). Low-precision
    logits (mixed precision) on the CPU are scored in fp32 blocks of rows
    (``chunked_cross_entropy``); elsewhere by ``cross_entropy_nll``
    (``loss_path``)."""
    length = tokens.shape[1]
    if mask is not None or logits.shape[1] not in (length, length - 1):
        loss, _ = lm_nll(logits, tokens, mask, reduction="mean", label_smoothing=label_smoothing)
        return loss
    targets = tokens[:, 1:]
    if logits.shape[1] == length:
        targets = torch.cat([targets, targets.new_full((targets.shape[0], 1), IGNORE_INDEX)], 1)
    predictions, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    path = loss_path(predictions.device.type, predictions.dtype)
    if path == "blocked" and not label_smoothing:
        return chunked_cross_entropy(predictions, targets, IGNORE_INDEX)
    return cross_entropy_nll(predictions, targets, label_smoothing)


def cross_entropy_nll(
    predictions: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """PyTorch's ``F.cross_entropy`` of ``predictions [N, V]`` in fp32 (mean over the rows
    whose target is not ``IGNORE_INDEX``): the ``cross_entropy`` ``loss_path``."""
    return F.cross_entropy(
        predictions.float(), targets, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing
    )
