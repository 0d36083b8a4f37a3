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
MAX_STATES = 200_000
"""More parser stacks than this: the grammar's stack is unbounded, no table for it."""

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
        array, so one ``searchsorted`` draws a word for many states at once."""
        return (self.cumulative + np.arange(self.num_states)[:, None]).ravel()

    def draw(self, states: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """One word for each of ``states`` from its next-word distribution, by inverting
        its cumulative at ``uniform`` (draws in ``[0, 1)``): the words whose cumulative is
        at most the draw, counted."""
        found = np.searchsorted(self._shifted, states + uniform, side="right")
        return found - states * len(self.words)

    def stream(self, rng: np.random.Generator, rows: int, length: int) -> np.ndarray:
        """``[rows, length]`` words: ``rows`` independent streams of sentences, each from
        the start state, ``<eos>`` after every sentence."""
        out = np.empty((length, rows), dtype=np.int64)
        states = np.full(rows, self.start, dtype=np.int64)
        uniform = rng.random((length, rows))
        for t in range(length):
            out[t] = words = self.draw(states, uniform[t])
            states = self.transitions[states, words]
        return out.T

    def sentences(self, rng: np.random.Generator, count: int) -> tuple[list[list[int]], float]:
        """``count`` sentences (word indices, ``<eos>`` included) and their total
        log-probability (the sum of every word's exact conditional)."""
        states = np.full(count, self.start, dtype=np.int64)
        active = np.arange(count)
        columns: list[tuple[np.ndarray, np.ndarray]] = []
        total = 0.0
        while active.size:
            words = self.draw(states[active], rng.random(active.size))
            total += float(self.log_probs[states[active], words].sum())
            columns.append((active, words))
            states[active] = self.transitions[states[active], words]
            active = active[words != 0]
        out: list[list[int]] = [[] for _ in range(count)]
        for rows, words in columns:
            for row, word in zip(rows.tolist(), words.tolist()):
                out[row].append(word)
        return out, total

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
