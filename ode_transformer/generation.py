"""Decoding for ODE Transformer LMs: greedy, sampling (temperature, top-k, top-p) and beam
search with the per-stage key/value cache, and the logits filter used by sampling."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .backbone import check_tokens
from .layers import KVCache

STRATEGIES = ("greedy", "sample", "beam")


@torch.no_grad()
def generate(
    model: Any,
    tokens: torch.Tensor,
    max_new_tokens: int,
    *,
    strategy: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 4,
    use_cache: bool = True,
    eos_token_id: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Continue ``tokens`` [B, T]; returns prompt + continuation as a LongTensor.

    ``use_cache=False`` recomputes the whole prefix every step (the reference the cache
    is checked against). With ``eos_token_id`` a finished sequence is padded with it and
    generation stops early once every sequence (or every beam) has finished.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (use strategy='greedy' for argmax), got {temperature}"
        )
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1] or be None, got {top_p!r}")
    if strategy == "beam" and (not isinstance(num_beams, int) or num_beams < 1):
        raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}")
    check_tokens(tokens, model.vocab_size, model.max_positions)
    if tokens.shape[1] == 0:
        raise ValueError("generate() needs a prompt of at least one token")
    if tokens.shape[1] + max_new_tokens > model.max_positions:
        raise ValueError(
            f"prompt length {tokens.shape[1]} + max_new_tokens {max_new_tokens} exceeds "
            f"max_positions={model.max_positions}; shorten the prompt or generate fewer tokens"
        )
    was_training = model.training
    model.eval()
    try:
        if strategy == "beam":
            return _beam_search(model, tokens, max_new_tokens, num_beams, use_cache, eos_token_id)
        return _decode(
            model,
            tokens,
            max_new_tokens,
            use_cache,
            eos_token_id,
            sample=strategy == "sample",
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
        )
    finally:
        model.train(was_training)


def _decode(
    model: Any,
    tokens: torch.Tensor,
    max_new_tokens: int,
    use_cache: bool,
    eos_token_id: int | None,
    *,
    sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Greedy or sampled decoding, one token per step."""
    cache = KVCache() if use_cache else None
    sequence, step_input = tokens, tokens
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        logits = model.next_token_logits(step_input, cache)
        if sample:
            probs = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
            next_token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            next_token = logits.argmax(dim=-1)
        if eos_token_id is not None:
            next_token = torch.where(finished, eos_token_id, next_token)
            finished |= next_token == eos_token_id
        sequence = torch.cat([sequence, next_token[:, None]], dim=1)
        if eos_token_id is not None and bool(finished.all()):
            break
        step_input = next_token[:, None] if use_cache else sequence
    return sequence


def _beam_search(
    model: Any,
    tokens: torch.Tensor,
    max_new_tokens: int,
    num_beams: int,
    use_cache: bool,
    eos_token_id: int | None,
) -> torch.Tensor:
    """Beam search on summed log-probabilities; returns the best beam per sequence."""
    B, K, V = tokens.shape[0], num_beams, model.vocab_size
    sequence = tokens.repeat_interleave(K, dim=0)  # [B*K, T]
    scores = torch.full((B, K), float("-inf"), device=tokens.device)
    scores[:, 0] = 0.0  # all beams start equal: keep one so the first step has no duplicates
    finished = torch.zeros(B * K, dtype=torch.bool, device=tokens.device)
    cache = KVCache() if use_cache else None
    step_input = sequence
    for _ in range(max_new_tokens):
        log_probs = F.log_softmax(model.next_token_logits(step_input, cache).float(), dim=-1)
        if eos_token_id is not None:  # a finished beam can only continue with eos, free
            log_probs[finished] = float("-inf")
            log_probs[finished, eos_token_id] = 0.0
        candidates = (scores.reshape(B * K, 1) + log_probs).reshape(B, K * V)
        scores, flat = candidates.topk(K, dim=1)
        source = (torch.arange(B, device=tokens.device)[:, None] * K + flat // V).reshape(-1)
        next_token = (flat % V).reshape(-1)
        sequence = torch.cat([sequence[source], next_token[:, None]], dim=1)
        if cache is not None:
            cache.reorder(source)
        if eos_token_id is not None:
            finished = finished[source] | (next_token == eos_token_id)
            if bool(finished.all()):
                break
        step_input = next_token[:, None] if use_cache else sequence
    best = scores.argmax(dim=1)
    return sequence.reshape(B, K, -1)[torch.arange(B, device=tokens.device), best]


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set logits outside the top-k tokens / the top-p nucleus to -inf (rows of ``[B, V]``).

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``.
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # mass before >= p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
