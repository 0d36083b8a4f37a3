"""The grammar family with a depth knob: exact probabilities and entropies against
enumeration, agreement at every level, fixed evaluation splits, never-repeated streams."""

from __future__ import annotations

import math
from functools import cache
from itertools import product

import numpy as np
import pytest
import torch

from experiments.data.batching import sentence_batch
from experiments.data.corpora import CorpusError, load_corpus
from experiments.data.grammar import GrammarError, ProbabilisticGrammar
from experiments.data.grammar_automaton import TokenAutomaton
from experiments.data.grammar_family import (
    GRAMMAR_DEPTHS,
    SPLIT_TOKENS,
    GrammarStream,
    Lexicon,
    Shape,
    depth_rules,
    family_automaton,
    family_grammar,
    family_split,
)

# Two nouns, one word elsewhere, no adjectives: a finite language small enough to list.
TINY_LEXICON = Lexicon(
    nouns=("dog", "cat"),
    intransitive=("sleep",),
    transitive=("see",),
    adjectives=("big",),
    adverbs=("slowly",),
    prepositions=("near",),
    determiners_sg=("a",),
    determiners_pl=("some",),
)


def _derivations(grammar: ProbabilisticGrammar) -> list[tuple[tuple[str, ...], float]]:
    """Every derivation of a finite (non-recursive) grammar: its words and probability."""

    @cache
    def of(symbol: str) -> tuple[tuple[tuple[str, ...], float], ...]:
        if symbol not in grammar.rules:
            return (((symbol,), 1.0),)
        out = []
        for p, rhs in grammar.rules[symbol]:
            for parts in product(*(of(child) for child in rhs)):
                words = tuple(w for part, _ in parts for w in part)
                out.append((words, p * math.prod(q for _, q in parts)))
        return tuple(out)

    return list(of(grammar.start))


@pytest.mark.parametrize("depth", [1, 2])
def test_closed_form_entropy_and_exact_probabilities_match_enumeration(depth: int) -> None:
    grammar = ProbabilisticGrammar(depth_rules(depth, Shape(adjective=0.0), TINY_LEXICON))
    automaton = TokenAutomaton.compile(grammar)
    derivations = _derivations(grammar)
    sentences: dict[tuple[str, ...], float] = {}
    for words, p in derivations:
        sentences[words] = sentences.get(words, 0.0) + p
    assert len(sentences) == len(derivations)  # unambiguous: one derivation per sentence
    assert math.fsum(sentences.values()) == pytest.approx(1.0, abs=1e-12)
    entropy = -math.fsum(p * math.log(p) for p in sentences.values())
    tokens = math.fsum(p * (len(words) + 1) for words, p in sentences.items())
    assert grammar.sentence_entropy == pytest.approx(entropy, rel=1e-12)
    assert grammar.expected_words + 1 == pytest.approx(tokens, rel=1e-12)
    assert grammar.entropy_per_token == pytest.approx(entropy / tokens, rel=1e-12)
    assert automaton.entropy_per_token() == pytest.approx(entropy / tokens, rel=1e-12)
    column = {word: i for i, word in enumerate(automaton.words)}
    for words, p in list(sentences.items())[:: max(1, len(sentences) // 300)]:
        assert grammar.log_probability(list(words)) == pytest.approx(math.log(p), abs=1e-12)
        ids = [column[w] for w in words] + [0]
        assert automaton.log_probability(ids) == pytest.approx(math.log(p), abs=1e-12)


@pytest.mark.parametrize("depth", GRAMMAR_DEPTHS)
def test_each_depth_is_ll1_over_110_tokens_with_its_entropy_from_two_linear_systems(
    depth: int,
) -> None:
    grammar, automaton = family_grammar(depth), family_automaton(depth)
    assert len(automaton.words) == 110 and automaton.words[0] == "<eos>"
    # expected expansions of the rules against expected visits of the parser's states
    assert automaton.entropy_per_token() == pytest.approx(grammar.entropy_per_token, abs=1e-13)
    probabilities = np.exp(automaton.log_probs[: automaton.sink])
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-13)


def test_the_entropy_rates_of_the_family() -> None:
    rates = [family_grammar(depth).entropy_per_token for depth in GRAMMAR_DEPTHS]
    assert rates == pytest.approx([2.2580451301, 2.2541540011, 2.2523629867, 2.2514310459])


def test_every_clause_agrees_with_its_own_subject() -> None:
    grammar = family_grammar(2)
    # "the dogs that the cat that the kings see follows sleep", determiners made explicit
    sentence = [
        "some",
        "dogs",
        "that",
        "a",
        "cat",
        "that",
        "some",
        "kings",
        "see",
        "follows",
        "sleep",
    ]
    assert math.isfinite(grammar.log_probability(sentence))
    for verb, wrong in ((8, "sees"), (9, "follow"), (10, "sleeps")):
        with pytest.raises(GrammarError):
            grammar.log_probability([*sentence[:verb], wrong, *sentence[verb + 1 :]])
    deeper = [
        "some",
        "dogs",
        "that",
        "a",
        "cat",
        "that",
        "some",
        "kings",
        "that",
        "a",
        "bird",
        "likes",
        "see",
        "follows",
        "sleep",
    ]
    with pytest.raises(GrammarError):  # three levels of embedding: beyond depth 2
        grammar.log_probability(deeper)
    assert math.isfinite(family_grammar(3).log_probability(deeper))


@pytest.mark.parametrize("depth", GRAMMAR_DEPTHS)
def test_sampled_sentences_carry_their_derivations_probability(depth: int) -> None:
    grammar, automaton = family_grammar(depth), family_automaton(depth)
    sentences = automaton.sentences(np.random.default_rng(depth), 300)
    assert all(s[-1] == 0 and 0 not in s[:-1] for s in sentences)
    for sentence in sentences:
        parsed = grammar.log_probability([automaton.words[i] for i in sentence[:-1]])
        assert automaton.log_probability(sentence) == pytest.approx(parsed, abs=1e-10)


def test_bad_depths_are_one_line_errors() -> None:
    with pytest.raises(GrammarError, match="grammar depth must be one of 1, 2, 3, 4, got 7"):
        depth_rules(7)
    with pytest.raises(CorpusError, match="must be one of 1, 2, 3, 4, got 0"):
        load_corpus("grammar", grammar_depth=0)
    with pytest.raises(CorpusError, match="use protocol full"):
        load_corpus("grammar", protocol="mini", grammar_depth=2)


def test_config_key_is_checked_and_hashed_only_when_set() -> None:
    from experiments.training.config import ConfigError, parse_config
    from experiments.training.runs import config_sha256

    base = {"name": "x", "model": {"family": "neuralode_lm", "name": "lstm"}}
    plain = parse_config(base)
    assert plain.data.grammar_depth is None
    with_depth = parse_config({**base, "data": {"grammar_depth": 3}})
    assert config_sha256(with_depth) != config_sha256(plain)
    with pytest.raises(ConfigError, match="grammar_depth"):
        parse_config({**base, "data": {"grammar_depth": 7}})


def test_evaluation_splits_are_fixed_disjoint_draws_of_100k_tokens() -> None:
    valid, valid_nll = family_split(2, 0, "valid")
    test, test_nll = family_split(2, 0, "test")
    assert sum(map(len, valid)) >= SPLIT_TOKENS and sum(map(len, test)) >= SPLIT_TOKENS
    assert valid[:50] != test[:50] and family_split(2, 1, "test")[0][:50] != test[:50]
    corpus = load_corpus("grammar", seed=0, grammar_depth=2)
    assert set(corpus.lines) == {"valid", "test"} and corpus.stream == GrammarStream(2, 0)
    assert corpus.reference_nll == {"valid": -valid_nll, "test": -test_nll}
    grammar = family_grammar(2)
    parsed = math.fsum(grammar.log_probability(words[:-1]) for words in test[:2000])
    automaton, column = family_automaton(2), {w: i for i, w in enumerate(grammar.words, 1)}
    column["<eos>"] = 0
    ids = [column[w] for words in test[:2000] for w in words]
    assert automaton.log_probability(ids) == pytest.approx(parsed, abs=1e-8)


def test_training_batches_are_pure_functions_of_their_index_and_never_repeat() -> None:
    stream, ids = GrammarStream(3, 0), torch.arange(110)
    first = stream.batch(5, 7, rows=8, length=40, ids=ids)
    assert isinstance(first, torch.Tensor) and first.shape == (8, 41)
    assert torch.equal(first, stream.batch(5, 7, rows=8, length=40, ids=ids))
    others = [stream.batch(5, 8, 8, 40, ids), stream.batch(6, 7, 8, 40, ids)]
    others.append(GrammarStream(3, 1).batch(5, 7, 8, 40, ids))
    assert all(not torch.equal(first, other) for other in others)
    automaton = family_automaton(3)
    for row in first.tolist():  # every row starts a sentence and is a possible stream
        assert row[0] == 0 and math.isfinite(automaton.log_probability(row[1:]))
    tokens, mask = stream.batch(5, 7, rows=6, length=0, ids=ids, sentences=True)
    drawn = [
        [w for w, k in zip(row, keep) if k] for row, keep in zip(tokens.tolist(), mask.tolist())
    ]
    for sentence in drawn:
        assert sentence[0] == 0 and 0 not in sentence[1:-1] and sentence[-1] == 0
        assert math.isfinite(automaton.log_probability(sentence[1:]))
    # padded as the harness pads sentences: <eos> first, <eos> on the right, masked out
    expected = sentence_batch([s[1:] for s in drawn], 0, 0)
    assert torch.equal(tokens, expected[0]) and torch.equal(mask, expected[1])


@pytest.mark.parametrize("depth", GRAMMAR_DEPTHS)
def test_the_sampler_draws_from_the_grammar_its_splits_scatter_around_the_entropy(
    depth: int,
) -> None:
    automaton, rate = family_automaton(depth), family_grammar(depth).entropy_per_token
    column = {word: i for i, word in enumerate(automaton.words)}
    words, log_probability = family_split(depth, 0, "test")
    surprisal = np.array([-automaton.log_probability([column[w] for w in s]) for s in words])
    lengths = np.array([len(s) for s in words])
    assert -log_probability == pytest.approx(surprisal.sum(), rel=1e-12)
    # ratio estimator: its standard error from the residuals surprisal - rate * length
    error = np.std(surprisal - rate * lengths, ddof=1) / np.sqrt(len(words)) / lengths.mean()
    assert abs(surprisal.sum() / lengths.sum() - rate) < 4 * error
    first = np.bincount(automaton.stream(np.random.default_rng(1), 20_000, 1)[:, 0], minlength=110)
    expected = 20_000 * np.exp(automaton.log_probs[automaton.start])
    assert np.all(np.abs(first - expected) <= 5 * np.sqrt(expected + 1))
