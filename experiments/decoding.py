"""Decoding for the harness: the library's one protocol, for every model family.

:func:`generate` is :func:`ode_transformer.generation.generate` (greedy, sampling, beam
search through one cache-aware step function; its docstring states the beam ranking rule),
re-exported here so the harness and the model packages share one implementation. The
decoding lives in ``ode_transformer`` because the model packages never import
``experiments``; it is family-agnostic and needs only the model contract.
:func:`decode_continuation` is the form continuation BLEU and ``odelm generate`` use.
"""

from __future__ import annotations

from typing import Any

import torch

from ode_transformer.generation import STRATEGIES, DecodingError, StepFunction, generate

__all__ = ["STRATEGIES", "DecodingError", "StepFunction", "decode_continuation", "generate"]


def decode_continuation(
    model: Any,
    prompt: torch.Tensor,
    max_new_tokens: int,
    strategy: str = "greedy",
    num_beams: int = 4,
    eos_id: int | None = None,
    **options: Any,
) -> list[int]:
    """New tokens after ``prompt`` [1, P] (at most ``max_new_tokens``, cut before the first eos).

    The prompt is cropped to the model's context (``max_positions``) like every other path;
    ``options`` go to :func:`generate` (``temperature``, ``top_k``, ``top_p``, ``generator``,
    ``length_penalty``, ``use_cache``).
    """
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise DecodingError(
            f"prompt must be a LongTensor [1, P] with P >= 1, got {tuple(prompt.shape)}"
        )
    out = generate(
        model,
        prompt,
        max_new_tokens,
        strategy=strategy,
        num_beams=num_beams,
        eos_id=eos_id,
        **options,
    )
    new = out[0, prompt.shape[1] :].tolist()
    return new[: new.index(eos_id)] if eos_id in new else new
