"""An LL(1) grammar compiled to a deterministic automaton over words: exact next-word
distributions, fast vectorised sampling, and an exact entropy from its own equations.

A state is the LL(1) parser's stack after a prefix (top last): since the grammar is LL(1),
each next word is reached by exactly one expansion of the stack, so a prefix determines one
state and ``P(word | prefix)`` is the product of the rules expanded on the way (the sum of
every path would double-count only an ambiguous grammar, which ``compile`` refuses). A
grammar whose stacks are bounded (the depth family: embeddings are capped, recursion only
in tails such as ``ADJS -> ADJ ADJS``) has finitely many states, so the whole next-word
distribution is a table ``[state, word]`` and sampling one word for many streams at once
is one vectorised draw. ``<eos>`` (word 0) ends a sentence and returns to the start state.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from experiments.data.grammar import GrammarError, ProbabilisticGrammar

EOS_WORD = "<eos>"
MAX_STATES = 4096
"""More parser stacks than this: the grammar's stack is unbounded (or too deep for the
sampler's one sorted table, whose ``state + draw`` must resolve draws to 1e-12)."""
SENTENCE_STEPS = 32
"""Words drawn per block while sampling whole sentences (blocks repeat until all ended)."""

Stack = tuple[str, ...]


@dataclass(frozen=True)
class TokenAutomaton:
    """The grammar's next-word tables: ``words[0]`` is ``<eos>``; ``log_probs[s, w]`` is
    ``log P(w | state s)`` (``-inf`` where impossible); ``transitions[s, w]`` the state after
    reading ``w`` in ``s`` (the start state after ``<eos>``; ``sink`` after an impossible word,
    a state of uniform guesses that only ``<eos>`` leaves); ``start`` is 0."""

    words: tuple[str, ...]
    log_probs: np.ndarray
    transitions: np.ndarray
    cumulative: np.ndarray
    start: int = 0

    @property
    def sink(self) -> int:
        """The state after a word the grammar cannot produce there."""
        return int(self.log_probs.shape[0] - 1)

    @classmethod
    def compile(cls, grammar: ProbabilisticGrammar) -> TokenAutomaton:
        """Every parser stack reachable from the start symbol, breadth first."""
        grammar.check_ll1()
        words = (EOS_WORD, *grammar.words)
        column = {word: i for i, word in enumerate(words)}
        start: Stack = (grammar.start,)
        index: dict[Stack, int] = {start: 0}
        queue: deque[Stack] = deque([start])
        rows: list[dict[int, tuple[float, Stack]]] = []
        while queue:
            stack = queue.popleft()
            successors = _next_words(grammar, stack, start)
            row: dict[int, tuple[float, Stack]] = {}
            for word, (probability, after) in successors.items():
                if after not in index:
                    if len(index) >= MAX_STATES:
                        raise GrammarError(f"over {MAX_STATES} parser stacks: unbounded stack")
                    index[after] = len(index)
                    queue.append(after)
                row[column[word]] = (probability, after)
            rows.append(row)
        sink = len(rows)
        log_probs = np.full((sink + 1, len(words)), -math.inf)
        log_probs[sink] = -math.log(len(words))
        transitions = np.full((sink + 1, len(words)), sink, dtype=np.int64)
        transitions[:, 0] = 0
        for state, row in enumerate(rows):
            for position, (probability, after) in row.items():
                log_probs[state, position] = math.log(probability)
                transitions[state, position] = index[after]
        probabilities = np.exp(log_probs)
        cumulative = np.cumsum(probabilities, axis=1)
        # Past a state's last possible word the cumulative is exactly 1, so a uniform draw
        # in [0, 1) never lands beyond it, whatever the rounding of the sum.
        last = len(words) - 1 - np.argmax(probabilities[:, ::-1] > 0, axis=1)
        cumulative[np.arange(len(words)) >= last[:, None]] = 1.0
        return cls(words, log_probs, transitions, cumulative)

    @property
    def num_states(self) -> int:
        """Parser states, the sink included."""
        return int(self.log_probs.shape[0])

    def expected_visits(self) -> np.ndarray:
        """Expected visits of each state in one sentence (start to ``<eos>``): the solution of
        ``v = e_start + P^T v`` over the words other than ``<eos>``, solved exactly in
        topological order (the automaton is acyclic but for self-loops, e.g. adjectives)."""
        probabilities = np.exp(self.log_probs[: self.sink])
        inflow = np.zeros(self.sink)
        inflow[self.start] = 1.0
        edges: list[list[tuple[int, float]]] = [[] for _ in range(self.sink)]
        pending = np.zeros(self.sink, dtype=np.int64)
        stay = np.zeros(self.sink)
        for state in range(self.sink):
            for word in np.nonzero(probabilities[state, 1:] > 0)[0] + 1:
                after = int(self.transitions[state, word])
                if after == state:
                    stay[state] += probabilities[state, word]
                else:
                    edges[state].append((after, float(probabilities[state, word])))
                    pending[after] += 1
        visits = np.zeros(self.sink)
        ready = deque(s for s in range(self.sink) if pending[s] == 0)
        done = 0
        while ready:
            state = ready.popleft()
            done += 1
            visits[state] = inflow[state] / (1.0 - stay[state])
            for after, probability in edges[state]:
                inflow[after] += visits[state] * probability
                pending[after] -= 1
                if pending[after] == 0:
                    ready.append(after)
        if done != self.sink:
            raise GrammarError("the automaton has a cycle longer than one word")
        return visits

    def entropy_per_token(self) -> float:
        """Entropy rate of the ``<eos>``-separated stream in nats per token: expected
        surprisal of a sentence over its expected tokens, both from ``expected_visits``."""
        visits = self.expected_visits()
        log_probs = self.log_probs[: self.sink]
        probabilities = np.exp(log_probs)
        surprisal = -np.sum(probabilities * np.where(probabilities > 0, log_probs, 0.0), axis=1)
        return float(visits @ surprisal / visits.sum())

    @cached_property
    def _shifted(self) -> np.ndarray:
        """Every state's cumulative row plus the state's number, end to end: one sorted
        array, so one ``searchsorted`` of ``state + draw`` finds, for many states at once,
        the flat index ``state * words + word`` of the word drawn (at most ``MAX_STATES``
        rows keep ``state + draw`` within 1e-12 of the draw)."""
        return (self.cumulative + np.arange(self.num_states)[:, None]).ravel()

    @cached_property
    def _next_state(self) -> np.ndarray:
        """The state after each flat index ``state * words + word``, as floats (the next
        ``state + draw`` is one addition)."""
        return self.transitions.ravel().astype(np.float64)

    def _walk(self, uniform: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[steps, rows]`` words of ``rows`` streams from ``states`` (floats), one step
        per row of draws ``uniform`` (in ``[0, 1)``: each state's cumulative inverted at
        it), and the states after them."""
        found = np.empty(uniform.shape, dtype=np.int64)
        uniform = uniform * (1.0 - 1e-12)  # state + draw never rounds up to the next state
        for t in range(uniform.shape[0]):
            found[t] = np.searchsorted(self._shifted, states + uniform[t], side="right")
            states = self._next_state[found[t]]
        return found % len(self.words), states

    def _starts(self, rows: int) -> np.ndarray:
        return np.full(rows, float(self.start))

    def stream(self, rng: np.random.Generator, rows: int, length: int) -> np.ndarray:
        """``[rows, length]`` words: ``rows`` independent streams of sentences, each from
        the start state, ``<eos>`` after every sentence."""
        return self._walk(rng.random((length, rows)), self._starts(rows))[0].T

    def sentence_array(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``[count, T]`` words: ``count`` sentences from the start state, each ending with
        its ``<eos>`` and padded with ``<eos>`` to the longest (``T`` words)."""
        blocks, states, ended = [], self._starts(count), np.zeros(count, dtype=bool)
        while not ended.all():  # blocks of steps until every row has ended a sentence
            words, states = self._walk(rng.random((SENTENCE_STEPS, count)), states)
            blocks.append(words)
            ended |= (words == 0).any(axis=0)
        words = np.concatenate(blocks)
        ends = words == 0
        real = np.cumsum(ends, axis=0) - ends == 0  # no <eos> before
        width = int(real.sum(axis=0).max())
        return np.where(real, words, 0)[:width].T

    def sentences(self, rng: np.random.Generator, count: int) -> list[list[int]]:
        """``count`` sentences, each a list of word indices ending with ``<eos>``."""
        array = self.sentence_array(rng, count)
        lengths = (array != 0).sum(axis=1) + 1
        return [row[:length] for row, length in zip(array.tolist(), lengths.tolist())]

    def log_probability(self, words: list[int]) -> float:
        """The exact log-probability of word indices read from the start state (a
        sentence with its ``<eos>``, or several in a row)."""
        state, total = self.start, 0.0
        for word in words:
            total += float(self.log_probs[state, word])
            state = int(self.transitions[state, word])
        return total


def _next_words(
    grammar: ProbabilisticGrammar, stack: Stack, start: Stack
) -> dict[str, tuple[float, Stack]]:
    """Each next word from parser ``stack``: its probability and the stack after it."""
    out: dict[str, tuple[float, Stack]] = {}
    pending = [(stack, 1.0)]
    while pending:
        current, probability = pending.pop()
        if not current:
            word, after = EOS_WORD, start
        elif current[-1] in grammar.rules:
            rest = current[:-1]
            pending.extend(
                (rest + tuple(reversed(rhs)), probability * p)
                for p, rhs in grammar.rules[current[-1]]
            )
            continue
        else:
            word, after = current[-1], current[:-1]
        if word in out:
            raise GrammarError(f"two derivations put {word!r} after one prefix: not LL(1)")
        out[word] = (probability, after)
    return out
