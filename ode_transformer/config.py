"""The configuration of an ODE Transformer LM or encoder (Hugging Face ``configuration_*`` style).

A plain dataclass validated on construction: every name (block, sub-layer, stack) and size
is checked here, where the config is built; a condition that a public layer also checks
for its own arguments (the head split, a Macaron layer's even ``d_ff``, a block name) is
one function both call, so it has one message. ``to_dict``
/ ``from_dict`` round-trip through JSON (``config.json`` beside the weights).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Literal

from .blocks import BLOCKS, check_block_name
from .errors import ODETransformerConfigError
from .layers import check_heads
from .stacks import STACKS, SUBLAYERS, check_macaron_width
from .tableau import Tableau

POSITIONS = ("learned", "sinusoidal")
"""How position enters the input: a learned table or the fixed sinusoids of Vaswani et al."""

BlockName = Literal[(*BLOCKS, "custom")]  # type: ignore[valid-type]
"""A block of [`BLOCKS`][ode_transformer.BLOCKS] (``custom``: a user tableau)."""
SublayerName = Literal[tuple(SUBLAYERS)]  # type: ignore[valid-type]
StackName = Literal[tuple(STACKS)]  # type: ignore[valid-type]


@functools.cache
def _choices() -> dict[str, tuple[str, ...]]:
    """The ``Literal`` fields of [`ODETransformerConfig`][ode_transformer.ODETransformerConfig] and
    their values: the one list of every name choice (jsonargparse reads the same types from a run
    config)."""
    hints = typing.get_type_hints(ODETransformerConfig)
    return {
        name: typing.get_args(hint)
        for name, hint in hints.items()
        if typing.get_origin(hint) is Literal
    }


@dataclass(frozen=True)
class ODETransformerConfig:
    """Sizes and architecture of an ODE Transformer LM or encoder (``ode_transformer``).

    ``block`` names a block of [`ode_transformer.blocks.BLOCKS`][ode_transformer.BLOCKS];
    alternatively pass ``tableau=(A, b)`` (explicit, fixed weights), which sets ``block="custom"``.
    ``sublayer`` picks ``F`` (attention, FFN, or both as one function) and ``stack`` how
    layers combine (``ode_transformer.stacks.STACKS``). ``positions`` (``learned`` or
    ``sinusoidal``) and ``scale_embeddings`` (token embeddings times ``sqrt(d_model)``, as
    in Vaswani et al.) shape the input to the first block only, so every block compares on
    the same input.

    Attributes:
        vocab_size: tokens of the vocabulary (the tokenizer's, in a run config)
        d_model: width of the residual stream
        n_heads: attention heads
        d_ff: hidden width of the feed-forward network
        n_layers: layers, each one block
        max_positions: longest sequence
        dropout: dropout on the embeddings and sub-layer outputs
        attention_dropout: dropout on the attention weights
        relu_dropout: dropout inside the feed-forward network
        block: the Runge-Kutta block of every layer (custom: the tableau's)
        tableau: your own explicit Runge-Kutta method as [A, b] (sets block custom)
        sublayer: the function F of a block: attention, ffn or both
        stack: how layers combine: plain or macaron
        tie_embeddings: the output projection shares the token embedding
        layer_norm_eps: LayerNorm epsilon
        positions: learned or sinusoidal positions
        scale_embeddings: token embeddings times sqrt(d_model) (Vaswani et al.)
    """

    vocab_size: int = 10000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    max_positions: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    relu_dropout: float = 0.1
    block: BlockName = "residual"
    tableau: tuple | None = None
    sublayer: SublayerName = "both"
    stack: StackName = "plain"
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    positions: Literal[POSITIONS] = "learned"  # type: ignore[valid-type]
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_names()

    def _check_sizes(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ODETransformerConfigError(f"{name} must be a positive integer, got {value!r}")
        check_heads(self.d_model, self.n_heads)
        for name in ("dropout", "attention_dropout", "relu_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ODETransformerConfigError(f"{name} must lie in [0, 1), got {value!r}")

    def _check_names(self) -> None:
        if self.block is not None and not isinstance(self.block, str):
            raise ODETransformerConfigError(
                f"block must be a block name ({', '.join(BLOCKS)}), got {self.block!r}; give "
                "your own Butcher tableau as tableau: [A, b] instead"
            )
        if self.tableau is not None:
            if self.block not in ("residual", "custom", None):
                raise ODETransformerConfigError(
                    f"pass either block={self.block!r} or tableau=(A, b), not both "
                    "(a user tableau makes block='custom')"
                )
            tableau = (
                Tableau(*self.tableau) if not isinstance(self.tableau, Tableau) else self.tableau
            )
            object.__setattr__(self, "tableau", (tableau.A, tableau.b))
            object.__setattr__(self, "block", "custom")
        else:
            check_block_name(self.block)
        for name, valid in _choices().items():
            if name != "block" and getattr(self, name) not in valid:
                raise ODETransformerConfigError(
                    f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}"
                )
        if self.stack == "macaron":
            if self.block != "residual" or self.sublayer != "both":
                raise ODETransformerConfigError(
                    "stack='macaron' builds its own FFN/attention/FFN layers; leave "
                    f"block='residual' and sublayer='both' (got {self.block!r}, {self.sublayer!r})"
                )
            check_macaron_width(self.d_ff)

    def to_dict(self) -> dict:
        """JSON-ready dict (the tableau as nested lists)."""
        out = dataclasses.asdict(self)
        if self.tableau is not None:
            out["tableau"] = [[list(row) for row in self.tableau[0]], list(self.tableau[1])]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ODETransformerConfig:
        """Inverse of [`to_dict`][ode_transformer.ODETransformerConfig.to_dict]; unknown keys are an
        error that names the valid ones."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ODETransformerConfigError(
                f"unknown config keys {unknown}; valid: {', '.join(sorted(fields))}"
            )
        return cls(**data)
