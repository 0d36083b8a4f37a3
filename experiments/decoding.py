"""Greedy and beam-search decoding for any model that meets the contract.

The generic decoders recompute the whole prefix at every step (no cache), cropped from the
left to ``model.max_positions`` when the model declares it, so they work for every model;
a model with its own ``generate`` (the ODE-Transformer LMs, with a key/value cache) is used
through it by ``decode_continuation``. Put the model in eval mode first.
"""

from __future__ import annotations

from typing import Any

import torch

from experiments.contract import ContractError, call_model

STRATEGIES = ("greedy", "beam")


def _check_prompt(prompt: torch.Tensor) -> None:
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise ValueError(
            f"prompt must be a LongTensor [1, P] with P >= 1, got {tuple(prompt.shape)}"
        )


def _next_log_probs(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """``log p(next | tokens[b])`` for every row, in float64: ``[B, V]``."""
    limit = getattr(model, "max_positions", None)
    if limit is not None and tokens.shape[1] > limit:
        tokens = tokens[:, -limit:]
    logits, _ = call_model(model, tokens)
    return torch.log_softmax(logits[:, -1].double(), dim=-1)


@torch.no_grad()
def greedy_decode(
    model: Any, prompt: torch.Tensor, max_new_tokens: int, eos_id: int | None = None
) -> list[int]:
    """The argmax continuation of ``prompt``: new tokens only, stopping before ``eos_id``."""
    _check_prompt(prompt)
    tokens, new = prompt, []
    for _ in range(max_new_tokens):
        token = int(_next_log_probs(model, tokens)[0].argmax())
        if token == eos_id:
            break
        new.append(token)
        tokens = torch.cat([tokens, tokens.new_tensor([[token]])], dim=1)
    return new


@torch.no_grad()
def beam_search(
    model: Any,
    prompt: torch.Tensor,
    max_new_tokens: int,
    num_beams: int = 4,
    eos_id: int | None = None,
    length_penalty: float = 1.0,
) -> list[int]:
    """The best continuation found by beam search (new tokens only, without the eos).

    Each step keeps the ``num_beams`` best extensions of the live beams by total log-probability
    (ties go to the lower token id, as in ``argmax``); an extension ending in ``eos_id`` is a
    finished hypothesis and takes its slot, so ``num_beams=1`` is exactly greedy decoding.
    Finished and still-live hypotheses are ranked by ``sum log p / n ** length_penalty`` with
    ``n`` the number of new tokens (eos included); ``length_penalty=0`` ranks by probability.
    """
    _check_prompt(prompt)
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    live: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float, int]] = []
    for _ in range(max_new_tokens):
        if not live:
            break
        grown = torch.tensor([seq for seq, _ in live], dtype=prompt.dtype, device=prompt.device)
        batch = torch.cat([prompt.expand(len(live), -1), grown.view(len(live), -1)], dim=1)
        totals = torch.tensor([s for _, s in live], dtype=torch.float64, device=batch.device)
        flat = (_next_log_probs(model, batch) + totals[:, None]).flatten()
        vocab = flat.numel() // len(live)
        order = torch.sort(flat, descending=True, stable=True).indices[:num_beams]
        next_live = []
        for index in order.tolist():
            beam, token = divmod(index, vocab)
            seq, score = live[beam][0], float(flat[index])
            if token == eos_id:
                finished.append((seq, score, len(seq) + 1))
            else:
                next_live.append((seq + [token], score))
        live = next_live
    candidates = finished + [(seq, score, len(seq)) for seq, score in live]
    best = max(candidates, key=lambda c: c[1] / max(c[2], 1) ** length_penalty)
    return best[0]


@torch.no_grad()
def decode_continuation(
    model: Any,
    prompt: torch.Tensor,
    max_new_tokens: int,
    strategy: str = "greedy",
    num_beams: int = 4,
    eos_id: int | None = None,
) -> list[int]:
    """New tokens after ``prompt`` (at most ``max_new_tokens``, cut before the first eos).

    A model with a ``generate`` method is called as ``model.generate(prompt, max_new_tokens,
    strategy=..., num_beams=..., eos_token_id=...)`` and must return the prompt followed by
    the new tokens (``[1, P + n]`` or ``[P + n]``); other models use the generic decoders.
    """
    _check_prompt(prompt)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown decoding strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not callable(getattr(model, "generate", None)):
        if strategy == "greedy":
            return greedy_decode(model, prompt, max_new_tokens, eos_id)
        return beam_search(model, prompt, max_new_tokens, num_beams, eos_id)
    out = torch.as_tensor(
        model.generate(
            prompt, max_new_tokens, strategy=strategy, num_beams=num_beams, eos_token_id=eos_id
        )
    )
    if out.dim() == 2 and out.shape[0] == 1:
        out = out[0]
    sequence, head = out.tolist(), prompt[0].tolist()
    if out.dim() != 1 or sequence[: len(head)] != head:
        raise ContractError(
            f"{type(model).__name__}.generate must return the prompt followed by the new tokens "
            f"as [1, P + n] or [P + n]; got shape {tuple(out.shape)} not starting with the prompt"
        )
    new = sequence[len(head) : len(head) + max_new_tokens]
    return new[: new.index(eos_id)] if eos_id in new else new
