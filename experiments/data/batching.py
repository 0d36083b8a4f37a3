"""Batching: contiguous BPTT windows over a token stream, and padded sentence batches.

Under the model contract ``logits[:, t]`` predicts ``tokens[:, t + 1]``, so a window of
``bptt + 1`` tokens trains ``bptt`` predictions, and consecutive windows overlap by one
token so that every token of the stream is predicted once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from odelm.errors import OdelmError


class StreamTooShortError(OdelmError, ValueError):
    """A split has too few tokens for the batch size."""


def stream_windows(ids: torch.Tensor, batch_size: int, bptt: int) -> list[torch.Tensor]:
    """Cut a stream into ``batch_size`` contiguous rows and return ``[B, bptt + 1]`` windows.

    The classic word-language-model batching (rows are contiguous text, remainder trimmed):
    window ``k + 1`` of row ``b`` starts with the token that ends window ``k``, so a model
    that carries its state across windows reads each row as one stream.
    """
    if batch_size < 1 or bptt < 1:
        raise ValueError(f"batch_size and bptt must be >= 1, got {batch_size} and {bptt}")
    row_length = ids.numel() // batch_size
    if row_length < 2:
        raise StreamTooShortError(
            f"a stream of {ids.numel()} tokens is too short for batch size {batch_size}; "
            "lower data.batch_size"
        )
    rows = ids[: row_length * batch_size].view(batch_size, row_length)
    return [rows[:, offset : offset + bptt + 1] for offset in range(0, row_length - 1, bptt)]


def evaluation_windows(ids: torch.Tensor, eos_id: int, length: int) -> list[torch.Tensor]:
    """Non-overlapping windows in which every token of the split is predicted exactly once.

    An ``<eos>`` is put before the stream as the context of the first token (as if the
    previous sentence had just ended), so the number of predictions equals the number of
    tokens and per-word perplexity is total NLL over the split's words, exactly.
    """
    stream = torch.cat([torch.tensor([eos_id], dtype=ids.dtype), ids])
    return [stream[s : s + length + 1] for s in range(0, ids.numel(), length)]


def sentence_batch(
    sentences: list[list[int]],
    pad_id: int,
    bos_id: int,
    *,
    side: str = "right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad sentences into ``tokens [B, L]`` and ``mask [B, L]`` (True on real tokens).

    Each sentence is prefixed with ``bos_id`` (the ``<eos>`` that ends the previous
    sentence in the stream), so its first word is predicted too. ``side="left"`` pads on the
    left, as the NODE-LM report does so the last position holds the sentence's end.
    """
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    rows = [[bos_id, *sentence] for sentence in sentences]
    width = max(len(row) for row in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        tokens[i, span] = torch.tensor(row)
        mask[i, span] = True
    return tokens, mask


def sentence_batches(
    sentences: list[list[int]],
    batch_size: int,
    eos_id: int,
    *,
    side: str = "right",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive groups of ``batch_size`` sentences, each padded by ``sentence_batch``
    with ``eos_id`` as both the leading context and the padding."""
    return [
        sentence_batch(sentences[i : i + batch_size], eos_id, eos_id, side=side)
        for i in range(0, len(sentences), batch_size)
    ]


def stateful_evaluation_windows(
    ids: torch.Tensor, eos_id: int, num_streams: int, length: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive ``(tokens, mask)`` windows over ``num_streams`` contiguous rows of a split.

    For a model that carries its state from one window of a row to the next. As in
    ``evaluation_windows``, an ``<eos>`` comes first and every token is predicted exactly
    once: row ``b`` predicts the ``b``-th of ``num_streams`` near-equal contiguous chunks
    (the last row may be shorter; its tail is padding, masked out).
    """
    if num_streams < 1 or length < 1:
        raise ValueError(f"num_streams and length must be >= 1, got {num_streams} and {length}")
    stream = torch.cat([torch.tensor([eos_id], dtype=ids.dtype), ids])
    chunk = -(-ids.numel() // num_streams)  # predictions per row
    starts = range(0, ids.numel(), chunk)
    tokens = torch.full((len(starts), chunk + 1), eos_id, dtype=ids.dtype)
    mask = torch.zeros(tokens.shape, dtype=torch.bool)
    for row, start in enumerate(starts):
        piece = stream[start : start + chunk + 1]
        tokens[row, : piece.numel()] = piece
        mask[row, : piece.numel()] = True
    return [
        (tokens[:, s : s + length + 1], mask[:, s : s + length + 1])
        for s in range(0, chunk, length)
    ]


def lm_nll(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    reduction: str = "sum",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, int]:
    """Next-token negative log-likelihood (summed, or averaged with ``reduction="mean"``)
    and the number of predictions.

    ``logits[:, t]`` is scored against ``tokens[:, t + 1]``; ``logits`` covers all ``T``
    positions (the last, which predicts nothing, is dropped) or the first ``T - 1`` (a
    stateful model fed ``tokens[:, :-1]``). With a mask, only predictions of real
    (unpadded) tokens from real contexts count.
    """
    if logits.shape[1] == tokens.shape[1]:
        logits = logits[:, :-1]
    predictions = logits.reshape(-1, logits.shape[-1]).float()
    targets = tokens[:, 1:].reshape(-1)
    if mask is not None:
        keep = (mask[:, 1:] & mask[:, :-1]).reshape(-1)
        predictions, targets = predictions[keep], targets[keep]
    nll = F.cross_entropy(
        predictions, targets, reduction=reduction, label_smoothing=label_smoothing
    )
    return nll, targets.numel()
