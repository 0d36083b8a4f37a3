"""``evaluate(model, data, split, settings=...)``: perplexity, BLEU, NFE, FLOPs, timing: a
model's metrics on one split (a run's test, ``odelm eval``; loading a finished run is
``experiments.evaluation``'s).

Everything goes through the model contract. A model whose ``is_causal`` is False sees the
tokens it predicts, so its perplexity is not a language-model perplexity: ``evaluate``
refuses to report one unless ``allow_noncausal=True``, and then labels it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch
from torch import nn

from experiments.data.batching import lm_nll
from experiments.data.tokenization import LMData
from experiments.models.flops import counting_flops
from experiments.training.datamodule import EvalSettings, evaluation_batches
from odelm.contract import call_model, check_stateful
from odelm.errors import OdelmError
from odelm.invariance import evaluating, rows_alone

FLOPS_SAMPLE = "every batch of the split, the forward passes of the perplexity and NFE"
NONCAUSAL_LABEL = "non-causal (reconstruction) perplexity: not a valid language-model perplexity"


class NonCausalModelError(OdelmError, ValueError):
    """A plain perplexity was asked of a model that can see the tokens it predicts."""


def window_length(model: nn.Module, requested: int) -> int:
    """The evaluation window, cropped to the model's positions (one is the context token)."""
    limit = getattr(model, "max_positions", None)
    return min(requested, limit - 1) if limit else requested


@torch.no_grad()
def perplexity(
    model: nn.Module,
    data: LMData,
    split: str,
    settings: EvalSettings = EvalSettings(),
    *,
    batch_invariant: bool = True,
) -> dict[str, Any]:
    """Total NLL over every token of ``split`` (each predicted exactly once) and its ratios.

    ``settings.stateful``: the model carries its state across consecutive windows of
    ``eval_batch_size`` contiguous streams (the stateful extension of the contract). The forward
    FLOPs per predicted token (``experiments.models.flops``) and the mean NFE are
    measured on the same forward passes, every batch of the split (``flops_sample``).
    ``batch_invariant`` (the default): an adaptive solve steps each row on its own
    ([`odelm.invariance`][odelm.invariance]), so a sentence's score does not depend on its
    batch; False: one shared solve per batch, as the test evaluation that ends training.
    """
    if settings.stateful:
        check_stateful(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    total_nll, total_tokens, total_flops, nfe, state = 0.0, 0, 0, [], None
    window = window_length(model, settings.eval_window)
    batches = evaluation_batches(data, split, dataclasses.replace(settings, eval_window=window))
    for tokens, mask in batches:
        tokens = tokens.to(device)
        mask = None if mask is None else mask.to(device)
        with counting_flops(model) as flops, rows_alone(model, batch_invariant):
            if settings.stateful:
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
        **excess_loss(total_nll, total_tokens, data.reference_nll.get(split), settings),
        "nfe": sum(nfe) / len(nfe) if nfe else None,
        "flops_per_token": total_flops / total_tokens,
        "flops_batches": len(batches),
        "flops_sample": FLOPS_SAMPLE,
    }


CUT_SENTENCES_NOTE = (
    "stream windows start mid-sentence without the sentence's start, which no model can "
    "know, so the true grammar's NLL is below what any model can reach here: evaluate "
    "with data.batching: sentences for an excess that is 0 for the true grammar"
)


def excess_loss(
    nll: float, tokens: int, reference: float | None, settings: EvalSettings
) -> dict[str, Any]:
    """For a generated corpus (``reference``: the true grammar's exact total NLL of the
    split): the true NLL per token, the excess loss (model minus true, nats per token) and
    the ratio of the perplexities; nothing for other corpora. Every token is predicted once,
    so both NLLs cover the same tokens."""
    if reference is None:
        return {}
    excess = (nll - reference) / tokens
    out: dict[str, Any] = {
        "true_nll_per_token": reference / tokens,
        "excess_nll_per_token": excess,
        "ppl_ratio": math.exp(excess),
    }
    if settings.batching == "stream" and not settings.stateful:
        out["excess_note"] = CUT_SENTENCES_NOTE
    return out


def evaluate(
    model: nn.Module,
    data: LMData,
    split: str = "test",
    *,
    settings: EvalSettings = EvalSettings(),
    allow_noncausal: bool = False,
    batch_invariant: bool = True,
) -> dict[str, Any]:
    """Evaluate a contract model on one split of encoded data, batched and decoded as
    ``settings`` say (a run's: ``EvalSettings.from_config(config)``).

    Returns ``ppl`` (per token), ``ppl_per_word`` (total NLL / words), ``bleu_tf`` (the NODE-LM
    report's teacher-forced BLEU), ``bleu_cont`` (continuation BLEU after ``prompt_len``
    words, over ``continuation_sentences`` lines), ``tokens``, ``words``, ``seconds``, ``nfe``
    (mean forward NFE when the model reports it), ``flops_per_token`` (forward FLOPs per
    predicted token, measured on the same forward passes as ``ppl`` and ``nfe``: every batch
    of the split), ``is_causal`` and ``protocol``. BLEU uses the first ``bleu_sentences``
    lines of the split (0 skips BLEU). ``batch_invariant``: as
    [`perplexity`][experiments.training.metrics.perplexity]'s, for BLEU's decoding too.
    """
    from experiments.models.bleu import continuation_bleu, teacher_forced_bleu

    is_causal = bool(getattr(model, "is_causal", False))
    if not is_causal and not allow_noncausal:
        raise NonCausalModelError(
            f"{type(model).__name__}.is_causal is False: its predictions can see the tokens they "
            "predict, so its perplexity is not a language-model perplexity. Pass "
            "allow_noncausal=True (--allow-noncausal) to report it labelled as such."
        )
    started = time.perf_counter()
    with evaluating(model, batch_invariant):
        result: dict[str, Any] = perplexity(
            model, data, split, settings, batch_invariant=batch_invariant
        )
        sentences = [s for s in data.split(split).sentences if len(s) > 1]
        sentences = sentences[: settings.bleu_sentences]
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
                prompt_len=settings.prompt_len,
                strategy=settings.decode,
                max_sentences=settings.continuation_sentences,
                batch_invariant=batch_invariant,
            )
        else:
            result["bleu_tf"] = result["bleu_cont"] = None
    result.update(
        seconds=time.perf_counter() - started,
        is_causal=is_causal,
        protocol=data.protocol,
        split=split,
        mode=settings.batching,
        tokenizer=tokenizer.kind,
    )
    if not is_causal:
        result["ppl_label"] = NONCAUSAL_LABEL
    return result
