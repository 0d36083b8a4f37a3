"""The depth vector field of the continuous-depth Transformer and its fixed-grid integrator.

``DepthField`` is ``F_theta(s, y)``: the ODE Transformer's pre-norm attention + FFN function
([`ode_transformer.layers.PreNormAttentionFFN`][ode_transformer.PreNormAttentionFFN], never
including the residual), optionally conditioned on the depth ``s``. ``FixedGrid`` integrates it by
an explicit Runge-Kutta tableau with equal steps, giving each (step, stage) its own key/value cache.
Tableaux and the stage loop are the library's one RK core (``ode_transformer.tableau``):
``rk4`` is the classic RK4 (``rk4_38`` the 3/8 rule), so one step over one unit of depth is an
ODE Transformer RK4 block. Depth-dependent weights (``weights``, ``hypernetwork``) live in
``neuralode_lm.depth_weights``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import torch
from torch import nn

from ode_transformer.layers import AttentionContext, KVCache, PreNormAttentionFFN
from ode_transformer.tableau import METHODS, TABLEAUX, Tableau, rk_step
from odelm.checkpointing import Checkpointable

from .configs import TimeConditioning
from .depth_weights import DepthWeights
from .errors import ModelConfigError

__all__ = [
    "GRID_METHODS",
    "GRID_TABLEAUX",
    "TIME_CONDITIONINGS",
    "DepthField",
    "FixedGrid",
    "MaskedField",
]

TIME_CONDITIONINGS = typing.get_args(TimeConditioning)
GRID_METHODS = METHODS
GRID_TABLEAUX: dict[str, Tableau] = {name: TABLEAUX[name] for name in GRID_METHODS}
"""Fixed-grid methods the model integrates itself: ``ode_transformer.METHODS``, the
consistent tableaux of the one registry ``TABLEAUX``."""


class _TimedNorm(nn.Module):
    """A LayerNorm whose output is conditioned on the depth ``s`` set by the field.

    ``concat``: ``LN(y) + s u`` (the time as an extra input channel of the sub-layer's first
    linear maps, which is what concatenating ``s`` amounts to); ``film``:
    ``LN(y) (1 + g(s)) + h(s)`` with ``[g, h]`` linear in ``s``. Both start at zero, so an
    untrained conditioned field equals the autonomous one.
    """

    def __init__(self, norm: nn.LayerNorm, mode: str) -> None:
        super().__init__()
        self.norm, self.mode = norm, mode
        width = norm.normalized_shape[0]
        self.time = nn.Linear(1, width if mode == "concat" else 2 * width)
        nn.init.zeros_(self.time.weight)
        nn.init.zeros_(self.time.bias)
        self.s: torch.Tensor | None = None

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        x = self.norm(y)
        code = self.time(self.s.reshape(1).to(x.dtype))
        if self.mode == "concat":
            return x + code
        scale, shift = code.chunk(2, dim=-1)
        return x * (1.0 + scale) + shift


class DepthField(Checkpointable, nn.Module):
    """``F_theta(s, y)``: the ODE Transformer's ``PreNormAttentionFFN`` (attention then FFN as
    one function, never including the residual), optionally conditioned on ``s``: through
    its norms (``concat``, ``film``) or its weights (``weights`` over ``weight_basis``
    Legendre polynomials on ``[0, length]``, ``hypernetwork`` of rank ``hypernetwork_rank``).
    Its options come checked from [`NODETransformerConfig`][neuralode_lm.NODETransformerConfig]."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        time_conditioning: str = "none",
        eps: float = 1e-5,
        weight_basis: int = 1,
        hypernetwork_rank: int = 4,
        length: float = 1.0,
    ) -> None:
        super().__init__()
        self.layer = PreNormAttentionFFN(
            d_model, n_heads, d_ff, dropout, dropout, dropout, causal=True, eps=eps
        )
        self.timed: list[_TimedNorm] = []
        self.depth: DepthWeights | None = None
        size = weight_basis if time_conditioning == "weights" else hypernetwork_rank
        if time_conditioning == "hypernetwork" or (time_conditioning == "weights" and size > 1):
            # weights with K = 1 is the shared field itself: nothing to replace
            attention, ffn = self.layer.attention.attention, self.layer.ffn.ffn
            maps = [(attention, "qkv"), (attention, "out"), (ffn, "fc1"), (ffn, "fc2")]
            self.depth = DepthWeights(maps, time_conditioning, size, length)
        elif time_conditioning in ("concat", "film"):
            for sub in (self.layer.attention, self.layer.ffn):
                sub.norm = _TimedNorm(sub.norm, time_conditioning)
                self.timed.append(sub.norm)

    def forward(
        self,
        s: torch.Tensor | float,
        y: torch.Tensor,
        cache: KVCache | AttentionContext | None = None,
    ) -> torch.Tensor:
        """``F(s, y)``; ``cache``: this stage's key/value cache, or an
        [`AttentionContext`][ode_transformer.AttentionContext] (a cache and a padding mask).
        Under gradient checkpointing each evaluation (RK stage) is recomputed in the backward
        pass."""
        return self.checkpointed(self._evaluate, s, y, cache)  # type: ignore[no-any-return]

    def _evaluate(
        self,
        s: torch.Tensor | float,
        y: torch.Tensor,
        cache: KVCache | AttentionContext | None,
    ) -> torch.Tensor:
        for norm in self.timed:
            norm.s = torch.as_tensor(s, dtype=y.dtype, device=y.device)
        if self.depth is not None:
            self.depth.set_time(torch.as_tensor(s, dtype=y.dtype, device=y.device))
        if cache is None:
            return self.layer(y)
        context = cache if isinstance(cache, AttentionContext) else AttentionContext(cache)
        return self.layer(y, context)


class MaskedField(nn.Module):
    """``field(s, y, context)`` as ``F(s, y)``: a padding mask bound for a solver (which calls
    ``F(s, y)`` only); the adjoint finds the field's parameters through it."""

    def __init__(self, field: nn.Module, context: AttentionContext) -> None:
        super().__init__()
        self.field, self.context = field, context

    def forward(self, s: torch.Tensor | float, y: torch.Tensor) -> torch.Tensor:
        return self.field(s, y, self.context)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FixedGrid:
    """``steps`` equal steps of a named tableau over ``[0, S]`` (``GRID_TABLEAUX``)."""

    method: str = "rk4"
    steps: int = 1

    def __post_init__(self) -> None:
        if self.method not in GRID_TABLEAUX:
            raise ModelConfigError(
                f"unknown fixed-grid method {self.method!r}; valid: {', '.join(GRID_TABLEAUX)}"
            )
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise ModelConfigError(f"steps must be a positive integer, got {self.steps!r}")

    @property
    def nfe(self) -> int:
        return self.steps * GRID_TABLEAUX[self.method].stages

    def integrate(
        self,
        field: nn.Module,
        y: torch.Tensor,
        length: float,
        cache: KVCache | AttentionContext | None = None,
    ) -> torch.Tensor:
        """``y(S)`` by ``steps`` explicit RK steps; stage ``i`` of step ``n`` attends with
        ``cache.child((n, i))`` (a cache, or a context: a cache and a padding mask). Each step
        is an ODE Transformer ``RKBlock`` of step size ``h`` (the block's increment scaled by
        ``h``, stage times ``s_n + c_i h``)."""
        tableau, h = GRID_TABLEAUX[self.method], length / self.steps
        for n in range(self.steps):

            def stage(i: int, y_i: torch.Tensor, n: int = n) -> torch.Tensor:
                s = (n + tableau.c[i]) * h
                return field(s, y_i) if cache is None else field(s, y_i, cache.child((n, i)))

            y = rk_step(tableau, stage, y, h)
        return y
