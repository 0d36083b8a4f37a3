"""The training loss: next-token cross-entropy without copying the logits, and for
low-precision logits in fp32, a block of rows at a time.

Under ``bf16-mixed`` the output layer returns bf16 logits ``[N, V]``. The plain way to
score them in fp32 (``F.cross_entropy(logits.float(), ...)``) materialises an fp32 copy of
all ``N x V`` logits, then the log-softmax, then in backward the one-hot fill, the
log-softmax gradient and a cast of it back to bf16: seven passes over ``N x V`` memory,
about half of a bf16 training step of a 10k-word model on a CPU.
:func:`chunked_cross_entropy` computes the same fp32 arithmetic (log-sum-exp per row;
gradient ``softmax - onehot``) on blocks of rows that stay in cache, keeping only the
per-row log-sum-exp between forward and backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from experiments.data.batching import lm_nll

IGNORE_INDEX = -100  # cross-entropy's default: a target that is not scored
ROWS_PER_BLOCK = 64
"""Rows per block: 64 x a 10k vocabulary in fp32 is 2.5 MB, within a core's L2."""


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


def training_nll(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None, label_smoothing: float
) -> torch.Tensor:
    """The mean next-token NLL of :func:`lm_nll`. Where the logits cover every position
    of an unmasked batch, the last position (which predicts nothing) is ignored instead of
    sliced off: no copy of the logits forward or backward, the same gradients bit for bit
    (the loss value may differ in its last bit, a different summation). Low-precision
    logits (mixed precision) are scored in fp32 blocks of rows
    (:func:`experiments.training.losses.chunked_cross_entropy`)."""
    length = tokens.shape[1]
    if mask is not None or logits.shape[1] not in (length, length - 1):
        loss, _ = lm_nll(logits, tokens, mask, reduction="mean", label_smoothing=label_smoothing)
        return loss
    targets = tokens[:, 1:]
    if logits.shape[1] == length:
        targets = torch.cat([targets, targets.new_full((targets.shape[0], 1), IGNORE_INDEX)], 1)
    predictions, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if predictions.dtype in (torch.bfloat16, torch.float16) and not label_smoothing:
        return chunked_cross_entropy(predictions, targets, IGNORE_INDEX)
    return F.cross_entropy(
        predictions.float(), targets, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing
    )
