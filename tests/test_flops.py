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
