"""Layers (one depth step each) and the stacks that combine them (ODE Transformer Table 7).

A layer exposes ``increment(y)`` = its update ``F_l(y)`` without the residual; a stack
decides how increments and earlier states combine:

| stack | update |
|---|---|
| plain | ``y_{t+1} = y_t + F_t(y_t)`` |
| leapfrog | ``y_{t+1} = y_{t-1} + 2 F_t(y_t)`` (first layer: Euler) |
| multistep | ``y_{t+1} = k_t y_t + (1 - k_t) y_{t-1} + F_t(y_t)``, ``k_t`` learnable, init 1 |
| dlcl | ``y_{t+1} = y_0 + sum_{l<=t} W_{t,l} F_l(y_l)``, ``W`` learnable, init 1 |
| polynet | ``y_{t+1} = y_t + F_t(y_t) + F_t(F_t(y_t))`` |
| macaron | plain stack of Macaron layers (FFN/2, attention, FFN/2) |

With ``W`` and ``k`` at their initial value 1, multistep and DLCL equal the plain stack. A
layer's ``F`` is itself an RK block, so every schema composes with every block. All updates
are position-wise combinations of causal functions, so every stack stays causal and can be
decoded incrementally: layer ``l`` uses ``context.child(l)`` (PolyNet's two calls use its
children 0 and 1). Names are validated once, by
[`ode_transformer.config.ODETransformerConfig`][ode_transformer.ODETransformerConfig];
[`ode_transformer.backbone.build_stack`][ode_transformer.build_stack] turns a config into a stack.
"""

from __future__ import annotations

import torch
from torch import nn

from odelm.checkpointing import Checkpointable

from .blocks import make_block
from .errors import ODETransformerConfigError
from .layers import (
    NO_CONTEXT,
    AttentionContext,
    PreNormAttention,
    PreNormAttentionFFN,
    PreNormFFN,
)

SUBLAYERS = ("attention", "ffn", "both")


class RKLayer(Checkpointable, nn.Module):
    """One depth step: an RK block over ``F`` = attention, FFN, or both as one function.

    ``sublayer="both"`` is one block over ``F(y) = layer(y) - y``; ``"attention"`` is an RK
    block over attention followed by a residual FFN block, and ``"ffn"`` a residual
    attention block followed by an RK block over the FFN (the paper's Figure 4 ablation).
    """

    def __init__(
        self,
        block: str | tuple,
        sublayer: str,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        relu_dropout: float = 0.0,
        causal: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        attention = PreNormAttention(d_model, n_heads, dropout, attention_dropout, causal, eps)
        ffn = PreNormFFN(d_model, d_ff, dropout, relu_dropout, eps)
        if sublayer == "both":
            f = PreNormAttentionFFN(
                d_model, n_heads, d_ff, dropout, attention_dropout, relu_dropout, causal, eps
            )
            blocks = [make_block(block, f, d_model)]
        elif sublayer == "attention":
            blocks = [make_block(block, attention, d_model), make_block("residual", ffn)]
        else:
            blocks = [make_block("residual", attention), make_block(block, ffn, d_model)]
        self.blocks = nn.ModuleList(blocks)

    @property
    def nfe(self) -> int:
        """Evaluations of ``F`` per call (the library's definition, in DESIGN.md): the stages of
        the RK block; in the sub-layer ablations the other sub-layer runs once alongside."""
        return max(block.stages for block in self.blocks)

    def increment(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        """``F(y)``, recomputed in the backward pass under gradient checkpointing."""
        return self.checkpointed(self._increment, y, context)  # type: ignore[no-any-return]

    def _increment(self, y: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        total = self.blocks[0].increment(y, context.child(0))
        for i in range(1, len(self.blocks)):
            total = total + self.blocks[i].increment(y + total, context.child(i))
        return total

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        return y + self.increment(y, context)


def check_macaron_width(d_ff: int) -> None:
    """The one check that a Macaron layer can halve ``d_ff`` (the layer's and
    ``ODETransformerConfig``'s with ``stack='macaron'``)."""
    if d_ff % 2 != 0:
        raise ODETransformerConfigError(
            f"a Macaron layer splits d_ff into two halves, so d_ff must be even; got d_ff={d_ff}"
        )


class MacaronLayer(Checkpointable, nn.Module):
    """Strang-Marchuk splitting: ``y1 = y + FFN_a(y)/2``, ``y2 = y1 + SAN(y1)``,
    ``y_next = y2 + FFN_b(y2)/2``; each FFN has inner width ``d_ff / 2`` so the weight
    matrices match a standard layer's."""

    nfe = 1
    """One sweep of attention and FFN (the two half-width FFNs make one): one evaluation."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        relu_dropout: float = 0.0,
        causal: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        check_macaron_width(d_ff)
        self.ffn_a = PreNormFFN(d_model, d_ff // 2, dropout, relu_dropout, eps)
        self.attention = PreNormAttention(d_model, n_heads, dropout, attention_dropout, causal, eps)
        self.ffn_b = PreNormFFN(d_model, d_ff // 2, dropout, relu_dropout, eps)

    def increment(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        """``F(y)``, recomputed in the backward pass under gradient checkpointing."""
        return self.checkpointed(self._increment, y, context)  # type: ignore[no-any-return]

    def _increment(self, y: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        total = 0.5 * self.ffn_a(y)
        total = total + self.attention(y + total, context)
        return total + 0.5 * self.ffn_b(y + total)

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        return y + self.increment(y, context)


class LayerStack(nn.Module):
    """Plain stack ``y_{t+1} = y_t + F_t(y_t)``; subclasses change how states combine."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        if not layers:
            raise ODETransformerConfigError("a stack needs at least one layer (n_layers >= 1)")
        self.layers = nn.ModuleList(layers)

    @property
    def nfe(self) -> int:
        """Evaluations of ``F`` (one pre-norm attention + FFN layer function) per forward pass."""
        return sum(layer.nfe for layer in self.layers)

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            y = y + layer.increment(y, context.child(i))
        return y


class LeapfrogStack(LayerStack):
    """``y_{t+1} = y_{t-1} + 2 F_t(y_t)`` (He et al. 2019); the first layer is an Euler step."""

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        previous = None
        for i, layer in enumerate(self.layers):
            increment = layer.increment(y, context.child(i))
            if previous is None:
                previous, y = y, y + increment
            else:
                previous, y = y, previous + 2.0 * increment
        return y


class MultistepStack(LayerStack):
    """``y_{t+1} = k_t y_t + (1 - k_t) y_{t-1} + F_t(y_t)`` (Lu et al. 2018), ``k_t``
    learnable and initialised to 1; the first layer is an Euler step."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__(layers)
        self.k = nn.Parameter(torch.ones(len(layers) - 1)) if len(layers) > 1 else None

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        previous = None
        for i, layer in enumerate(self.layers):
            increment = layer.increment(y, context.child(i))
            if previous is None:
                previous, y = y, y + increment
            else:
                k = self.k[i - 1]
                previous, y = y, k * y + (1.0 - k) * previous + increment
        return y


class DLCLStack(LayerStack):
    """``y_{t+1} = y_0 + sum_{l<=t} W_{t,l} F_l(y_l)`` (Wang et al. 2019): every layer
    reads a learned combination of all earlier increments; ``W`` is initialised to 1."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__(layers)
        n = len(layers)
        self.weights = nn.Parameter(torch.ones(n * (n + 1) // 2))

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        y0 = y
        increments: list[torch.Tensor] = []
        for t, layer in enumerate(self.layers):
            increments.append(layer.increment(y, context.child(t)))
            row = self.weights[t * (t + 1) // 2 : (t + 1) * (t + 2) // 2]
            y = y0
            for weight, increment in zip(row, increments):
                y = y + weight * increment
        return y


class PolyNetStack(LayerStack):
    """``y_{t+1} = y_t + F_t(y_t) + F_t(F_t(y_t))`` (Zhang et al. 2017, the 2-way PolyInception
    form): the same ``F_t`` is applied again to its own output."""

    @property
    def nfe(self) -> int:
        return 2 * super().nfe

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            layer_context = context.child(i)
            first = layer.increment(y, layer_context.child(0))
            second = layer.increment(first, layer_context.child(1))
            y = y + first + second
        return y


STACK_CLASSES: dict[str, type[LayerStack]] = {
    "plain": LayerStack,
    "leapfrog": LeapfrogStack,
    "multistep": MultistepStack,
    "dlcl": DLCLStack,
    "polynet": PolyNetStack,
    "macaron": LayerStack,  # a plain stack of Macaron layers
}
"""Stack name -> class; the one registry of stacks."""

STACKS = tuple(STACK_CLASSES)
