"""BLEU against sacrebleu, both BLEU protocols on oracle models, and the decoders' optimality."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import sacrebleu
import torch
from torch import nn

from experiments.models.bleu import (
    continuation_bleu,
    corpus_bleu_score,
    teacher_forced_bleu,
    teacher_forced_predictions,
)
from odelm.decoding import DecodingError, decode_continuation, generate

EOS = 0
WORDS = ["<eos>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "<zz>"]
WRONG = len(WORDS) - 1  # the oracle's answer for a prefix it does not know


class PrefixOracle(nn.Module):
    """Puts all mass on the true next token of a known sentence given the whole prefix."""

    is_causal = True

    def __init__(self, sentences: list[list[int]], max_positions: int | None = None) -> None:
        super().__init__()
        self.table = {tuple([EOS, *s][: t + 1]): s[t] for s in sentences for t in range(len(s))}
        self.seen: list[tuple[int, ...]] = []
        if max_positions is not None:
            self.max_positions = max_positions

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        self.seen.append(tuple(tokens.shape))
        logits = torch.full((*tokens.shape, len(WORDS)), -30.0)
        for b, row in enumerate(tokens.tolist()):
            for t in range(len(row)):
                logits[b, t, self.table.get(tuple(row[: t + 1]), WRONG)] = 0.0
        return logits, {}


class Bigram(nn.Module):
    """``logits[b, t] = log P[tokens[b, t]]`` for a row-stochastic table ``P``."""

    is_causal = True

    def __init__(self, probs: torch.Tensor, max_positions: int | None = None) -> None:
        super().__init__()
        self.log_p = probs.clamp_min(1e-12).log()
        self.max_positions = max_positions

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        if self.max_positions is not None:
            assert tokens.shape[1] <= self.max_positions, "decoder did not crop the context"
        return self.log_p[tokens], {}


class TinyGRU(nn.Module):
    """A random causal LM whose predictions depend on the whole prefix."""

    is_causal = True

    def __init__(self, vocab: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.rnn = nn.Embedding(vocab, 8), nn.GRU(8, 16, batch_first=True)
        self.out = nn.Linear(16, vocab)
        with torch.no_grad():
            self.out.weight.mul_(8.0)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return self.out(self.rnn(self.embed(tokens))[0]), {}


def _log_prob(model: nn.Module, prompt: list[int], new: list[int]) -> float:
    """Exact ``log p(new | prompt)`` by teacher forcing."""
    tokens = torch.tensor([prompt + new])
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens)[0][0].double(), -1)
    return sum(float(logp[len(prompt) - 1 + k, tok]) for k, tok in enumerate(new))


# ---------------------------------------------------------------- corpus BLEU vs sacrebleu


def _pairs(seed: int, n: int, drop: float, insert: float, min_len: int = 0) -> tuple[list, list]:
    """``n`` random reference/hypothesis pairs with overlap; hypotheses of >= ``min_len`` words."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(12)]
    refs, hyps = [], []
    while len(refs) < n:
        ref = [rng.choice(vocab) for _ in range(rng.randint(2, 25))]
        hyp = []
        for word in ref:
            r = rng.random()
            if r < drop:
                continue
            hyp.append(rng.choice(vocab) if r < drop + 0.2 else word)
            if rng.random() < insert:
                hyp.append(rng.choice(vocab))
        if len(hyp) >= min_len:
            refs.append(ref)
            hyps.append(hyp)
    return refs, hyps


def _sacrebleu(refs: list, hyps: list) -> sacrebleu.metrics.bleu.BLEUScore:
    return sacrebleu.corpus_bleu(
        [" ".join(h) for h in hyps],
        [[" ".join(r) for r in refs]],
        tokenize="none",
        smooth_method="none",
        force=True,
    )


@pytest.mark.parametrize("seed,drop,insert", [(0, 0.15, 0.0), (1, 0.0, 0.3), (2, 0.3, 0.1)])
def test_unsmoothed_bleu_matches_sacrebleu(seed, drop, insert):
    # Same definition on both sides when every hypothesis has >= 4 words: clipped n-gram
    # matches and n-gram totals summed over the corpus, brevity penalty exp(1 - r/c) from total
    # lengths (one reference, so NLTK's "closest reference length" is the reference length).
    # They differ only in float rounding (sacrebleu works in percent): tolerance 1e-9.
    refs, hyps = _pairs(seed, 48, drop, insert, min_len=4)
    ours = corpus_bleu_score(refs, hyps, smooth=False)
    theirs = _sacrebleu(refs, hyps)
    assert 0.05 < ours < 0.95
    assert ours == pytest.approx(theirs.score / 100, abs=1e-9)
    brevity = sum(map(len, hyps)) < sum(map(len, refs))
    assert (theirs.bp < 1.0) == brevity  # both branches of the brevity penalty are exercised


def test_short_hypotheses_explain_the_only_difference_from_sacrebleu():
    # NLTK's modified precision divides by max(1, number of hypothesis n-grams), so each
    # hypothesis with fewer than n words adds 1 to the order-n total; sacrebleu adds 0. With
    # that correction applied to sacrebleu's own counts the two agree to 1e-9 again.
    refs, hyps = _pairs(4, 60, 0.3, 0.0)
    refs.append(["w1", "w2"])
    hyps.append([])
    short = [sum(len(h) < n for h in hyps) for n in range(1, 5)]
    assert short[0] >= 1 and short[3] > short[0]  # empty and short hypotheses present
    theirs = _sacrebleu(refs, hyps)
    log_p = [math.log(m / (t + s)) for m, t, s in zip(theirs.counts, theirs.totals, short)]
    corrected = theirs.bp * math.exp(sum(log_p) / 4)
    ours = corpus_bleu_score(refs, hyps, smooth=False)
    assert ours == pytest.approx(corrected, abs=1e-9)
    assert 0 < theirs.score / 100 - ours < 0.05


def test_perfect_hypotheses_score_one_and_bad_input_is_rejected():
    refs, _ = _pairs(3, 30, 0.0, 0.0, min_len=4)
    assert corpus_bleu_score(refs, refs) == pytest.approx(1.0, abs=1e-12)
    assert corpus_bleu_score(refs, refs, smooth=False) == pytest.approx(1.0, abs=1e-12)
    # The NLTK convention above: one perfect 2-word pair adds 1 to the 3- and 4-gram totals.
    totals = [sum(max(0, len(r) - n + 1) for r in refs) for n in (3, 4)]
    expected = (totals[0] / (totals[0] + 1) * totals[1] / (totals[1] + 1)) ** 0.25
    with_short = [*refs, ["w1", "w2"]]
    assert corpus_bleu_score(with_short, with_short) == pytest.approx(expected, abs=1e-12)
    no_overlap = [["x"] * len(r) for r in refs]
    assert corpus_bleu_score(refs, no_overlap, smooth=False) == 0.0
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        corpus_bleu_score([["a"], ["b"]], [["a"]])


# ---------------------------------------------------------------- the two BLEU protocols

SENTENCE = [1, 5, 3, 4, 5, 6, 8, 9, EOS]


def test_oracle_scores_one_on_both_protocols():
    oracle = PrefixOracle([SENTENCE])
    assert teacher_forced_bleu(oracle, [SENTENCE], WORDS.__getitem__, EOS) == 1.0
    for prompt_len in (1, 2, 3):  # continuations of >= 4 words, so perfect is exactly 1
        for strategy in ("greedy", "beam"):
            args = (oracle, [SENTENCE], WORDS.__getitem__, EOS, prompt_len, strategy, 3)
            assert continuation_bleu(*args) == 1.0


def test_teacher_forcing_isolates_a_single_error():
    # The oracle errs at one prefix; teacher forcing feeds the true token next, so exactly one
    # hypothesis token differs, and the score equals BLEU of that hand-made hypothesis.
    oracle = PrefixOracle([SENTENCE])
    oracle.table[(EOS, 1, 5, 3)] = 8
    assert teacher_forced_predictions(oracle, [SENTENCE], EOS) == [[1, 5, 3, 8, 5, 6, 8, 9, EOS]]
    ref = [WORDS[i] for i in SENTENCE[:-1]]
    hyp = [*ref[:3], "ran", *ref[4:]]
    expected = corpus_bleu_score([ref], [hyp])
    assert 0.3 < expected < 1.0
    assert teacher_forced_bleu(oracle, [SENTENCE], WORDS.__getitem__, EOS) == pytest.approx(
        expected
    )


class Recorder(TinyGRU):
    """Records input shapes; declared non-causal to exercise the no-padding path."""

    is_causal = False

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        self.seen.append(tuple(tokens.shape))
        return super().forward(tokens)


@pytest.mark.parametrize("causal", [True, False])
def test_batched_predictions_equal_one_sentence_at_a_time(causal):
    rng = random.Random(5)
    lengths = [rng.randint(3, 12) for _ in range(11)] + [5, 5, 5]
    sentences = [[rng.randint(1, 10) for _ in range(n)] + [EOS] for n in lengths]
    model = (TinyGRU if causal else Recorder)(len(WORDS), seed=1).eval()
    model.seen = []
    batched = teacher_forced_predictions(model, sentences, EOS, batch_size=3)
    if not causal:  # equal lengths only: groups of <= 3 per distinct length, no padding
        per_length = {n: lengths.count(n) for n in set(lengths)}
        expected = [(min(3, c - k), n + 1) for n, c in per_length.items() for k in range(0, c, 3)]
        assert sorted(model.seen) == sorted(expected)
    assert batched == teacher_forced_predictions(model, sentences, EOS, batch_size=1)
    assert [len(p) for p in batched] == [n + 1 for n in lengths]


def test_long_sentences_use_windows_within_max_positions():
    probs = torch.full((11, 11), 0.01)
    probs[torch.arange(10), torch.tensor([2, 3, 4, 5, 6, 7, 8, 9, 1, 0])] = 1.0  # a cycle
    sentence = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, EOS]
    full = teacher_forced_predictions(Bigram(probs), [sentence], EOS)
    windowed = teacher_forced_predictions(Bigram(probs, max_positions=4), [sentence], EOS)
    assert windowed == full and len(full[0]) == len(sentence)


def test_sentences_must_end_with_eos():
    with pytest.raises(ValueError, match="sentence 1 does not end with the eos id 0"):
        teacher_forced_bleu(PrefixOracle([SENTENCE]), [[1, EOS], [2, 3]], WORDS.__getitem__, EOS)


# ---------------------------------------------------------------- decoders


def greedy_decode(model, prompt, max_new_tokens, eos_id=None):
    return decode_continuation(model, prompt, max_new_tokens, "greedy", eos_id=eos_id)


def beam_search(model, prompt, max_new_tokens, num_beams=4, eos_id=None, length_penalty=1.0):
    return decode_continuation(
        model, prompt, max_new_tokens, "beam", num_beams, eos_id, length_penalty=length_penalty
    )


def _myopic() -> torch.Tensor:
    """From <eos>: A=1 (0.6) or B=2 (0.4); after A four tokens tie at 0.25, after B one has
    0.9; then <eos>. Greedy takes A (0.6 * 0.25 = 0.15); the best sequence is B C (0.36)."""
    probs = torch.zeros(7, 7)
    probs[EOS, 1], probs[EOS, 2] = 0.6, 0.4
    probs[1, 3:7] = 0.25
    probs[2, 3], probs[2, 4] = 0.9, 0.1
    probs[3:7, EOS] = 1.0
    return probs


def test_beam_search_beats_myopic_greedy():
    model, prompt = Bigram(_myopic()), torch.tensor([[EOS]])
    greedy = greedy_decode(model, prompt, 5, eos_id=EOS)
    beam = beam_search(model, prompt, 5, num_beams=2, eos_id=EOS)
    assert greedy == [1, 3] and beam == [2, 3]
    assert math.exp(_log_prob(model, [EOS], greedy + [EOS])) == pytest.approx(0.15)
    assert math.exp(_log_prob(model, [EOS], beam + [EOS])) == pytest.approx(0.36)
    assert beam_search(model, prompt, 5, num_beams=1, eos_id=EOS) == greedy


@pytest.mark.parametrize("seed", range(4))
def test_one_beam_is_greedy_and_wide_beam_is_exact(seed):
    model, vocab, steps = TinyGRU(4, seed).eval(), 4, 3
    prompt = torch.tensor([[EOS, 1 + seed % 3]])
    greedy = greedy_decode(model, prompt, 12, eos_id=EOS)
    assert beam_search(model, prompt, 12, num_beams=1, eos_id=EOS) == greedy
    # With a beam wider than the search space, beam search with length_penalty=0 returns the
    # most probable sequence among all that end in eos or reach the step limit.
    best = max(
        (
            list(seq[: seq.index(EOS)]) if EOS in seq else list(seq)
            for seq in itertools.product(range(vocab), repeat=steps)
        ),
        key=lambda new: _log_prob(model, prompt[0].tolist(), new + [EOS] * (len(new) < steps)),
    )
    assert (
        beam_search(model, prompt, steps, num_beams=vocab**steps, eos_id=EOS, length_penalty=0)
        == best
    )


def test_decoders_crop_context_to_max_positions():
    probs = torch.full((11, 11), 0.01)
    probs[torch.arange(11), (torch.arange(11) % 9) + 1] = 1.0  # i -> i % 9 + 1, never <eos>
    model, prompt = Bigram(probs, max_positions=3), torch.tensor([[EOS, 1, 2, 3, 4]])
    expected = [5, 6, 7, 8, 9, 1, 2, 3]
    assert greedy_decode(model, prompt, 8) == expected
    assert beam_search(model, prompt, 8, num_beams=3) == expected


class CachedBigram(Bigram):
    """A bigram model that also offers the incremental step (a cache of nothing but a count)."""

    class Cache:  # a bigram needs no past; the cache only has to follow the beams
        def reorder(self, index: torch.Tensor) -> None:
            assert index.dim() == 1

    def init_cache(self) -> Cache:
        return self.Cache()

    def next_token_logits(self, tokens: torch.Tensor, cache: Cache) -> torch.Tensor:
        self.steps.append(tuple(tokens.shape))
        return self.log_p[tokens[:, -1]]


def test_decode_continuation_uses_the_cached_step_and_matches_recomputation():
    probs = torch.full((11, 11), 0.01)
    probs[torch.arange(11), (torch.arange(11) % 9) + 1] = 1.0
    model, prompt = CachedBigram(probs, max_positions=6), torch.tensor([[EOS, 1, 2]])
    for strategy in ("greedy", "beam"):
        model.steps = []
        cached = decode_continuation(model, prompt, 6, strategy, 3)
        # the prompt once, then one new token per step until the window (6) is full, then
        # the cropped window is recomputed every step
        rows = 3 if strategy == "beam" else 1
        assert model.steps[:4] == [(rows, 3)] + [(rows, 1)] * 3
        assert all(shape[1] == 6 for shape in model.steps[4:])
        assert cached == decode_continuation(model, prompt, 6, strategy, 3, use_cache=False)
        assert cached == [3, 4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="valid: greedy, sample, beam"):
        decode_continuation(model, torch.tensor([[EOS]]), 3, strategy="nucleus")
    with pytest.raises(DecodingError, match=r"\[1, P\]"):
        decode_continuation(model, torch.tensor([[EOS], [EOS]]), 3)


def _length_trap() -> torch.Tensor:
    """From <eos>: A=1 (0.55) then <eos>; or B=2 (0.45), C=3 (0.95), then <eos>. By total
    log-probability A wins (0.55 > 0.4275); per token B C wins (log 0.4275 / 3 > log 0.55 / 2)."""
    probs = torch.zeros(7, 7)
    probs[EOS, 1], probs[EOS, 2] = 0.55, 0.45
    probs[1, EOS] = 1.0
    probs[2, 3], probs[2, 4] = 0.95, 0.05
    probs[3:7, EOS] = 1.0
    return probs


def test_beam_ranking_rule_is_length_normalised_by_default():
    model, prompt = Bigram(_length_trap()), torch.tensor([[EOS]])
    assert math.log(0.55) > math.log(0.45 * 0.95)
    assert math.log(0.45 * 0.95) / 3 > math.log(0.55) / 2
    assert beam_search(model, prompt, 5, num_beams=2, eos_id=EOS) == [2, 3]
    assert beam_search(model, prompt, 5, num_beams=2, eos_id=EOS, length_penalty=0) == [1]
    out = generate(model, prompt.expand(2, 1), 5, strategy="beam", num_beams=2, eos_id=EOS)
    assert out.tolist() == [[EOS, 2, 3, EOS]] * 2


def test_continuation_bleu_crops_prompts_to_an_ode_transformers_context():
    from ode_transformer import ODETransformerConfig, ODETransformerLM

    config = ODETransformerConfig(
        vocab_size=len(WORDS), d_model=16, n_heads=2, d_ff=32, n_layers=1, max_positions=6
    )
    model = ODETransformerLM(config).eval()
    sentence = [1, 5, 3, 4, 5, 6, 8, 9, 2, 7, EOS]  # prompt [eos] + 7 words: past the context
    prompt = torch.tensor([[EOS, *sentence[:7]]])
    for strategy in ("greedy", "beam"):
        new = decode_continuation(model, prompt, 5, strategy, 2)
        assert len(new) == 5 and new == decode_continuation(
            model, prompt, 5, strategy, 2, use_cache=False
        )
        args = (model, [sentence], WORDS.__getitem__, EOS, 7, strategy, 2)
        assert 0.0 <= continuation_bleu(*args) <= 1.0
