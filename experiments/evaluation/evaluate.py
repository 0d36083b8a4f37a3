"""``evaluate(model, data, split)``: perplexity, per-word perplexity, BLEU, NFE, timing.

Everything goes through the model contract. A model whose ``is_causal`` is False sees the
tokens it predicts, so its perplexity is not a language-model perplexity: ``evaluate``
refuses to report one unless ``allow_noncausal=True``, and then labels it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from experiments.data.batching import (
    evaluation_windows,
    lm_nll,
    sentence_batches,
    stateful_evaluation_windows,
)
from experiments.data.tokenization import LMData
from experiments.evaluation.flops import counting_flops
from experiments.training.config import DataConfig, RunConfig
from odelm.contract import call_model, check_stateful
from odelm.errors import OdelmError

FLOPS_SAMPLE = "every batch of the split, the forward passes of the perplexity and NFE"
NONCAUSAL_LABEL = "non-causal (reconstruction) perplexity: not a valid language-model perplexity"


class NonCausalModelError(OdelmError, ValueError):
    """A plain perplexity was asked of a model that can see the tokens it predicts."""


def window_length(model: nn.Module, requested: int) -> int:
    """The evaluation window, cropped to the model's positions (one is the context token)."""
    limit = getattr(model, "max_positions", None)
    return min(requested, limit - 1) if limit else requested


def batching_options(data: DataConfig) -> dict[str, Any]:
    """The evaluation batching a run's ``data:`` section asks for, as the keywords of
    :func:`evaluation_batches` and :func:`perplexity`."""
    return {
        "mode": data.batching,
        "window": data.eval_window,
        "batch_size": data.eval_batch_size,
        "padding_side": data.padding_side,
        "stateful": data.stateful,
    }


def evaluation_batches(
    data: LMData,
    split: str,
    *,
    mode: str = "stream",
    window: int = 128,
    batch_size: int = 16,
    padding_side: str = "right",
    stateful: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Batches in which every token of ``split`` is predicted exactly once.

    ``stream``: non-overlapping windows of the token stream (an ``<eos>`` before the first
    token gives it a context); with ``stateful``, consecutive windows of ``batch_size``
    contiguous rows, for a model that carries its state from one to the next.
    ``sentences``: each line alone, after an ``<eos>``, padded (right by default; left only
    for models that take the attention mask).
    """
    eos = data.tokenizer.eos_id
    if stateful:
        return stateful_evaluation_windows(data.split(split).ids, eos, batch_size, window)
    if mode == "sentences":
        return sentence_batches(data.split(split).sentences, batch_size, eos, side=padding_side)
    if mode != "stream":
        raise ValueError(f"unknown evaluation mode {mode!r}; valid: stream, sentences")
    windows = evaluation_windows(data.split(split).ids, eos, window)
    # All windows but the last have one length: batch them, then the remainder alone.
    last_differs = windows[-1].numel() != windows[0].numel()
    groups = [windows[:-1], windows[-1:]] if last_differs else [windows]
    return [
        (torch.stack(group[i : i + batch_size]), None)
        for group in groups
        for i in range(0, len(group), batch_size)
    ]


@torch.no_grad()
def perplexity(
    model: nn.Module,
    data: LMData,
    split: str,
    *,
    mode: str = "stream",
    window: int = 128,
    batch_size: int = 16,
    padding_side: str = "right",
    stateful: bool = False,
) -> dict[str, float]:
    """Total NLL over every token of ``split`` (each predicted exactly once) and its ratios.

    ``stateful``: the model carries its state across consecutive windows of ``batch_size``
    contiguous streams (the stateful extension of the contract). The forward FLOPs per
    predicted token (``experiments.evaluation.flops``) and the mean NFE are measured on the same
    forward passes, every batch of the split (``flops_sample``).
    """
    if stateful:
        check_stateful(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    total_nll, total_tokens, total_flops, nfe, state = 0.0, 0, 0, [], None
    batches = evaluation_batches(
        data,
        split,
        mode=mode,
        window=window_length(model, window),
        batch_size=batch_size,
        padding_side=padding_side,
        stateful=stateful,
    )
    for tokens, mask in batches:
        tokens = tokens.to(device)
        mask = None if mask is None else mask.to(device)
        with counting_flops(model) as flops:
            if stateful:
                logits, aux = call_model(model, tokens[:, :-1], stateful=True, state=state)
                state = aux["state"]
            else:
                logits, aux = call_model(model, tokens, mask)
        nll, count = lm_nll(logits, tokens, mask)
        total_flops += flops()
        total_nll += float(nll)
        total_tokens += count
        if "nfe" in aux:
            nfe.append(float(aux["nfe"]))
    words = data.split(split).num_words
    return {
        "nll": total_nll,
        "tokens": total_tokens,
        "words": words,
        "ppl": math.exp(total_nll / total_tokens),
        "ppl_per_word": math.exp(total_nll / words),
        "nfe": sum(nfe) / len(nfe) if nfe else None,
        "flops_per_token": total_flops / total_tokens,
        "flops_batches": len(batches),
        "flops_sample": FLOPS_SAMPLE,
    }


def evaluate(
    model: nn.Module,
    data: LMData,
    split: str = "test",
    *,
    mode: str = "stream",
    window: int = 128,
    batch_size: int = 16,
    padding_side: str = "right",
    bleu_sentences: int = 200,
    continuation_sentences: int = 50,
    prompt_len: int = 3,
    decode: str = "greedy",
    allow_noncausal: bool = False,
    stateful: bool = False,
) -> dict[str, Any]:
    """Evaluate a contract model on one split of encoded data.

    Returns ``ppl`` (per token), ``ppl_per_word`` (total NLL / words), ``bleu_tf`` (the NODE-LM
    report's teacher-forced BLEU), ``bleu_cont`` (continuation BLEU after ``prompt_len``
    words, over ``continuation_sentences`` lines), ``tokens``, ``words``, ``seconds``, ``nfe`` (mean forward NFE when the model
    reports it), ``flops_per_token`` (forward FLOPs per predicted token, measured on the
    same forward passes as ``ppl`` and ``nfe``: every batch of the split), ``is_causal``
    and ``protocol``. BLEU uses the first ``bleu_sentences`` lines of the split (0 skips
    BLEU). ``mode`` is ``stream`` (BPTT-style windows of ``window``
    tokens) or ``sentences`` (each line alone, padded on ``padding_side``), matching how the
    model was trained; ``stateful`` carries a stateful model's state across the windows of
    ``batch_size`` contiguous streams.
    """
    from experiments.evaluation.bleu import continuation_bleu, teacher_forced_bleu

    is_causal = bool(getattr(model, "is_causal", False))
    if not is_causal and not allow_noncausal:
        raise NonCausalModelError(
            f"{type(model).__name__}.is_causal is False: its predictions can see the tokens they "
            "predict, so its perplexity is not a language-model perplexity. Pass "
            "allow_noncausal=True (--allow-noncausal) to report it labelled as such."
        )
    was_training = model.training
    model.eval()
    started = time.perf_counter()
    try:
        result: dict[str, Any] = perplexity(
            model,
            data,
            split,
            mode=mode,
            window=window,
            batch_size=batch_size,
            padding_side=padding_side,
            stateful=stateful,
        )
        sentences = [s for s in data.split(split).sentences if len(s) > 1][:bleu_sentences]
        tokenizer = data.tokenizer
        if sentences:
            result["bleu_tf"] = teacher_forced_bleu(
                model, sentences, tokenizer.id_to_token, tokenizer.eos_id
            )
            result["bleu_cont"] = continuation_bleu(
                model,
                sentences,
                tokenizer.id_to_token,
                tokenizer.eos_id,
                prompt_len=prompt_len,
                strategy=decode,
                max_sentences=continuation_sentences,
            )
        else:
            result["bleu_tf"] = result["bleu_cont"] = None
    finally:
        model.train(was_training)
    result.update(
        seconds=time.perf_counter() - started,
        is_causal=is_causal,
        protocol=data.protocol,
        split=split,
        mode=mode,
        tokenizer=tokenizer.kind,
    )
    if not is_causal:
        result["ppl_label"] = NONCAUSAL_LABEL
    return result


def evaluate_run(
    model: nn.Module,
    data: LMData,
    config: RunConfig,
    split: str = "test",
    *,
    allow_noncausal: bool = True,
) -> dict[str, Any]:
    """Evaluate as a run's config says: its batching, window, padding and ``eval.*`` settings.

    ``odelm train`` reports the test split through this; ``odelm eval`` too, after applying
    its command-line overrides to ``config.eval``.
    """
    return evaluate(
        model,
        data,
        split,
        **batching_options(config.data),
        bleu_sentences=config.eval.bleu_sentences,
        continuation_sentences=config.eval.continuation_sentences,
        prompt_len=config.eval.prompt_len,
        decode=config.eval.decode,
        allow_noncausal=allow_noncausal,
    )
