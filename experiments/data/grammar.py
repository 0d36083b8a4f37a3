"""The embedded default corpus: a seeded probabilistic grammar with an exactly known entropy.

The grammar is an LL(1) probabilistic context-free grammar over English-like words, with
subject-verb number agreement across relative clauses and prepositional phrases (a
dependency an n-gram model cannot capture but a model with memory can). LL(1) means every
sentence has exactly one derivation, so the entropy of a sentence equals the entropy of its
derivation, which follows in closed form from the expected number of times each
nonterminal is expanded (a linear system). Sentences are i.i.d., each followed by
``<eos>``, so the entropy rate of the token stream is ``H(sentence) / E[tokens + 1]``.

``exp`` of the entropy rate is the perplexity the true grammar reaches *in expectation*
(on an infinitely long text); no model beats it in expectation. It is not a floor for one
finite split: the true grammar's own perplexity on a sampled test split scatters around
it (``true_split_perplexity``), and that is the number to set beside a model's score.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from odelm.errors import OdelmError

Rule = tuple[float, tuple[str, ...]]

NOUNS = [
    "dog",
    "cat",
    "bird",
    "horse",
    "teacher",
    "doctor",
    "farmer",
    "student",
    "artist",
    "child",
    "king",
    "queen",
    "robot",
    "sailor",
    "writer",
    "baker",
    "lawyer",
    "singer",
    "pilot",
    "judge",
]
INTRANSITIVE = ["sleep", "run", "laugh", "sing", "swim", "wait", "fall", "smile", "dance", "work"]
TRANSITIVE = ["see", "follow", "help", "like", "watch", "call", "visit", "know", "meet", "find"]
ADJECTIVES = ["big", "small", "old", "young", "happy", "quiet", "clever", "brave", "tall", "lazy"]
ADVERBS = ["slowly", "quickly", "today", "loudly", "again"]
PREPOSITIONS = ["near", "behind", "with", "under"]


def zipf(words: list[str], exponent: float = 1.0) -> list[Rule]:
    """Lexical rules with Zipfian probabilities (rank r gets weight 1 / r**exponent)."""
    weights = [1.0 / (rank + 1) ** exponent for rank in range(len(words))]
    total = sum(weights)
    return [(weight / total, (word,)) for weight, word in zip(weights, words)]


def plural_noun(noun: str) -> str:
    """The plural of an English noun (``-ies`` after a consonant's ``y``, else ``-s``)."""
    return noun[:-1] + "ies" if noun.endswith("y") and noun[-2] not in "aeiou" else noun + "s"


def default_rules() -> dict[str, list[Rule]]:
    """The grammar's rules: nonterminal -> [(probability, right-hand side)].

    Symbols that are keys are nonterminals; anything else is a word.
    """
    rules: dict[str, list[Rule]] = {"S": [(0.5, ("NP_SG", "VP_SG")), (0.5, ("NP_PL", "VP_PL"))]}
    for number in ("SG", "PL"):
        rules[f"NP_{number}"] = [
            (1.0, (f"DET_{number}", "ADJS", f"N_{number}", "PP", f"RC_{number}"))
        ]
        rules[f"RC_{number}"] = [(0.15, ("that", f"VP_{number}")), (0.85, ())]
        rules[f"VP_{number}"] = [
            (0.45, (f"VI_{number}", "ADVP")),
            (0.55, (f"VT_{number}", "OBJ")),
        ]
        # A prepositional object is a bare noun phrase: letting it take a relative clause
        # would make "a dog near a cat that runs ..." ambiguous (check_ll1 catches that).
        rules[f"BARE_NP_{number}"] = [(1.0, (f"DET_{number}", "ADJS", f"N_{number}"))]
    rules["OBJ"] = [(0.6, ("NP_SG",)), (0.4, ("NP_PL",))]
    rules["PP_OBJ"] = [(0.6, ("BARE_NP_SG",)), (0.4, ("BARE_NP_PL",))]
    rules["ADJS"] = [(0.3, ("ADJ", "ADJS")), (0.7, ())]
    rules["PP"] = [(0.15, ("PREP", "PP_OBJ")), (0.85, ())]
    rules["ADVP"] = [(0.3, ("ADV",)), (0.7, ())]
    rules["DET_SG"] = zipf(["a", "this", "every", "one"], 0.7)
    rules["DET_PL"] = zipf(["some", "these", "many", "two", "several"], 0.7)
    rules["N_SG"] = zipf(NOUNS)
    rules["N_PL"] = zipf([plural_noun(noun) for noun in NOUNS])
    rules["VI_SG"] = zipf([verb + "s" for verb in INTRANSITIVE])
    rules["VI_PL"] = zipf(INTRANSITIVE)
    rules["VT_SG"] = zipf([verb + "s" for verb in TRANSITIVE])
    rules["VT_PL"] = zipf(TRANSITIVE)
    rules["ADJ"] = zipf(ADJECTIVES)
    rules["ADV"] = zipf(ADVERBS)
    rules["PREP"] = zipf(PREPOSITIONS)
    return rules


class GrammarError(OdelmError, ValueError):
    """The grammar is malformed, ambiguous (not LL(1)) or generates infinite sentences."""


@dataclass(frozen=True)
class ProbabilisticGrammar:
    """A PCFG with exact entropy; ``rules`` maps each nonterminal to its weighted rules."""

    rules: dict[str, list[Rule]]
    start: str = "S"

    def __post_init__(self) -> None:
        for symbol, alternatives in self.rules.items():
            total = sum(probability for probability, _ in alternatives)
            if not math.isclose(total, 1.0, abs_tol=1e-9):
                raise GrammarError(f"rules of {symbol} sum to {total}, not 1")
        if self.start not in self.rules:
            raise GrammarError(f"start symbol {self.start!r} has no rules")

    @cached_property
    def nonterminals(self) -> list[str]:
        return sorted(self.rules)

    @cached_property
    def words(self) -> list[str]:
        """Every word the grammar can produce, sorted."""
        return sorted(
            {
                s
                for alts in self.rules.values()
                for _, rhs in alts
                for s in rhs
                if s not in self.rules
            }
        )

    @cached_property
    def expected_expansions(self) -> dict[str, float]:
        """Expected number of times each nonterminal is expanded in one sentence.

        Solves ``c = e_start + M^T c`` with ``M[A, B]`` the expected number of B's in one
        expansion of A; the grammar is consistent only if M's spectral radius is below 1.
        """
        index = {symbol: i for i, symbol in enumerate(self.nonterminals)}
        mean = np.zeros((len(index), len(index)))
        for symbol, alternatives in self.rules.items():
            for probability, rhs in alternatives:
                for child in rhs:
                    if child in index:
                        mean[index[symbol], index[child]] += probability
        radius = max(abs(np.linalg.eigvals(mean)))
        if radius >= 1.0:
            raise GrammarError(
                f"expected sentence length is infinite (spectral radius {radius:.3f})"
            )
        start = np.zeros(len(index))
        start[index[self.start]] = 1.0
        counts = np.linalg.solve(np.eye(len(index)) - mean.T, start)
        return {symbol: float(counts[i]) for symbol, i in index.items()}

    @cached_property
    def sentence_entropy(self) -> float:
        """Entropy of one sentence in nats (= derivation entropy, since the grammar is LL(1))."""
        self.check_ll1()
        return sum(
            count * -sum(p * math.log(p) for p, _ in self.rules[symbol] if p > 0)
            for symbol, count in self.expected_expansions.items()
        )

    @cached_property
    def expected_words(self) -> float:
        """Expected number of words per sentence, ``<eos>`` not included."""
        return sum(
            count * sum(p * sum(s not in self.rules for s in rhs) for p, rhs in self.rules[symbol])
            for symbol, count in self.expected_expansions.items()
        )

    @property
    def entropy_per_token(self) -> float:
        """Entropy rate of the ``<eos>``-separated token stream, in nats per token."""
        return self.sentence_entropy / (self.expected_words + 1.0)

    @property
    def expected_perplexity(self) -> float:
        """``exp(entropy rate)``: the true grammar's perplexity on an infinitely long text."""
        return math.exp(self.entropy_per_token)

    def check_ll1(self) -> None:
        """Raise GrammarError unless the grammar is LL(1), hence unambiguous."""
        _ = self.parse_table

    @cached_property
    def parse_table(self) -> dict[tuple[str, str], int]:
        """``(nonterminal, next word or <eos>) -> index of the one rule to expand``; raises
        GrammarError when two rules share a lookahead (the grammar is not LL(1))."""
        nullable = self._nullable()
        first = self._first_sets(nullable)
        follow = self._follow_sets(nullable, first)
        table: dict[tuple[str, str], int] = {}
        for symbol, alternatives in self.rules.items():
            for index, (_, rhs) in enumerate(alternatives):
                lookahead = self._first_of(rhs, nullable, first)
                if self._sequence_nullable(rhs, nullable):
                    lookahead |= follow[symbol]
                clash = sorted(word for word in lookahead if (symbol, word) in table)
                if clash:
                    raise GrammarError(f"{symbol} is not LL(1): lookahead {clash} is shared")
                table.update({(symbol, word): index for word in lookahead})
        return table

    def log_probability(self, words: list[str]) -> float:
        """The log-probability of a sentence (without ``<eos>``): the sum of the log rule
        probabilities of its one derivation, found by LL(1) parsing; GrammarError when the
        grammar cannot generate it."""
        table, position, total, stack = self.parse_table, 0, 0.0, [self.start]
        tokens = [*words, "<eos>"]
        while stack:
            symbol = stack.pop()
            if symbol not in self.rules:
                if tokens[position] != symbol:
                    raise GrammarError(f"word {position} is {tokens[position]!r}, not {symbol!r}")
                position += 1
                continue
            index = table.get((symbol, tokens[position]))
            if index is None:
                raise GrammarError(
                    f"{symbol} cannot start with word {position} {tokens[position]!r}"
                )
            probability, rhs = self.rules[symbol][index]
            total += math.log(probability)
            stack.extend(reversed(rhs))
        if position != len(words):
            raise GrammarError(f"the sentence ends at word {position} of {len(words)}")
        return total

    def _nullable(self) -> set[str]:
        nullable: set[str] = set()
        changed = True
        while changed:
            changed = False
            for symbol, alternatives in self.rules.items():
                if symbol not in nullable and any(
                    all(s in nullable for s in rhs) for _, rhs in alternatives
                ):
                    nullable.add(symbol)
                    changed = True
        return nullable

    def _sequence_nullable(self, rhs: tuple[str, ...], nullable: set[str]) -> bool:
        return all(s in nullable for s in rhs)

    def _first_of(
        self, rhs: tuple[str, ...], nullable: set[str], first: dict[str, set[str]]
    ) -> set[str]:
        result: set[str] = set()
        for symbol in rhs:
            if symbol not in self.rules:
                result.add(symbol)
                return result
            result |= first[symbol]
            if symbol not in nullable:
                return result
        return result

    def _first_sets(self, nullable: set[str]) -> dict[str, set[str]]:
        first: dict[str, set[str]] = {symbol: set() for symbol in self.rules}
        changed = True
        while changed:
            changed = False
            for symbol, alternatives in self.rules.items():
                for _, rhs in alternatives:
                    new = self._first_of(rhs, nullable, first) - first[symbol]
                    if new:
                        first[symbol] |= new
                        changed = True
        return first

    def _follow_sets(self, nullable: set[str], first: dict[str, set[str]]) -> dict[str, set[str]]:
        follow: dict[str, set[str]] = {symbol: set() for symbol in self.rules}
        follow[self.start].add("<eos>")
        changed = True
        while changed:
            changed = False
            for symbol, alternatives in self.rules.items():
                for _, rhs in alternatives:
                    for i, child in enumerate(rhs):
                        if child not in self.rules:
                            continue
                        rest = rhs[i + 1 :]
                        new = self._first_of(rest, nullable, first)
                        if self._sequence_nullable(rest, nullable):
                            new |= follow[symbol]
                        if new - follow[child]:
                            follow[child] |= new
                            changed = True
        return follow

    def sample(self, rng: random.Random) -> tuple[list[str], float]:
        """One sentence (without ``<eos>``) and the log-probability of its derivation."""
        words: list[str] = []
        log_probability = 0.0
        stack = [self.start]
        while stack:
            symbol = stack.pop()
            if symbol not in self.rules:
                words.append(symbol)
                continue
            alternatives = self.rules[symbol]
            probability, rhs = rng.choices(alternatives, weights=[p for p, _ in alternatives])[0]
            log_probability += math.log(probability)
            stack.extend(reversed(rhs))
        return words, log_probability


def sample_splits(
    seed: int, sizes: dict[str, int] | None
) -> dict[str, list[tuple[list[str], float]]]:
    """``(words, log-probability)`` per sentence per split, from one seeded stream."""
    sizes = sizes or {"train": 8000, "valid": 800, "test": 800}
    grammar = ProbabilisticGrammar(default_rules())
    rng = random.Random(seed)
    return {split: [grammar.sample(rng) for _ in range(count)] for split, count in sizes.items()}


def generate_splits(
    seed: int = 0, sizes: dict[str, int] | None = None
) -> dict[str, list[list[str]]]:
    """Sample train/valid/test sentences (lists of words) from the default grammar.

    ``sizes`` gives the number of sentences per split; the three splits are disjoint draws
    from one seeded stream, so the corpus is the same on every machine.
    """
    return {
        split: [words for words, _ in sentences]
        for split, sentences in sample_splits(seed, sizes).items()
    }


def true_split_perplexity(seed: int = 0, split: str = "test") -> float:
    """The true grammar's per-token perplexity on one generated split (``<eos>`` counted).

    The score a perfect model gets on exactly the sentences a run is tested on; it differs
    from ``expected_perplexity`` by the sampling noise of a finite split.
    """
    sentences = sample_splits(seed, None)[split]
    tokens = sum(len(words) + 1 for words, _ in sentences)
    return math.exp(-sum(log_p for _, log_p in sentences) / tokens)


def reference_perplexities(seed: int = 0) -> dict[str, float]:
    """What plots and tables draw beside grammar-corpus results: the true grammar's
    perplexity in expectation (``expected``) and on the seed's test split (``test_split``)."""
    grammar = ProbabilisticGrammar(default_rules())
    return {
        "expected": grammar.expected_perplexity,
        "test_split": true_split_perplexity(seed, "test"),
    }
