"""Discrete-depth ODE Transformers: Runge-Kutta, multistep and Macaron blocks, a causal LM
with a per-stage key/value cache, and a bidirectional encoder."""

from .backbone import build_stack
from .blocks import BLOCKS, RKBlock, make_block
from .config import ODETransformerConfig, ODETransformerConfigError
from .encoder import ODETransformerEncoder
from .layers import (
    NO_CONTEXT,
    AttentionContext,
    FeedForward,
    KVCache,
    MultiHeadSelfAttention,
    PreNormAttention,
    PreNormAttentionFFN,
    PreNormFFN,
)
from .lm import ODETransformerLM
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
)
from .tableau import METHODS, TABLEAUX, Tableau, get_tableau, rk_stage_values, rk_step

__all__ = [
    "BLOCKS",
    "METHODS",
    "NO_CONTEXT",
    "PRESETS",
    "STACKS",
    "SUBLAYERS",
    "TABLEAUX",
    "AttentionContext",
    "DLCLStack",
    "FeedForward",
    "KVCache",
    "LayerStack",
    "LeapfrogStack",
    "MacaronLayer",
    "MultiHeadSelfAttention",
    "MultistepStack",
    "ODETransformerConfig",
    "ODETransformerConfigError",
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
    "rk_stage_values",
    "rk_step",
]
