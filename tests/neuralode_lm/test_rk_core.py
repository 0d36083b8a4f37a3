"""One Runge-Kutta core and one method vocabulary.

``rk4`` is the classic RK4 on an ODE head (the solver facade, every backend) and on
``node-transformer``'s fixed grids; ``rk4_38`` is the 3/8 rule (torchdiffeq's ``rk4``). The
field ``y' = y^2 + t^3`` is nonlinear and time-dependent, so the two rules give different
numbers, each checked against a step written out by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neuralode_lm import CausalODEHead, NODETransformerLM, SolverConfig, solve
from neuralode_lm.depth_field import FixedGrid
from neuralode_lm.errors import ModelConfigError
from neuralode_lm.solvers.errors import UnknownSolverOptionError
from ode_transformer import TABLEAUX, ODETransformerConfigError, make_block, rk_step
from odelm.errors import OdelmError

Y0, H = 0.5, 1.0


def f(t: float, y: float) -> float:
    return y * y + t**3


def classic_rk4(y: float, h: float, f=f) -> float:
    """One classic RK4 step of ``y' = f(t, y)`` from ``t = 0``, written out."""
    k1 = f(0.0, y)
    k2 = f(h / 2, y + h / 2 * k1)
    k3 = f(h / 2, y + h / 2 * k2)
    k4 = f(h, y + h * k3)
    return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def three_eighths(y: float, h: float) -> float:
    """One step of Kutta's 3/8 rule from ``t = 0``, written out."""
    k1 = f(0.0, y)
    k2 = f(h / 3, y + h / 3 * k1)
    k3 = f(2 * h / 3, y + h * (-k1 / 3 + k2))
    k4 = f(h, y + h * (k1 - k2 + k3))
    return y + h / 8 * (k1 + 3 * k2 + 3 * k3 + k4)


CLASSIC, RULE_38 = classic_rk4(Y0, H), three_eighths(Y0, H)


class Field(nn.Module):
    """``dy/dt = y^2 + t^3`` as a module (``s`` a float or a 0-d tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, s: torch.Tensor | float, y: torch.Tensor) -> torch.Tensor:
        return self.scale * y * y + torch.as_tensor(s, dtype=y.dtype) ** 3


def y0() -> torch.Tensor:
    return torch.full((1, 1), Y0, dtype=torch.float64)


def test_the_hand_written_rules_differ_on_this_field():
    assert abs(CLASSIC - RULE_38) > 1e-3


@pytest.mark.parametrize(("method", "expected"), [("rk4", CLASSIC), ("rk4_38", RULE_38)])
def test_an_ode_head_and_node_transformer_run_the_same_tableau(method, expected):
    head = CausalODEHead(1, 1, field=Field(), solver={"method": method, "step_size": H})
    head = head.double().eval()
    with torch.no_grad():
        head.proj.weight.fill_(1.0)
        head.proj.bias.zero_()
        logits, _ = head(y0().view(1, 1, 1))
    assert logits.item() == pytest.approx(expected, rel=1e-12)

    model = NODETransformerLM(7, d_model=8, n_heads=2, d_ff=16, solver={"method": method})
    assert model.integration == FixedGrid(method, 1)
    grid = model.integration.integrate(Field(), y0(), model.integration_time)
    assert grid.item() == pytest.approx(expected, rel=1e-12)


def test_rk4_is_the_classic_rule_on_every_backend_and_under_the_adjoint():
    t = torch.tensor([0.0, H], dtype=torch.float64)
    for backend, adjoint in (("torchdiffeq", False), ("torchdyn", False), ("torchdiffeq", True)):
        options = {"method": "rk4", "step_size": H, "backend": backend, "adjoint": adjoint}
        states, _ = solve(Field(), y0(), t, **options)
        assert states[-1].item() == pytest.approx(CLASSIC, rel=1e-12), backend
    states, _ = solve(Field(), y0(), t, method="rk4_38", step_size=H, adjoint=True)
    assert states[-1].item() == pytest.approx(RULE_38, rel=1e-12)


def test_the_core_steps_with_any_step_size_and_is_what_the_blocks_run():
    h = 0.25
    step = rk_step(TABLEAUX["rk4"], lambda i, y: Field()(TABLEAUX["rk4"].c[i] * h, y), y0(), h)
    assert step.item() == pytest.approx(classic_rk4(Y0, h), rel=1e-12)
    block = make_block("rk4", lambda y: y * y)  # autonomous, step size 1
    expected = classic_rk4(Y0, 1.0, lambda t, y: y * y)
    assert block(y0()).item() == pytest.approx(expected, rel=1e-12)


def test_node_transformer_grids_take_the_facade_step_size():
    def tiny(**options):
        return NODETransformerLM(7, d_model=8, n_heads=2, d_ff=16, **options)

    assert tiny(solver={"method": "rk4", "step_size": 0.5}).integration == FixedGrid("rk4", 2)
    long = tiny(integration_time=2.0, solver={"method": "rk4_38", "step_size": 0.6})
    assert long.integration == FixedGrid("rk4_38", 4)  # fewest steps no longer than 0.6
    with pytest.raises(ModelConfigError, match="not both"):
        tiny(solver={"method": "rk4", "step_size": 0.5}, steps=2)


def test_unknown_names_and_the_other_step_setting_are_one_clear_error():
    with pytest.raises(ODETransformerConfigError, match=r"unknown block 'rk5'; valid: .*rk4"):
        make_block("rk5", lambda y: y)
    with pytest.raises(ModelConfigError, match=r"unknown fixed-grid method 'rk5'; valid: .*rk4_38"):
        FixedGrid("rk5")
    with pytest.raises(OdelmError, match=r"unknown method 'rk5'; valid: .*rk4, rk4_38"):
        SolverConfig(method="rk5", step_size=0.1)
    with pytest.raises(UnknownSolverOptionError, match="step_size"):
        SolverConfig.coerce({"method": "rk4", "steps": 4})
