"""One decoding protocol for every language model of the library: greedy, sampling and beam
search, all through one cache-aware step function.

A model meets the contract ``logits, aux = model(tokens)``. It may also offer incremental
decoding with two methods: ``init_cache()`` returns an empty cache with ``reorder(index)``
(select batch rows), and ``next_token_logits(new_tokens, cache)`` returns the logits
``[B, V]`` after the cached sequence extended by ``new_tokens``, extending the cache in place
(the ODE Transformer LM does, with one key/value cache per RK stage).
[`StepFunction`][odelm.decoding.StepFunction] uses that when present and otherwise recomputes the
whole context every step. The context is the last ``model.max_positions`` tokens when the model
declares a limit: a cached model decodes incrementally while the sequence fits and recomputes the
cropped window once it does not, so cached and recomputed decoding see the same tokens and pick the
same ones.

The one ranking rule of beam search: every step extends each live hypothesis by every
token and keeps the ``num_beams`` best extensions by total log-probability (ties to the
lower beam, then the lower token id); an extension ending in ``eos_id`` is finished and
leaves the beam (it keeps its slot for that step). At the end the finished and the live
hypotheses are ranked by ``sum log p / n ** length_penalty`` with ``n`` the number of new
tokens (eos included): ``length_penalty=1`` (the default) ranks by mean log-probability per
token, ``0`` by total log-probability. ``num_beams=1`` is exactly greedy decoding.

This module is family-agnostic: it needs only the model contract
([`odelm.contract`][odelm.contract]), so both model packages and the harness use it.
[`decode_continuation`][odelm.decoding.decode_continuation] is the form continuation BLEU and
``odelm generate`` use.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F

from odelm.contract import LanguageModel, model_device
from odelm.errors import OdelmError
from odelm.invariance import evaluating

STRATEGIES = ("greedy", "sample", "beam")
MAX_NEW_TOKENS = 10_000
"""The most tokens one call generates: the output is returned whole, so a bound keeps a
typo such as ``max_new_tokens=1000000000`` from running for hours with nothing shown."""


MIN_TEMPERATURE = 1e-4
"""The lowest sampling temperature: at 1e-4 a logit gap of 0.01 is already 100 nats (odds of
1e43), so sampling is argmax in all but name; below it nothing changes but the risk, since
``logits / temperature`` overflows float32 (max 3.4e38) and a temperature under 1.2e-38
rounds to 0 (probabilities inf/nan)."""
MIN_TOP_P = 1e-6
"""The smallest nucleus: any ``top_p`` at most the likeliest token's probability (>= 1e-6
for vocabularies up to a million) keeps that token alone, like ``top_k=1``; a ``top_p``
under float32's smallest number rounds to 0 and drops every token (probabilities nan)."""
SEED_MAX = 2**64 - 1
"""The largest seed ``torch.Generator.manual_seed`` takes (seeds lie in 0..2**64-1)."""
BEAM_SCORE_BYTES = 32
"""Bytes per beam and vocabulary entry that every step of beam search holds: float64
log-probabilities and candidate scores, and the sort's float64 values and int64 indices."""


class DecodingError(OdelmError, ValueError):
    """Invalid decoding options or prompt."""


def check_temperature(value: float, label: str = "temperature") -> None:
    """Refuse a temperature that is not finite or is below
    [`MIN_TEMPERATURE`][odelm.decoding.MIN_TEMPERATURE]."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < MIN_TEMPERATURE:
        raise DecodingError(
            f"{label} = {value!r} is out of range; it must be a finite number >= "
            f"{MIN_TEMPERATURE} (a lower one samples the argmax anyway and can overflow "
            "float32; for the argmax use greedy decoding)"
        )


def check_top_p(value: float | None, label: str = "top_p") -> None:
    """Refuse a nucleus ``top_p`` outside ``[MIN_TOP_P, 1]`` (None: no nucleus)."""
    if value is not None and not (isinstance(value, (int, float)) and MIN_TOP_P <= value <= 1):
        raise DecodingError(
            f"{label} = {value!r} is out of range; it must be in [{MIN_TOP_P}, 1] (a smaller "
            "nucleus is the likeliest token alone, as top_k=1 gives)"
        )


def check_seed(value: int, label: str = "seed") -> None:
    """Refuse a sampling seed that is not an integer in ``0..2**64-1``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise DecodingError(
            f"{label} = {value!r} is out of range; it must be an integer in [0, 2**64-1 = "
            f"{SEED_MAX}]"
        )


def memory_bytes() -> int | None:
    """This process's memory: the machine's physical memory, capped by a cgroup limit
    (``memory.max``) or an address-space limit (``ulimit -v``) when one is set."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as handle:
            limits.append(int(handle.read().strip()))
    except (OSError, ValueError):  # no cgroup v2, or "max"
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) if limits else None


def check_beam_memory(
    model: LanguageModel,
    num_beams: int,
    rows: int,
    length: int,
    label: str = "num_beams",
    use_cache: bool = True,
) -> None:
    """Refuse ``num_beams`` when beam search would need more memory than this process has.

    The estimate is a lower bound (a model's own cache and activations come on top), per
    beam and row: the vocabulary times [`BEAM_SCORE_BYTES`][odelm.decoding.BEAM_SCORE_BYTES], the
    token ids (int64, copied as they grow), and, for a model that recomputes its context every step,
    its float32 logits over the whole sequence (vocabulary x ``length`` x 4 bytes). A model
    without ``vocab_size`` is not estimated.
    """
    vocab, memory = getattr(model, "vocab_size", None), memory_bytes()
    if not isinstance(vocab, int) or memory is None:
        return
    limit = getattr(model, "max_positions", None)
    sequence = min(length, limit) if limit else length
    cached = use_cache and callable(getattr(model, "next_token_logits", None))
    per_beam = rows * (vocab * (BEAM_SCORE_BYTES + (0 if cached else 4 * sequence)) + 16 * length)
    if num_beams * per_beam <= memory:
        return
    logits = "" if cached else f" + {sequence} tokens x 4 bytes of logits"
    raise DecodingError(
        f"{label} = {num_beams} is out of range; it must be in [1, {memory // per_beam}] "
        f"here: beam search needs at least {num_beams * per_beam / 2**30:,.3g} GiB (beams x "
        f"{rows} row(s) x (vocabulary {vocab} x ({BEAM_SCORE_BYTES} bytes of scores{logits}) "
        f"+ {length} tokens x 16 bytes)) and the memory here is {memory / 2**30:,.1f} GiB"
    )


class StepFunction:
    """Next-token logits ``[B, V]`` for a growing batch of sequences, cached when possible.

    Call it with the whole sequence so far (``[B, T]``, the prompt on the first call); it
    feeds the model only what the cache has not seen. ``reorder(index)`` follows beam
    search's row selection.
    """

    def __init__(self, model: LanguageModel, use_cache: bool = True, progress: Any = None) -> None:
        self.model: Any = model
        self.progress = progress  # called with the sequence length before each step
        self.limit: int | None = getattr(model, "max_positions", None)
        self.cached = use_cache and all(
            callable(getattr(model, name, None)) for name in ("init_cache", "next_token_logits")
        )
        self.cache: Any = None
        self.fed = 0  # tokens of the sequence the cache holds (when it is not a cropped window)

    def __call__(self, sequence: torch.Tensor) -> torch.Tensor:
        if self.progress is not None:
            self.progress(sequence.shape[1])
        window = sequence if self.limit is None else sequence[:, -self.limit :]
        if not self.cached:
            output = self.model(window)
            logits = output[0] if isinstance(output, tuple) else output
            return logits[:, -1]
        if self.cache is None or window.shape[1] < sequence.shape[1]:
            self.cache = self.model.init_cache()  # (re)start over the cropped window
            new = window
        else:
            new = sequence[:, self.fed :]
        self.fed = sequence.shape[1]
        return self.model.next_token_logits(new, self.cache)

    def reorder(self, index: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(index)


@torch.no_grad()
def generate(
    model: LanguageModel,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    strategy: str = "greedy",
    num_beams: int = 4,
    length_penalty: float = 1.0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    batch_invariant: bool = True,
    progress: Any = None,
) -> torch.Tensor:
    """Continue ``prompt_ids`` [B, P]; returns the prompt followed by the new tokens.

    ``strategy``: ``"greedy"`` (argmax), ``"sample"`` (from ``softmax(logits / temperature)``
    restricted to the ``top_k`` tokens and the ``top_p`` nucleus, drawn with ``generator``)
    or ``"beam"`` (the ranking rule in the module docstring). With ``eos_id`` a finished row
    is padded with it, and decoding stops once every row has finished. ``use_cache=False``
    recomputes the context every step (the reference the cache is checked against).
    ``batch_invariant`` (the default): adaptive solves step each row (and beam) on its own
    ([`odelm.invariance`][odelm.invariance]), so a row's tokens do not depend on its batch;
    False solves the batch together, as training does. The model runs in eval mode and gets
    its training mode back afterwards. The prompt is moved to the model's device; a sampling ``generator`` must be on a device of the same type.
    ``progress(length)``, given, is called before each step with the sequence's length.
    """
    _check_options(strategy, max_new_tokens, num_beams, temperature, top_k, top_p)
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.shape[1] < 1:
        shape = tuple(prompt_ids.shape) if isinstance(prompt_ids, torch.Tensor) else prompt_ids
        raise DecodingError(f"prompt_ids must be a LongTensor [batch, P] with P >= 1, got {shape}")
    device = model_device(model)
    prompt_ids = prompt_ids.to(device)  # the new tokens are made on the prompt's device
    if strategy == "sample" and generator is not None and generator.device.type != device.type:
        raise DecodingError(
            f"the generator is on {generator.device} but the model on {device}; make it "
            f"there: torch.Generator(device={str(device)!r}).manual_seed(seed)"
        )
    with evaluating(model, batch_invariant):
        step = StepFunction(model, use_cache, progress)
        if strategy == "beam":
            rows, length = prompt_ids.shape[0], prompt_ids.shape[1] + max_new_tokens
            check_beam_memory(model, num_beams, rows, length, use_cache=step.cached)
            return _beam_search(step, prompt_ids, max_new_tokens, num_beams, length_penalty, eos_id)
        sample = strategy == "sample"
        return _one_by_one(
            step, prompt_ids, max_new_tokens, eos_id, sample, temperature, top_k, top_p, generator
        )


def _check_options(
    strategy: str,
    max_new_tokens: int,
    num_beams: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> None:
    if strategy not in STRATEGIES:
        raise DecodingError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not isinstance(max_new_tokens, int) or not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise DecodingError(
            f"max_new_tokens must be an integer in [0, {MAX_NEW_TOKENS}], got {max_new_tokens!r}"
        )
    check_temperature(temperature)
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise DecodingError(f"top_k must be a positive integer or None, got {top_k!r}")
    check_top_p(top_p)
    if not isinstance(num_beams, int) or num_beams < 1:
        raise DecodingError(f"num_beams must be a positive integer, got {num_beams!r}")


def _one_by_one(
    step: StepFunction,
    prompt: torch.Tensor,
    max_new_tokens: int,
    eos_id: int | None,
    sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Greedy or sampled decoding, one token per step."""
    sequence = prompt
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        logits = step(sequence)
        if sample:
            probs = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
            next_token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            next_token = logits.argmax(dim=-1)
        if eos_id is not None:
            next_token = torch.where(finished, eos_id, next_token)
            finished |= next_token == eos_id
        sequence = torch.cat([sequence, next_token[:, None].to(sequence.dtype)], dim=1)
        if eos_id is not None and bool(finished.all()):
            break
    return sequence


def _beam_search(
    step: StepFunction,
    prompt: torch.Tensor,
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float,
    eos_id: int | None,
) -> torch.Tensor:
    """The library's one beam search (ranking rule: module docstring); best hypothesis per row."""
    B, K, P = prompt.shape[0], num_beams, prompt.shape[1]
    sequence = prompt.repeat_interleave(K, dim=0)  # [B*K, P + steps]; dead slots ride along
    scores = torch.full((B, K), float("-inf"), dtype=torch.float64, device=prompt.device)
    scores[:, 0] = 0.0  # all beams start equal: keep one so the first step has no duplicates
    finished: list[list[tuple[list[int], float, int]]] = [[] for _ in range(B)]
    offsets = torch.arange(B, device=prompt.device)[:, None] * K
    for _ in range(max_new_tokens):
        log_probs = F.log_softmax(step(sequence).double(), dim=-1)  # [B*K, V]
        V = log_probs.shape[1]
        candidates = (scores.reshape(B * K, 1) + log_probs).reshape(B, K * V)
        order = candidates.sort(dim=1, descending=True, stable=True)
        scores, flat = order.values[:, :K].clone(), order.indices[:, :K]
        source = (offsets + flat // V).reshape(-1)
        next_token = (flat % V).reshape(-1)
        sequence = torch.cat([sequence[source], next_token[:, None].to(sequence.dtype)], dim=1)
        step.reorder(source)
        if eos_id is not None:
            ended = (flat % V == eos_id) & torch.isfinite(scores)
            for b, k in ended.nonzero().tolist():
                new = sequence[b * K + k, P:].tolist()
                finished[b].append((new, float(scores[b, k]), len(new)))
            scores[ended] = float("-inf")
        if not bool(torch.isfinite(scores).any()):
            break
    rows = []
    for b in range(B):
        live = [
            (sequence[b * K + k, P:].tolist(), float(scores[b, k]), sequence.shape[1] - P)
            for k in range(K)
            if torch.isfinite(scores[b, k])
        ]
        best = max(finished[b] + live, key=lambda c: c[1] / max(c[2], 1) ** length_penalty)
        rows.append(prompt[b].tolist() + best[0])
    width = max(len(row) for row in rows)
    pad = eos_id if eos_id is not None else 0  # rows differ in length only when eos ended one
    return prompt.new_tensor([row + [pad] * (width - len(row)) for row in rows])


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


def decode_continuation(
    model: LanguageModel,
    prompt: torch.Tensor,
    max_new_tokens: int,
    strategy: str = "greedy",
    num_beams: int = 4,
    eos_id: int | None = None,
    **options: Any,
) -> list[int]:
    """New tokens after ``prompt`` [1, P] (at most ``max_new_tokens``, cut before the first eos).

    The prompt is cropped to the model's context (``max_positions``) like every other path;
    ``options`` go to [`generate`][odelm.decoding.generate] (``temperature``, ``top_k``, ``top_p``,
    ``generator``, ``length_penalty``, ``use_cache``).
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
