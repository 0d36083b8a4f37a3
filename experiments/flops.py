"""Measured forward FLOPs per predicted token, the one cost column shared by all families.

Counted with PyTorch's public ``torch.utils.flop_counter.FlopCounterMode`` while the model
runs on real evaluation batches, so an adaptive solver reports the FLOPs of the steps it
actually took (its average over the batches), and a discrete model reports what its
tableau costs. Matrix products and attention are counted; elementwise work is not
(PyTorch's counter ignores it), which is the usual convention for Transformer FLOPs.
Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) run as fused kernels the counter
does not see, so their matrix products are added in closed form by a forward hook:
``2 x gates x hidden x (input + hidden)`` per token, layer and direction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from experiments.contract import call_model
from experiments.data.tokenization import LMData


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
            with FlopCounterMode(display=False) as counter, recurrent_flops(model) as extra:
                call_model(model, ids)
            flops += counter.get_total_flops() + extra[0]
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


TEST_FLOPS_BATCHES = 4  # adaptive solvers are slow: a few evaluation batches give the average


def split_flops_per_token(
    model: nn.Module,
    data: LMData,
    split: str = "test",
    *,
    mode: str = "stream",
    window: int = 128,
    padding_side: str = "right",
    max_batches: int = TEST_FLOPS_BATCHES,
) -> dict[str, float | int]:
    """``{"flops_per_token", "flops_batches"}`` over the first ``max_batches`` of the
    batches ``evaluate`` scores ``split`` with (same windows, padding and masks)."""
    from experiments.evaluate import evaluation_batches, window_length

    batches = evaluation_batches(
        data, split, mode=mode, window=window_length(model, window), padding_side=padding_side
    )[:max_batches]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    on_device = [
        (ids.to(device), None if mask is None else mask.to(device)) for ids, mask in batches
    ]
    return {
        "flops_per_token": forward_flops_per_token(model, on_device),
        "flops_batches": len(on_device),
    }
