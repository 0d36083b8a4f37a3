"""A method is a tableau.

Every list of fixed-grid method names is computed from ``ode_transformer.TABLEAUX``; one
torchdiffeq solver class, ``TableauSolver``, steps any tableau without an entry in
torchdiffeq's solver registry; and every tableau runs on every model that takes a fixed-grid
method (``ode-lstm``'s ODE head, ``node-transformer``'s grids, the RK blocks), each checked
against mathematics: its order of convergence on ODEs with exact solutions, its stability
polynomial on a linear field, exact causality. The old paths (torchdiffeq's own solvers by
name, the classic RK4 registered as ``odelm_rk4``) give the same numbers to the last bit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import torchdiffeq
from torch import nn
from torchdiffeq._impl.misc import Perturb
from torchdiffeq._impl.odeint import SOLVERS
from torchdiffeq._impl.solvers import FixedGridODESolver

from experiments.evaluation import discretize
from neuralode_lm import build_model
from neuralode_lm.depth_field import GRID_METHODS, GRID_TABLEAUX, FixedGrid
from neuralode_lm.solvers import BACKEND_METHODS, FIXED_METHODS, solve
from neuralode_lm.solvers.config import fixed_grid
from ode_transformer import BLOCKS, METHODS, TABLEAUX, RKBlock, Tableau, rk_stage_values
from ode_transformer.tableau import solver_methods, weighted_sum

ORDERS = {"euler": 1, "midpoint": 2, "rk2": 2, "rk3": 3, "rk4": 4, "rk4_38": 4}


def test_every_method_list_is_computed_from_the_tableaux(monkeypatch: pytest.MonkeyPatch):
    assert METHODS == tuple(ORDERS)
    assert {name: TABLEAUX[name].order() for name in METHODS} == ORDERS
    assert FIXED_METHODS == frozenset(METHODS) and GRID_METHODS == METHODS
    assert GRID_TABLEAUX == {name: TABLEAUX[name] for name in METHODS}
    for backend in ("torchdiffeq", "torchdyn", "torchode"):
        assert FIXED_METHODS <= BACKEND_METHODS[backend]
    assert {name: (name, "fixed") for name in TABLEAUX}.items() <= BLOCKS.items()
    # odelm discretize: one method of each order, the first by name
    assert discretize.GRID_METHODS == ("euler", "midpoint", "rk3", "rk4")
    # a new method is a new tableau (Ralston's second-order method); an inconsistent one
    # (weights summing to 2) is a block, not a method
    ralston = Tableau(A=((0.0, 0.0), (2 / 3, 0.0)), b=(0.25, 0.75), name="ralston")
    monkeypatch.setitem(TABLEAUX, "ralston", ralston)
    assert "ralston" in solver_methods() and "rk2_gamma1" not in solver_methods()
    assert "residual" not in solver_methods()  # an alias of euler


def test_torchdiffeq_registry_holds_only_torchdiffeq_solvers():
    y0 = torch.ones(1, 2, dtype=torch.float64)
    for method in METHODS:
        for adjoint in (False, True):
            solve(Linear(), y0, [0.0, 1.0], method=method, step_size=0.5, adjoint=adjoint)
    assert all(cls.__module__.startswith("torchdiffeq.") for cls in SOLVERS.values())


# -- the old paths, bit for bit ------------------------------------------------------------


class OldClassicRK4(FixedGridODESolver):
    """The classic RK4 as it was registered with torchdiffeq (``odelm_rk4``) before."""

    order = 4
    tableau = TABLEAUX["rk4"]

    def _step_func(self, func, t0, dt, t1, y0):
        first = Perturb.NEXT if self.perturb else Perturb.NONE
        c = self.tableau.c

        def stage(i, y):
            return func(t0, y, perturb=first) if i == 0 else func(t0 + c[i] * dt, y)

        values = rk_stage_values(self.tableau, stage, y0, dt)
        return weighted_sum(None, self.tableau.b, values, dt), values[0]


OLD_NAMES = {"euler": "euler", "midpoint": "midpoint", "rk4": "odelm_rk4", "rk4_38": "rk4"}
"""How the facade's four fixed-grid names reached torchdiffeq before."""


class Field(nn.Module):
    """A nonlinear, time-dependent field with parameters."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.lin = nn.Linear(3, 3).to(dtype)

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(z)) * (1 + s) - 0.3 * z


MIXED = [("rk4", "rk4_38"), ("rk4_38", "rk4"), ("euler", "rk4"), ("midpoint", "euler")]


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")  # the facade's t
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("method", "adjoint", "adjoint_method"),
    [(m, adjoint, None) for m in OLD_NAMES for adjoint in (False, True)]
    + [(m, True, a) for m, a in MIXED],
)
def test_old_methods_give_the_old_numbers_to_the_last_bit(
    monkeypatch: pytest.MonkeyPatch, dtype, method, adjoint, adjoint_method
):
    """Direct and adjoint solves (forward states, gradients of ``y0`` and the parameters),
    float32 and float64: the new path against torchdiffeq's solvers by name as before."""
    monkeypatch.setitem(SOLVERS, "odelm_rk4", OldClassicRK4)  # the old path, for this test
    options = {"grid_constructor": lambda func, y, times: fixed_grid(times, 0.2)}

    def run(new: bool) -> list[torch.Tensor]:
        field = Field(dtype)
        torch.manual_seed(4)
        y0 = torch.randn(2, 3, dtype=dtype, requires_grad=True)
        t = torch.tensor([0.0, 0.7, 1.3], dtype=dtype, requires_grad=adjoint)  # adjoint: dL/dt
        if new:
            config = {"method": method, "step_size": 0.2, "adjoint": adjoint}
            states, _ = solve(field, y0, t, adjoint_method=adjoint_method, **config)
        elif adjoint:
            states = torchdiffeq.odeint_adjoint(
                field,
                y0,
                t,
                rtol=1e-3,
                atol=1e-4,
                method=OLD_NAMES[method],
                options=options,
                adjoint_method=OLD_NAMES[adjoint_method or method],
                adjoint_options=dict(options),
            )
        else:
            states = torchdiffeq.odeint(field, y0, t, method=OLD_NAMES[method], options=options)
        (states**2).sum().backward()
        return [states.detach(), y0.grad, *(p.grad for p in field.parameters()), t.grad]

    new, old = run(new=True), run(new=False)
    assert (new[-1] is None) == (old[-1] is None) == (not adjoint)
    assert all(a is None or torch.equal(a, b) for a, b in zip(new, old, strict=True))


# -- every method's order, on every path that steps a tableau -------------------------------


class Linear(nn.Module):
    """``y' = a y``; ``y(T) = y0 e^{aT}``, ``dy(T)/da = T y(T)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(-0.8, dtype=torch.float64))

    def forward(self, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a * y


def nonautonomous(s: torch.Tensor | float, y: torch.Tensor) -> torch.Tensor:
    """``y1' = y1 cos s``, ``y2' = -s y2``: ``y(s) = (e^{sin s}, e^{-s^2/2})`` from ``(1, 1)``."""
    s = torch.as_tensor(s, dtype=y.dtype)
    return torch.stack([y[..., 0] * torch.cos(s), -s * y[..., 1]], dim=-1)


EXACT = torch.tensor([[math.exp(math.sin(1.0)), math.exp(-0.5)]], dtype=torch.float64)


def observed_order(error: Callable[[int], float]) -> float:
    """``log2(e(n) / e(2n))`` at ``n = 16``: the order of a method of global error ``C h^p``."""
    return math.log2(error(16) / error(32))


@pytest.mark.parametrize("method", METHODS)
def test_each_method_converges_at_its_order_on_every_path(method: str):
    """Through the solver facade (torchdiffeq, TorchDyn, torchode), ``node-transformer``'s
    fixed grid and a chain of RK blocks, on ``[0, 1]`` with ``n`` equal steps."""
    p = ORDERS[method]
    y0 = torch.ones(3, 2, dtype=torch.float64)  # torchode: three rows, each its own steps

    def facade(backend: str) -> Callable[[int], float]:
        def error(n: int) -> float:
            states, stats = solve(
                nonautonomous, y0, 1.0, method=method, step_size=1 / n, backend=backend
            )
            assert stats.nfe_forward == n * TABLEAUX[method].stages
            return float((states[-1] - EXACT).abs().max())

        return error

    def grid(n: int) -> float:
        return float((FixedGrid(method, n).integrate(nonautonomous, y0, 1.0) - EXACT).abs().max())

    def blocks(n: int) -> float:
        """``y' = y (1 - y)``: a block of ``F = f / n`` is one step of size ``1/n``."""
        block = RKBlock(lambda y: y * (1 - y) / n, method)
        y = torch.full((1, 1), 0.25, dtype=torch.float64)
        for _ in range(n):
            y = block(y)
        return abs(float(y) - 1 / (1 + 3 * math.exp(-1.0)))

    for path in (facade("torchdiffeq"), facade("torchdyn"), facade("torchode"), grid, blocks):
        assert observed_order(path) == pytest.approx(p, abs=0.1)


@pytest.mark.parametrize("method", METHODS)
def test_the_adjoint_of_each_method_converges_to_the_exact_gradient(method: str):
    """torchdiffeq's backsolve adjoint of every tableau (``FixedGridAdjoint``, or
    torchdiffeq's own for ``rk4_38``): ``d y(1) / d a = y(1)`` for ``y' = a y``, ``y0 = 1``,
    with an error of the method's order."""

    def error(n: int) -> float:
        field = Linear()
        y0 = torch.ones(1, 1, dtype=torch.float64, requires_grad=True)
        states, _ = solve(field, y0, 1.0, method=method, step_size=1 / n, adjoint=True)
        states[-1].sum().backward()
        exact = math.exp(float(field.a.detach()))
        return abs(float(field.a.grad) - exact) + abs(float(y0.grad) - exact)

    assert observed_order(error) == pytest.approx(ORDERS[method], abs=0.1)


@pytest.mark.parametrize("name", sorted(TABLEAUX))
def test_each_tableau_as_an_rk_block_is_its_stability_polynomial(name: str):
    """On ``F(y) = M y`` one block maps ``y`` to ``R(M) y``, ``R`` the tableau's stability
    polynomial: every tableau, the inconsistent ``rk2_gamma1`` included."""
    torch.manual_seed(0)
    m = 0.3 * torch.randn(4, 4, dtype=torch.float64)
    y = torch.randn(2, 4, dtype=torch.float64)
    expected, power = torch.zeros_like(y), y
    for coefficient in TABLEAUX[name].stability_polynomial():
        expected, power = expected + coefficient * power, power @ m.T
    block = BLOCKS.get(name, (name, "fixed"))
    assert torch.allclose(RKBlock(lambda z: z @ m.T, *block)(y), expected, rtol=0, atol=1e-14)


# -- every method on every model that takes a fixed-grid method ----------------------------


@pytest.mark.parametrize("method", METHODS)
def test_each_method_runs_the_ode_lstm_head_by_its_tableau(method: str):
    """``ode-lstm``'s logits are the readout of ``S / h`` steps of the method's tableau from
    each position's LSTM state (written out here), with ``steps * stages`` evaluations."""
    torch.manual_seed(0)
    solver = {"method": method, "step_size": 0.5}
    model = build_model("ode-lstm", 17, embed_dim=8, hidden_dim=8, field_hidden=8, solver=solver)
    model = model.double().eval()
    tokens = torch.randint(0, 17, (2, 5))
    logits, aux = model(tokens)
    assert aux["nfe"] == 2 * TABLEAUX[method].stages
    head, tableau = model.head, TABLEAUX[method]
    y = model.encoder.forward_with_state(tokens, None)[0].reshape(10, 8)
    for n in range(2):
        values = rk_stage_values(
            tableau, lambda i, z, n=n: head.field(torch.tensor(0.5 * (n + tableau.c[i])), z), y, 0.5
        )
        y = y + 0.5 * sum(b * v for b, v in zip(tableau.b, values))
    assert torch.allclose(logits, head.proj(y).view(2, 5, 17), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_each_method_runs_node_transformer_exactly_causally(method: str):
    """A fixed grid of any tableau: ``n_layers * steps * stages`` evaluations, and a later
    token leaves every earlier position's logits bit for bit unchanged."""
    torch.manual_seed(0)
    model = build_model(
        "node-transformer", 19, d_model=8, n_heads=2, d_ff=16, n_layers=2,
        max_positions=16, solver={"method": method}, steps=2,
    ).eval()  # fmt: skip
    tokens = torch.randint(0, 19, (2, 8))
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 19
    with torch.no_grad():
        logits, _ = model(tokens)
        assert model.solver_stats.nfe_forward == 2 * 2 * TABLEAUX[method].stages
        assert torch.equal(model(changed)[0][:, :5], logits[:, :5])


def test_rk3_trains_an_ode_lstm():
    """The method that ``ode-lstm`` refused before: a few Adam steps lower the loss."""
    torch.manual_seed(0)
    solver = {"method": "rk3", "step_size": 0.25}
    model = build_model("ode-lstm", 13, embed_dim=8, hidden_dim=8, field_hidden=8, solver=solver)
    tokens = torch.randint(0, 13, (4, 9))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(15):
        logits, _ = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 13), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert model.head.solver.method == "rk3"
    assert losses[-1] < 0.8 * losses[0]
    assert all(b < a for a, b in itertools.pairwise(losses))
