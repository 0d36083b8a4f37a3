"""FLOPs per token against the closed form of a linear model."""

import torch
from torch import nn

from experiments.flops import forward_flops_per_token


class LinearLM(nn.Module):
    is_causal = True

    def __init__(self, vocab: int = 10, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor):
        return self.out(self.embed(tokens)), {}


def test_flops_per_token_equals_closed_form():
    tokens = torch.randint(0, 10, (3, 5))
    # one [8 -> 10] matmul per position (2 * 8 * 10 FLOPs), 15 positions, 12 predicted
    assert forward_flops_per_token(LinearLM(), [tokens]) == 2 * 8 * 10 * 15 / 12


def test_flops_per_token_counts_only_real_predicted_tokens():
    tokens = torch.randint(0, 10, (2, 4))
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    # 8 positions are run; predicted real tokens: 3 in row 0, 1 in row 1
    assert forward_flops_per_token(LinearLM(), [(tokens, mask)]) == 2 * 8 * 10 * 8 / 4


class LSTMLM(nn.Module):
    is_causal = True

    def __init__(self, vocab: int = 10, width: int = 8, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor):
        return self.out(self.lstm(self.embed(tokens))[0]), {}


def test_flops_per_token_adds_the_fused_lstm_in_closed_form():
    tokens = torch.randint(0, 10, (3, 5))
    # per position: layer 1 2*4*6*(8+6), layer 2 2*4*6*(6+6), output 2*6*10; 15 run, 12 predicted
    per_position = 2 * 4 * 6 * (8 + 6) + 2 * 4 * 6 * (6 + 6) + 2 * 6 * 10
    assert forward_flops_per_token(LSTMLM(), [tokens]) == per_position * 15 / 12
