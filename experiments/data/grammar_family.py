"""A family of grammar corpora with a depth knob: centre-embedded relative clauses.

``depth_rules(D)`` is an LL(1) PCFG whose subject noun phrases take object relative clauses
nested up to ``D`` deep, each with number agreement ("the dogs that the cat that the kings
see follows sleep"): after the innermost subject the verbs close the clauses in reverse
order, so predicting a verb's number needs a stack of up to ``D + 1`` unresolved subjects.
The depth is in the nonterminals (``NP_PL_2`` may embed two more levels, ``NP_PL_0`` none),
so every sentence still has one derivation and an exact probability (the product of its
rules), and the entropy per token follows in closed form from the expected expansion
counts (``ProbabilisticGrammar.entropy_per_token``). The lexicon is the embedded
grammar's: 110 words and ``<eos>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from experiments.data.grammar import (
    ADJECTIVES,
    ADVERBS,
    INTRANSITIVE,
    NOUNS,
    PREPOSITIONS,
    TRANSITIVE,
    GrammarError,
    ProbabilisticGrammar,
    Rule,
    plural_noun,
    zipf,
)
from experiments.data.grammar_automaton import TokenAutomaton

GRAMMAR_DEPTHS = (1, 2, 3, 4)
"""The depths of the family (``data.grammar_depth``): the deepest nesting of relative clauses."""

NUMBERS = ("SG", "PL")

SPLIT_TOKENS = 100_000
"""Tokens (``<eos>`` included) at least in each fixed evaluation split, valid and test."""

STREAM_EPOCH = 1000
"""Batches in one nominal epoch of streamed training (no batch is ever read twice)."""

_TAGS = {"valid": 1, "test": 2, "train": 3}
"""The first word of every seed sequence: evaluation splits and training never share one."""


@dataclass(frozen=True)
class Lexicon:
    """The words of each category, singular forms (plurals and 3rd-person verbs derived)."""

    nouns: tuple[str, ...] = tuple(NOUNS)
    intransitive: tuple[str, ...] = tuple(INTRANSITIVE)
    transitive: tuple[str, ...] = tuple(TRANSITIVE)
    adjectives: tuple[str, ...] = tuple(ADJECTIVES)
    adverbs: tuple[str, ...] = tuple(ADVERBS)
    prepositions: tuple[str, ...] = tuple(PREPOSITIONS)
    determiners_sg: tuple[str, ...] = ("a", "this", "every", "one")
    determiners_pl: tuple[str, ...] = ("some", "these", "many", "two", "several")


@dataclass(frozen=True)
class Shape:
    """The structural probabilities: of a relative clause under a noun that may still embed
    one (``embed``), of one more adjective, of a prepositional phrase, of an adverb, and of
    a transitive main verb."""

    embed: float = 0.6
    adjective: float = 0.3
    preposition: float = 0.15
    adverb: float = 0.3
    transitive: float = 0.55


def _choice(p: float, yes: tuple[str, ...], no: tuple[str, ...] = ()) -> list[Rule]:
    """Two alternatives with probabilities ``p`` and ``1 - p``, a certain one kept alone."""
    return [(q, rhs) for q, rhs in ((p, yes), (1.0 - p, no)) if q > 0.0]


def depth_rules(
    depth: int, shape: Shape = Shape(), lexicon: Lexicon = Lexicon()
) -> dict[str, list[Rule]]:
    """The rules of the depth-``depth`` grammar: nonterminal -> [(probability, rhs)]."""
    if depth not in GRAMMAR_DEPTHS:
        raise GrammarError(
            f"grammar depth must be one of {', '.join(map(str, GRAMMAR_DEPTHS))}, got {depth}"
        )
    rules: dict[str, list[Rule]] = {
        "S": [(0.5, (f"NP_SG_{depth}", "VP_SG")), (0.5, (f"NP_PL_{depth}", "VP_PL"))],
        "ADJS": _choice(shape.adjective, ("ADJ", "ADJS")),
        "PP": _choice(shape.preposition, ("PREP", "BARE_NP")),
        "BARE_NP": [(0.6, ("BARE_NP_SG",)), (0.4, ("BARE_NP_PL",))],
        "ADVP": _choice(shape.adverb, ("ADV",)),
        "ADJ": zipf(list(lexicon.adjectives)),
        "ADV": zipf(list(lexicon.adverbs)),
        "PREP": zipf(list(lexicon.prepositions)),
        "DET_SG": zipf(list(lexicon.determiners_sg), 0.7),
        "DET_PL": zipf(list(lexicon.determiners_pl), 0.7),
    }
    for n in NUMBERS:
        singular = n == "SG"
        rules[f"N_{n}"] = zipf([w if singular else plural_noun(w) for w in lexicon.nouns])
        rules[f"VI_{n}"] = zipf([v + "s" if singular else v for v in lexicon.intransitive])
        rules[f"VT_{n}"] = zipf([v + "s" if singular else v for v in lexicon.transitive])
        rules[f"VP_{n}"] = _choice(shape.transitive, (f"VT_{n}", "BARE_NP"), (f"VI_{n}", "ADVP"))
        rules[f"BARE_NP_{n}"] = [(1.0, (f"DET_{n}", "ADJS", f"N_{n}"))]
        rules[f"NP_{n}_0"] = [(1.0, (f"DET_{n}", "ADJS", f"N_{n}", "PP"))]
        for level in range(1, depth + 1):
            rules[f"NP_{n}_{level}"] = [(1.0, (f"DET_{n}", "ADJS", f"N_{n}", "PP", f"RC_{level}"))]
    for level in range(1, depth + 1):
        # The clause's own subject may embed one level less; its verb agrees with that
        # subject and closes the clause (the object is the gap: "that the cat follows").
        rules[f"RC_{level}"] = _choice(shape.embed, ("that", f"REL_{level}"))
        rules[f"REL_{level}"] = [(0.5, (f"NP_{n}_{level - 1}", f"VT_{n}")) for n in NUMBERS]
    return rules


@cache
def family_grammar(depth: int) -> ProbabilisticGrammar:
    """The depth-``depth`` grammar of the family (checked LL(1) once, then cached)."""
    grammar = ProbabilisticGrammar(depth_rules(depth))
    grammar.check_ll1()
    return grammar


@cache
def family_automaton(depth: int) -> TokenAutomaton:
    """The depth-``depth`` grammar as a next-word automaton (built once)."""
    return TokenAutomaton.compile(family_grammar(depth))


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(list(key)))


@cache
def family_split(depth: int, seed: int, split: str) -> tuple[list[list[str]], float]:
    """The fixed ``valid`` or ``test`` sample of the depth-``depth`` grammar for corpus
    ``seed``: whole sentences (words, ``<eos>`` last) up to at least ``SPLIT_TOKENS``
    tokens, and the true grammar's exact total log-probability of them."""
    automaton, rng = family_automaton(depth), _rng(_TAGS[split], seed, depth)
    sentences: list[list[int]] = []
    log_probability, tokens = 0.0, 0
    while tokens < SPLIT_TOKENS:
        chunk = automaton.sentences(rng, 1024)
        for sentence in chunk:
            sentences.append(sentence)
            log_probability += automaton.log_probability(sentence)
            tokens += len(sentence)
            if tokens >= SPLIT_TOKENS:
                break
    words = [[automaton.words[i] for i in sentence] for sentence in sentences]
    return words, log_probability


def reference_perplexities(depth: int, seed: int) -> dict[str, float]:
    """What plots draw beside results of the depth-``depth`` family: the true grammar's
    perplexity in expectation (``expected``) and on corpus ``seed``'s test split."""
    words, log_probability = family_split(depth, seed, "test")
    tokens = sum(len(sentence) for sentence in words)
    return {
        "expected": family_grammar(depth).expected_perplexity,
        "test_split": math.exp(-log_probability / tokens),
    }


@dataclass(frozen=True)
class GrammarStream:
    """Never-repeated training data of the depth-``depth`` grammar for corpus ``seed``.

    Training batch ``index`` of run seed ``run_seed`` is drawn from its own stream,
    ``numpy.random.SeedSequence([3, seed, depth, run_seed, index])`` (the leading 3 keeps it
    apart from the evaluation splits' streams), so a batch is a pure function of its
    index: a resumed run reads exactly the batches the uninterrupted one would have.
    """

    depth: int
    seed: int

    @property
    def words(self) -> tuple[str, ...]:
        """The grammar's vocabulary, ``<eos>`` first."""
        return family_automaton(self.depth).words

    def batch(
        self,
        run_seed: int,
        index: int,
        rows: int,
        length: int,
        ids: torch.Tensor,
        *,
        sentences: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index``, in tokenizer ids (``ids[w]`` for grammar word ``w``, ``<eos>``
        first): ``rows`` streams of ``length`` tokens after an ``<eos>`` (``[rows, length +
        1]``, each row from a sentence start), or with ``sentences`` ``rows`` whole
        sentences padded on the right with their mask."""
        automaton = family_automaton(self.depth)
        rng = _rng(_TAGS["train"], self.seed, self.depth, run_seed, index)
        lookup = ids.numpy()
        if sentences:  # as batching.sentence_batch pads them: <eos> first, on the right
            drawn = automaton.sentence_array(rng, rows)
            ends = drawn == 0
            real = np.cumsum(ends, axis=1) - ends == 0
            tokens = np.concatenate([np.zeros((rows, 1), dtype=np.int64), drawn], axis=1)
            mask = np.concatenate([np.ones((rows, 1), dtype=bool), real], axis=1)
            return torch.from_numpy(lookup[tokens]), torch.from_numpy(mask)
        words = automaton.stream(rng, rows, length)
        return torch.from_numpy(lookup[np.pad(words, ((0, 0), (1, 0)))])
