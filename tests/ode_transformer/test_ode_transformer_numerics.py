"""Numerical checks of ode_transformer's tableaux, RK blocks and stacks against mathematics."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchdiffeq import odeint

from ode_transformer import (
    BLOCKS,
    TABLEAUX,
    DLCLStack,
    LayerStack,
    LeapfrogStack,
    MultistepStack,
    PolyNetStack,
    RKBlock,
    Tableau,
    make_block,
)

# Stability polynomials written out by hand (not taken from Tableau.stability_polynomial).
KNOWN_POLYNOMIALS = {
    "residual": [1, 1],
    "rk2": [1, 1, 1 / 2],
    "rk2_gamma1": [1, 2, 1],
    "rk2_learnable": [1, 2, 1],  # gamma initialised to 1
    "rk3": [1, 1, 1 / 2, 1 / 6],
    "rk4": [1, 1, 1 / 2, 1 / 6, 1 / 24],
}


def matrix_polynomial(coeffs: list[float], M: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``sum_k coeffs[k] M^k y`` for row vectors ``y`` (``F(y) = y M^T``)."""
    out, power = torch.zeros_like(y), y
    for c in coeffs:
        out = out + c * power
        power = power @ M.T
    return out


def linear_f(d: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    f = nn.Linear(d, d, bias=False).double()
    with torch.no_grad():
        f.weight.mul_(0.7)
    return f


@pytest.mark.parametrize("name", sorted(KNOWN_POLYNOMIALS))
def test_linear_f_gives_stability_polynomial(name: str) -> None:
    f = linear_f(6, seed=1)
    block = make_block(name, f).double()
    y = torch.randn(5, 6, dtype=torch.float64)
    expected = matrix_polynomial(KNOWN_POLYNOMIALS[name], f.weight, y)
    torch.testing.assert_close(block(y), expected, rtol=1e-13, atol=1e-13)
    if name != "rk2_learnable":
        assert block.tableau.stability_polynomial() == pytest.approx(KNOWN_POLYNOMIALS[name])


def test_user_tableau_with_linear_f() -> None:
    # Ralston's RK2: a21 = 2/3, b = (1/4, 3/4) -> R(z) = 1 + z + z^2 / 2.
    # A 3-stage non-standard tableau: R(z) = 1 + (sum b) z + (b.c) z^2 + (b.A c) z^3.
    ralston = Tableau(A=[[0, 0], [2 / 3, 0]], b=[1 / 4, 3 / 4])
    odd = Tableau(A=[[0, 0, 0], [0.3, 0, 0], [0.2, -0.5, 0]], b=[0.1, 0.7, 0.4])
    b, c = odd.b, odd.c
    hand = [1, sum(b), sum(bi * ci for bi, ci in zip(b, c)), b[2] * odd.A[2][1] * c[1]]
    assert odd.stability_polynomial() == pytest.approx(hand)
    f = linear_f(4, seed=2)
    y = torch.randn(3, 4, dtype=torch.float64)
    for tableau, coeffs in ((ralston, [1, 1, 0.5]), (odd, hand)):
        out = RKBlock(f, (tableau.A, tableau.b))(y)
        torch.testing.assert_close(
            out, matrix_polynomial(coeffs, f.weight, y), rtol=1e-13, atol=1e-13
        )


def test_tableau_orders() -> None:
    expected = {"residual": 1, "rk2": 2, "rk2_gamma1": 0, "rk3": 3, "rk4": 4}
    assert {name: TABLEAUX[name].order() for name in expected} == expected
    assert Tableau(A=[[0, 0], [2 / 3, 0]], b=[1 / 4, 3 / 4]).order() == 2


class SmoothField(nn.Module):
    """A fixed smooth nonlinear map g(y) = tanh(y W1^T) W2^T - 0.5 sin(y)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.W1 = torch.randn(d, d, generator=generator, dtype=torch.float64) / math.sqrt(d)
        self.W2 = torch.randn(d, d, generator=generator, dtype=torch.float64) / math.sqrt(d)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(y @ self.W1.T) @ self.W2.T - 0.5 * torch.sin(y)


@pytest.mark.parametrize(
    ("name", "order", "steps"),
    [
        ("residual", 1, [16, 32, 64, 128]),
        ("rk2", 2, [8, 16, 32, 64]),
        ("rk3", 3, [8, 16, 32, 64]),
        ("rk4", 4, [4, 8, 16, 32]),
    ],
)
def test_convergence_order(name: str, order: int, steps: list[int]) -> None:
    g = SmoothField(5)
    y0 = torch.linspace(-1.0, 1.0, 5, dtype=torch.float64)[None]
    times = torch.tensor([0.0, 1.0], dtype=torch.float64)
    reference = odeint(lambda t, y: g(y), y0, times, method="dopri8", rtol=1e-13, atol=1e-13)[-1]
    errors = []
    for n in steps:
        h = 1.0 / n
        block = make_block(name, lambda y, h=h: h * g(y))  # F = h g: one RK step of size h
        y = y0
        for _ in range(n):
            y = block(y)
        errors.append((y - reference).abs().max().item())
    slope = (
        -torch.linalg.lstsq(
            torch.tensor([[math.log(1 / n), 1.0] for n in steps], dtype=torch.float64),
            torch.tensor([[math.log(e)] for e in errors], dtype=torch.float64),
        )
        .solution[0, 0]
        .item()
    )
    assert abs(-slope - order) < 0.3, f"{name}: errors {errors}, fitted order {-slope:.2f}"


def test_learnable_scalars_and_gate() -> None:
    f = linear_f(6, seed=4)
    y = torch.randn(7, 6, dtype=torch.float64)
    F1 = f(y)
    F2 = f(y + F1)
    learnable = make_block("rk2_learnable", f).double()
    with torch.no_grad():
        learnable.gamma.copy_(torch.tensor([0.3, -1.2]))
    torch.testing.assert_close(learnable(y), y + 0.3 * F1 - 1.2 * F2)

    gate = make_block("rk2_gate", f, d_model=6).double()
    assert sum(p.numel() for p in gate.gate.parameters()) == 2 * 6 + 1
    with torch.no_grad():  # zero gate -> g = 1/2 -> the RK2 (improved Euler) block
        gate.gate.weight.zero_()
        gate.gate.bias.zero_()
    torch.testing.assert_close(gate(y), y + 0.5 * F1 + 0.5 * F2)
    with torch.no_grad():
        gate.gate.weight.normal_()
        gate.gate.bias.fill_(0.4)
    g = torch.sigmoid(torch.cat([F1, F2], dim=-1) @ gate.gate.weight.T + 0.4)
    torch.testing.assert_close(gate(y), y + g * F1 + (1 - g) * F2)


class LinearLayer(nn.Module):
    """A stand-in layer with ``increment(y) = y M^T`` to check the stack equations."""

    nfe = 1

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d, bias=False).double()

    def increment(
        self, y: torch.Tensor, cache: None = None, padding_mask: None = None
    ) -> torch.Tensor:
        return self.linear(y)


def test_stack_equations() -> None:
    torch.manual_seed(5)
    d, n = 4, 4
    layers = [LinearLayer(d) for _ in range(n)]
    Fs = [layer.linear for layer in layers]
    y0 = torch.randn(3, d, dtype=torch.float64)

    ys = [y0]
    for f in Fs:
        ys.append(ys[-1] + f(ys[-1]))
    torch.testing.assert_close(LayerStack(layers)(y0), ys[-1])

    ys = [y0, y0 + Fs[0](y0)]
    for f in Fs[1:]:
        ys.append(ys[-2] + 2 * f(ys[-1]))
    torch.testing.assert_close(LeapfrogStack(layers)(y0), ys[-1])

    multistep = MultistepStack(layers).double()
    torch.testing.assert_close(multistep(y0), LayerStack(layers)(y0))  # k = 1 at init
    with torch.no_grad():
        multistep.k.copy_(torch.tensor([0.3, 1.7, -0.2]))
    ys = [y0, y0 + Fs[0](y0)]
    for k, f in zip([0.3, 1.7, -0.2], Fs[1:]):
        ys.append(k * ys[-1] + (1 - k) * ys[-2] + f(ys[-1]))
    torch.testing.assert_close(multistep(y0), ys[-1])

    dlcl = DLCLStack(layers).double()
    torch.testing.assert_close(dlcl(y0), LayerStack(layers)(y0))  # W = 1 at init
    with torch.no_grad():
        dlcl.weights.normal_()
    W = torch.zeros(n, n, dtype=torch.float64)
    W[tuple(torch.tril_indices(n, n))] = dlcl.weights.detach()
    ys, increments = [y0], []
    for t, f in enumerate(Fs):
        increments.append(f(ys[-1]))
        ys.append(y0 + sum(W[t, i] * increments[i] for i in range(t + 1)))
    torch.testing.assert_close(dlcl(y0), ys[-1])

    y = y0
    for f in Fs:
        y = y + f(y) + f(f(y))
    torch.testing.assert_close(PolyNetStack(layers)(y0), y)


def test_every_named_block_builds() -> None:
    f = linear_f(4, seed=6)
    for name in BLOCKS:
        block = make_block(name, f, d_model=4).double()
        assert block(torch.randn(2, 4, dtype=torch.float64)).shape == (2, 4)
