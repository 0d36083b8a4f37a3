"""The true grammar as a causal language model: its exact next-word distribution.

``GrammarLM`` meets the model contract, so the harness scores it like any trained model
(tokenisation, ``<eos>``, windows, padding): a test checks that it reaches the true
grammar's exact NLL of a split, i.e. that evaluation adds no bias of its own, and it is the
ceiling a trained model's excess loss is measured against. Each row is read from its first
token: after an ``<eos>`` the grammar's start state; before any ``<eos>`` (a window cut
mid-sentence) it knows nothing and guesses uniformly until the next ``<eos>``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from experiments.data.grammar_automaton import TokenAutomaton
from experiments.data.tokenization import Tokenizer


class GrammarLM(nn.Module):
    """Logits ``log P(next word | the row so far)`` of ``automaton``, in ``tokenizer``'s ids."""

    is_causal = True

    def __init__(self, automaton: TokenAutomaton, tokenizer: Tokenizer) -> None:
        super().__init__()
        self.automaton = automaton
        grammar_ids = tokenizer.encode_words(list(automaton.words))
        self.vocab_size = tokenizer.vocab_size
        # Tokenizer id -> grammar word (a token the grammar lacks reads as impossible).
        to_word = np.full(self.vocab_size, -1, dtype=np.int64)
        to_word[grammar_ids] = np.arange(len(grammar_ids))
        self.to_word = to_word
        log_probs = np.full((automaton.num_states, self.vocab_size), -np.inf)
        log_probs[:, grammar_ids] = automaton.log_probs
        log_probs[automaton.sink] = -np.log(self.vocab_size)
        self.log_probs = torch.from_numpy(log_probs).float()

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        automaton, words = self.automaton, self.to_word[tokens.cpu().numpy()]
        # The state after each token: the start after <eos>, the sink after a first word
        # with no sentence start before it or a word foreign to the grammar.
        states = np.where(words[:, 0] == 0, automaton.start, automaton.sink)
        after = np.empty(words.shape, dtype=np.int64)
        after[:, 0] = states
        for t in range(1, words.shape[1]):
            word = words[:, t]
            states = np.where(
                word >= 0, automaton.transitions[states, np.maximum(word, 0)], automaton.sink
            )
            after[:, t] = states
        return self.log_probs[torch.from_numpy(after)].to(tokens.device), {}
