"""Runge-Kutta Transformer blocks driven by a Butcher tableau (ODE Transformer eq. 8-11, 25-26).

A block owns one function ``F`` (one set of parameters theta, shared by all stages) and
advances the residual stream by one explicit RK step with step size 1:
``F_i = F(y + sum_j A[i][j] F_j)``, ``y_next = y + sum_i w_i F_i``. The weights ``w`` are
the tableau's ``b`` ("fixed"), learnable scalars initialised to ``b`` ("learnable"), or for
two stages the sigmoid gate ``g = sigmoid([F_1, F_2] W + c)``, ``w = (g, 1 - g)`` ("gate").

``F`` is any callable ``F(y) -> increment``; for Transformer sub-layers it is one of
``ode_transformer.layers``, called as ``F(y, context.child(i))`` when a cache or mask is
in play ([`AttentionContext`][ode_transformer.AttentionContext]), so stage ``i`` attends with
its own key/value cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .errors import ODETransformerConfigError
from .layers import NO_CONTEXT, AttentionContext
from .tableau import TABLEAUX, Tableau, get_tableau, rk_stage_values, weighted_sum

COEFFICIENTS = ("fixed", "learnable", "gate")

VARIANTS: dict[str, tuple[str, str]] = {
    "rk2_learnable": ("rk2_gamma1", "learnable"),
    "rk2_gate": ("rk2", "gate"),
}
"""Blocks whose weights are not the tableau's ``b``: name -> (tableau name, coefficient mode)."""

BLOCKS: dict[str, tuple[str, str]] = {name: (name, "fixed") for name in TABLEAUX} | VARIANTS
"""Named blocks of DESIGN.md's table: name -> (tableau name, coefficient mode); a fixed-weight
block for every tableau of [`TABLEAUX`][ode_transformer.TABLEAUX] and the ``VARIANTS``."""


class RKBlock(nn.Module):
    """One explicit Runge-Kutta step ``y -> y + sum_i w_i F_i`` with a shared ``F``."""

    def __init__(
        self,
        f: Callable[..., torch.Tensor],
        tableau: str | Tableau | tuple = "residual",
        coefficients: str = "fixed",
        d_model: int | None = None,
    ) -> None:
        super().__init__()
        if coefficients not in COEFFICIENTS:
            raise ODETransformerConfigError(
                f"unknown coefficients {coefficients!r}; valid: {', '.join(COEFFICIENTS)}"
            )
        self.f = f
        self.tableau = get_tableau(tableau)
        self.coefficients = coefficients
        self.gamma: nn.Parameter | None = None
        self.gate: nn.Linear | None = None
        if coefficients == "learnable":
            self.gamma = nn.Parameter(torch.tensor(self.tableau.b))
        elif coefficients == "gate":
            if self.tableau.stages != 2:
                raise ODETransformerConfigError(
                    f"the sigmoid gate weighs two stages (g, 1 - g) but tableau "
                    f"{self.tableau.name!r} has {self.tableau.stages}; use a 2-stage tableau"
                )
            if d_model is None:
                raise ODETransformerConfigError(
                    "coefficients='gate' needs d_model (the gate maps 2*d_model -> 1)"
                )
            self.gate = nn.Linear(2 * d_model, 1)

    @property
    def stages(self) -> int:
        """Evaluations of ``F`` per block."""
        return self.tableau.stages

    def stage_values(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> list[torch.Tensor]:
        """The stage derivatives ``[F_1, ..., F_s]`` at ``y`` (step size 1)."""
        if context.is_empty:  # a plain callable F(y) works too
            return rk_stage_values(self.tableau, lambda i, y_i: self.f(y_i), y)
        return rk_stage_values(self.tableau, lambda i, y_i: self.f(y_i, context.child(i)), y)

    def increment(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        """``y_next - y = sum_i w_i F_i`` (the block's update without the residual)."""
        values = self.stage_values(y, context)
        if self.gate is not None:
            g = torch.sigmoid(self.gate(torch.cat(values, dim=-1)))
            return g * values[0] + (1.0 - g) * values[1]
        if self.gamma is not None:
            total = self.gamma[0] * values[0]
            for i in range(1, len(values)):
                total = total + self.gamma[i] * values[i]
            return total
        total = weighted_sum(None, self.tableau.b, values)
        return torch.zeros_like(y) if total is None else total

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        if self.coefficients == "fixed":  # accumulate onto y directly: one op per stage
            return weighted_sum(y, self.tableau.b, self.stage_values(y, context))
        return y + self.increment(y, context)

    def extra_repr(self) -> str:
        return (
            f"tableau={self.tableau.name}, stages={self.stages}, coefficients={self.coefficients}"
        )


def check_block_name(block: str | None) -> None:
    """The one check of a block name (``make_block``'s and ``ODETransformerConfig``'s)."""
    if block not in BLOCKS:
        raise ODETransformerConfigError(
            f"unknown block {block!r}; valid: {', '.join(BLOCKS)} "
            "(or pass tableau=(A, b) for your own explicit Runge-Kutta method)"
        )


def make_block(
    block: str | Tableau | tuple, f: Callable[..., torch.Tensor], d_model: int | None = None
) -> RKBlock:
    """An [`RKBlock`][ode_transformer.RKBlock] from a name in [`BLOCKS`][ode_transformer.BLOCKS] or
    a user tableau (fixed weights)."""
    if isinstance(block, str):
        check_block_name(block)
        tableau, coefficients = BLOCKS[block]
        return RKBlock(f, tableau, coefficients, d_model)
    return RKBlock(f, block, "fixed", d_model)
