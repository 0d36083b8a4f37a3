"""Discrete-depth ODE Transformers: Runge-Kutta, multistep and Macaron blocks, a causal LM
with a per-stage key/value cache, and a bidirectional encoder."""

from .blocks import BLOCKS, RKBlock, make_block
from .encoder import ODETransformerEncoder
from .layers import (
    FeedForward,
    KVCache,
    MultiHeadSelfAttention,
    PreNormAttention,
    PreNormAttentionFFN,
    PreNormFFN,
)
from .lm import ODETransformerConfig, ODETransformerLM
from .presets import PRESETS, config_from_preset
from .stacks import (
    STACKS,
    SUBLAYERS,
    DLCLStack,
    LayerStack,
    LeapfrogStack,
    MacaronLayer,
    MultistepStack,
    PolyNetStack,
    RKLayer,
    build_stack,
)
from .tableau import TABLEAUX, Tableau, get_tableau

__all__ = [
    "BLOCKS",
    "PRESETS",
    "STACKS",
    "SUBLAYERS",
    "TABLEAUX",
    "DLCLStack",
    "FeedForward",
    "KVCache",
    "LayerStack",
    "LeapfrogStack",
    "MacaronLayer",
    "MultiHeadSelfAttention",
    "MultistepStack",
    "ODETransformerConfig",
    "ODETransformerEncoder",
    "ODETransformerLM",
    "PolyNetStack",
    "PreNormAttention",
    "PreNormAttentionFFN",
    "PreNormFFN",
    "RKBlock",
    "RKLayer",
    "Tableau",
    "build_stack",
    "config_from_preset",
    "get_tableau",
    "make_block",
]
