"""Measured forward FLOPs per predicted token, the one cost column shared by all families.

Counted with PyTorch's public ``torch.utils.flop_counter.FlopCounterMode`` while the model
runs on real evaluation batches, so an adaptive solver reports the FLOPs of the steps it
actually took, and a discrete model what its tableau costs. Matrix products are counted
(``2 x m x n x k`` for an ``[m, k] @ [k, n]`` product; bias additions and other elementwise
work are not, the usual convention for Transformer FLOPs). Three kinds of fused kernel the
counter alone would miss are covered:

* attention: ``scaled_dot_product_attention`` on CPU runs as
  ``_scaled_dot_product_flash_attention_for_cpu``, which PyTorch's counter scores 0; it is
  given PyTorch's own SDPA formula (the one it uses for the GPU kernels): the ``QK^T``
  scores ``2 x T_q x T_k x d_head`` and the scores-times-``V`` product
  ``2 x T_q x T_k x d_head`` per head. Convention: the **full** ``T x T`` score matrix is
  counted under a causal mask too, as the kernels compute it (no halving for the masked
  half); the eager-attention path (explicit ``matmul``) is counted the same way;
* the fused fast paths of ``nn.TransformerEncoderLayer`` / ``nn.MultiheadAttention``
  (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``), invisible to the
  counter, are switched off while counting (``torch.backends.mha``), so their projections
  and attention run as counted ops; the values computed are the same;
* recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) run as fused kernels, so their
  matrix products are added in closed form by a forward hook:
  ``2 x gates x hidden x (input + hidden)`` per token, layer and direction.

This module owns the counting and its conventions; the others use it: ``evaluate``
(``experiments.training.metrics``) counts during its own perplexity pass, so FLOPs,
perplexity and NFE come from the same forward passes over the whole split; the throughput
meter's MFU and ``odelm compare``'s compute figure (``experiments.comparison.compute``) take
training FLOPs as ``training_flops`` of the forward count; ``grid_flops``
(``experiments.comparison.config_flops``) recomputes a grid's fixed-compute FLOPs from the
configs alone (they do not depend on the weights); the GPU benchmarks count a whole
training step under ``flop_counter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from odelm.contract import call_model

aten = torch.ops.aten


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """PyTorch's SDPA formula (``QK^T`` plus scores-times-``V``, full ``T x T``)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# Fused attention kernels PyTorch's counter scores 0 (the GPU kernels it already counts).
ATTENTION_FORMULAS = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops}


TRAINING_PASSES = 3
"""Training FLOPs per forward FLOP: the forward pass, and a backward pass costing two."""


def training_flops(forward_per_token: float, tokens: float) -> float:
    """Training FLOPs (forward and backward) of ``tokens`` tokens of a model whose forward
    costs ``forward_per_token``."""
    return TRAINING_PASSES * forward_per_token * tokens


def flop_counter() -> FlopCounterMode:
    """PyTorch's FLOP counter with the attention formulas it lacks (``ATTENTION_FORMULAS``)."""
    return FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS)


@contextmanager
def counting_flops(model: nn.Module) -> Iterator[Callable[[], int]]:
    """Count the forward FLOPs of everything ``model`` runs inside the block.

    Yields a function returning the total so far (matrix products, attention included,
    plus the closed form of recurrent kernels); valid after the block too.
    """
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with (
            flop_counter() as counter,
            recurrent_flops(model) as extra,
        ):
            yield lambda: counter.get_total_flops() + extra[0]
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


@torch.no_grad()
def forward_flops_per_token(
    model: nn.Module,
    batches: Iterable[torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]],
    *,
    max_batches: int | None = None,
) -> float:
    """Forward FLOPs per predicted token over ``batches`` (``tokens`` or ``(tokens, mask)``).

    A token counts as predicted when it has a successor in its window (and, with a mask,
    when both it and its successor are real tokens), matching the perplexity's count.
    """
    was_training = model.training
    model.eval()
    flops, tokens = 0, 0
    try:
        for index, batch in enumerate(batches):
            if max_batches is not None and index >= max_batches:
                break
            ids, mask = batch if isinstance(batch, (tuple, list)) else (batch, None)
            with counting_flops(model) as counted:
                call_model(model, ids)
            flops += counted()
            if mask is None:
                tokens += ids[:, 1:].numel()
            else:
                tokens += int((mask[:, 1:] & mask[:, :-1]).sum())
    finally:
        model.train(was_training)
    if tokens == 0:
        raise ValueError("no predicted tokens in the batches given to forward_flops_per_token")
    return flops / tokens


RECURRENT_GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}


def recurrent_layer_flops(module: nn.RNNBase, tokens: int) -> int:
    """Matrix-product FLOPs of a recurrent module over ``tokens`` time steps x batch rows."""
    gates = RECURRENT_GATES[type(module)]
    directions = 2 if module.bidirectional else 1
    hidden = module.hidden_size
    total = 0
    for layer in range(module.num_layers):
        inputs = module.input_size if layer == 0 else hidden * directions
        total += 2 * gates * hidden * (inputs + hidden) * directions
    return total * tokens


@contextmanager
def recurrent_flops(model: nn.Module) -> Iterator[list[int]]:
    """Adds the closed-form FLOPs of every recurrent module call into the yielded ``[0]``."""
    total = [0]

    def hook(module: nn.RNNBase, args: tuple, output: object) -> None:
        data = args[0].data if isinstance(args[0], nn.utils.rnn.PackedSequence) else args[0]
        tokens = data.shape[0] if data.dim() == 2 else data.shape[0] * data.shape[1]
        total[0] += recurrent_layer_flops(module, tokens)

    handles = [m.register_forward_hook(hook) for m in model.modules() if type(m) in RECURRENT_GATES]
    try:
        yield total
    finally:
        for handle in handles:
            handle.remove()


def is_adaptive(model: nn.Module) -> bool:
    """Whether some ODE solve of ``model`` picks its own steps (its FLOPs depend on the
    weights and the data, not on the config alone)."""
    for module in model.modules():
        for name in ("solver", "eval_solver", "integration"):
            solver = getattr(module, name, None)
            if hasattr(solver, "fixed") and hasattr(solver, "method") and not solver.fixed:
                return True
    return False
