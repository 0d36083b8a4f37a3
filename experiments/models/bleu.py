"""BLEU for language models, computed with ``nltk.translate.bleu_score`` only.

Two protocols over test sentences (token ids, each ending with the eos id):

- teacher-forced BLEU (the NODE-LM report's): the model reads ``[eos] + sentence[:-1]`` and
  its argmax prediction at every position is the hypothesis for the sentence;
- continuation BLEU: the model is prompted with ``[eos] + sentence[:k]`` and decodes the rest,
  which is scored against ``sentence[k:-1]``.

Both drop eos tokens before scoring and are corpus-level.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu

from odelm.contract import call_model
from odelm.decoding import decode_continuation
from odelm.errors import OdelmError


class NoContinuationSentencesError(OdelmError, ValueError):
    """No sentence is long enough to continue after the prompt."""


def corpus_bleu_score(
    references: list[list[str]], hypotheses: list[list[str]], max_n: int = 4, smooth: bool = True
) -> float:
    """Corpus BLEU in [0, 1] of tokenized hypotheses against one reference each.

    ``smooth`` applies NLTK's ``method1`` (an epsilon of 0.1 for n-gram orders with no match),
    so that a corpus with no matching 4-gram scores above 0; unsmoothed BLEU is 0 then.
    NLTK counts a hypothesis with fewer than n words as one order-n n-gram (its precision
    denominator is ``max(1, count)``), so short sentences pull even a perfect corpus below 1;
    sacrebleu counts none. With every hypothesis at least ``max_n`` words long they agree.
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not hypotheses:
        raise ValueError("BLEU of an empty corpus is undefined; pass at least one pair")
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    smoothing = SmoothingFunction().method1 if smooth else SmoothingFunction().method0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NLTK warns about orders with zero matches
        score = corpus_bleu(
            [[ref] for ref in references],
            hypotheses,
            weights=(1.0 / max_n,) * max_n,
            smoothing_function=smoothing,
        )
    return float(score)


def _device(model: Any) -> torch.device:
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter.device if parameter is not None else torch.device("cpu")


def _check_sentences(sentences: Sequence[Sequence[int]], eos_id: int) -> None:
    for index, sentence in enumerate(sentences):
        if len(sentence) == 0 or sentence[-1] != eos_id:
            raise ValueError(f"sentence {index} does not end with the eos id {eos_id}: {sentence}")


def _windowed_argmax(model: Any, ids: list[int], limit: int, device: torch.device) -> list[int]:
    """Argmax predictions for a sequence longer than ``limit``: the first window whole, then
    windows advanced by ``limit // 2``, so every prediction sees at least half a window."""
    out: list[int] = []
    position, stride = 0, max(1, limit // 2)
    while position < len(ids):
        end = min(len(ids), limit if position == 0 else position + stride)
        start = max(0, end - limit)
        logits, _ = call_model(model, torch.tensor([ids[start:end]], device=device))
        out += logits[0, position - start :].argmax(-1).tolist()
        position = end
    return out


@torch.no_grad()
def teacher_forced_predictions(
    model: Any, sentences: Sequence[Sequence[int]], eos_id: int, batch_size: int = 32
) -> list[list[int]]:
    """Argmax next-token predictions for ``[eos] + sentence[:-1]``, one per sentence position.

    Sentences of similar length are batched with right padding, which a causal model's
    predictions at real positions never see; a non-causal model only gets batches of equal
    lengths (no padding at all). Sequences beyond ``model.max_positions`` use sliding windows.
    """
    _check_sentences(sentences, eos_id)
    inputs = [[eos_id, *sentence[:-1]] for sentence in sentences]
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    groups: list[list[int]] = []
    causal = getattr(model, "is_causal", False)
    for i in order:
        last = groups[-1] if groups else []
        if 0 < len(last) < batch_size and (causal or len(inputs[last[0]]) == len(inputs[i])):
            last.append(i)
        else:
            groups.append([i])
    device, limit = _device(model), getattr(model, "max_positions", None)
    predictions: list[list[int]] = [[] for _ in inputs]
    for group in groups:
        width = max(len(inputs[i]) for i in group)
        if limit is not None and width > limit:
            for i in group:
                predictions[i] = _windowed_argmax(model, inputs[i], limit, device)
            continue
        rows = [inputs[i] + [eos_id] * (width - len(inputs[i])) for i in group]
        logits, _ = call_model(model, torch.tensor(rows, device=device))
        for row, i in zip(logits.argmax(-1).tolist(), group):
            predictions[i] = row[: len(inputs[i])]
    return predictions


def teacher_forced_bleu(
    model: Any,
    sentences: Sequence[Sequence[int]],
    id_to_token: Callable[[int], str],
    eos_id: int,
    batch_size: int = 32,
) -> float:
    """Corpus BLEU of the argmax predictions against the sentences (the NODE-LM protocol)."""
    predictions = teacher_forced_predictions(model, sentences, eos_id, batch_size)
    references = [[id_to_token(i) for i in s if i != eos_id] for s in sentences]
    hypotheses = [[id_to_token(i) for i in p if i != eos_id] for p in predictions]
    return corpus_bleu_score(references, hypotheses)


def continuation_bleu(
    model: Any,
    sentences: Sequence[Sequence[int]],
    id_to_token: Callable[[int], str],
    eos_id: int,
    prompt_len: int = 3,
    strategy: str = "greedy",
    num_beams: int = 4,
    max_sentences: int | None = None,
    batch_invariant: bool = True,
) -> float:
    """Corpus BLEU of decoded continuations of the first ``prompt_len`` tokens of each sentence.

    Sentences with fewer than ``prompt_len + 1`` words are skipped; each continuation may run
    two tokens past the reference length before it is cut. ``batch_invariant``: as
    [`odelm.decoding.generate`][odelm.decoding.generate]'s.
    """
    _check_sentences(sentences, eos_id)
    eligible = [s for s in sentences if len(s) - 1 >= prompt_len + 1][:max_sentences]
    if not eligible:
        raise NoContinuationSentencesError(
            f"no sentence among the first BLEU sentences has more than prompt_len={prompt_len} "
            "words; lower eval.prompt_len or raise eval.bleu_sentences"
        )
    device = _device(model)
    references, hypotheses = [], []
    for sentence in eligible:
        prompt = torch.tensor([[eos_id, *sentence[:prompt_len]]], device=device)
        budget = len(sentence) - 1 - prompt_len + 2
        new = decode_continuation(
            model, prompt, budget, strategy, num_beams, eos_id, batch_invariant=batch_invariant
        )
        references.append([id_to_token(i) for i in sentence[prompt_len:-1]])
        hypotheses.append([id_to_token(i) for i in new if i != eos_id])
    return corpus_bleu_score(references, hypotheses)
