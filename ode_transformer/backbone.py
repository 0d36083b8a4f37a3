"""What the causal LM and the bidirectional encoder share: embeddings, the stack, the final
LayerNorm, GPT-style initialisation and the input checks.

``Backbone(config, causal)`` maps token ids ``[B, T]`` to final-LayerNorm states
``[B, T, d_model]``; [`ODETransformerLM`][ode_transformer.ODETransformerLM] adds a softmax head and
[`ODETransformerEncoder`][ode_transformer.ODETransformerEncoder] a padding mask.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from odelm.errors import OdelmError
from odelm.hf import HuggingFaceLM
from odelm.mixed_precision import Dropout
from odelm.pretrained import PretrainedMixin

from .config import ODETransformerConfig
from .layers import NO_CONTEXT, AttentionContext, padded_positions
from .stacks import STACK_CLASSES, LayerStack, MacaronLayer, RKLayer


class TokenInputError(OdelmError, ValueError):
    """A token tensor the model cannot embed (wrong shape, dtype, range or length)."""


HOST_CHECKED_DEVICES: tuple[str, ...] = ("cpu",)
"""Device types whose token range ``check_tokens`` reads back to the host (a clear
``TokenInputError`` naming the range); on any other device (CUDA) the range is asserted on
the device (``torch._assert_async``), with no host sync (issue 30)."""


def check_tokens(
    tokens: torch.Tensor, vocab_size: int, max_positions: int, offset: int = 0
) -> None:
    """Raise a clear error for token tensors the model cannot embed."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise TokenInputError(f"tokens must be a LongTensor of shape [batch, time], got {shape}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TokenInputError(f"tokens must be integer ids (torch.long), got dtype {tokens.dtype}")
    if offset + tokens.shape[1] > max_positions:
        raise TokenInputError(
            f"sequence of {offset + tokens.shape[1]} positions is longer than max_positions="
            f"{max_positions}; truncate the input or build the model with a larger max_positions"
        )
    # Reading the range back is a graph break under torch.compile, which trains only on
    # batches the harness encoded; eager calls (evaluation, generation) still check it.
    if torch.compiler.is_compiling():
        return
    if not tokens.numel():
        return
    if tokens.device.type not in HOST_CHECKED_DEVICES:
        # On a GPU a read back to the host would stall the queue every forward: the range
        # is asserted on the device instead; a bad id stops at the next host sync with
        # this message (CUDA reports it as a device-side assert).
        low, high = torch.aminmax(tokens)
        torch._assert_async(
            (low >= 0) & (high < vocab_size), f"token ids must lie in [0, {vocab_size})"
        )
        return
    low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one read back to the host
    if low < 0 or high >= vocab_size:
        raise TokenInputError(f"token ids must lie in [0, {vocab_size}), got range [{low}, {high}]")


def init_weights(module: nn.Module) -> None:
    """GPT-style initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def sinusoids(config: ODETransformerConfig) -> torch.Tensor:
    """The fixed ``[max_positions, d_model]`` sin/cos table of Vaswani et al. (2017)."""
    position = torch.arange(config.max_positions, dtype=torch.float).unsqueeze(1)
    rate = torch.exp(torch.arange(0, config.d_model, 2).float() * (-math.log(1e4) / config.d_model))
    table = torch.zeros(config.max_positions, config.d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)[:, : config.d_model // 2]
    return table


def build_stack(config: ODETransformerConfig, causal: bool) -> LayerStack:
    """The stack of ``config.n_layers`` layers that ``config.stack`` names."""
    common = {
        "d_model": config.d_model,
        "n_heads": config.n_heads,
        "d_ff": config.d_ff,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "relu_dropout": config.relu_dropout,
        "causal": causal,
        "eps": config.layer_norm_eps,
    }
    block = config.tableau if config.tableau is not None else config.block
    layers: list[nn.Module] = []
    for _ in range(config.n_layers):
        if config.stack == "macaron":
            layers.append(MacaronLayer(**common))
        else:
            layers.append(RKLayer(block, config.sublayer, **common))
    return STACK_CLASSES[config.stack](layers)


class Backbone(PretrainedMixin, HuggingFaceLM):
    """Token + position embeddings, an ODE Transformer stack, final LayerNorm.

    Subclasses add their own modules after calling ``__init__`` and then apply
    ``init_weights`` (so parameters are created, and initialised, in one fixed order).
    A subclass whose constructor takes only the config saves and loads with
    ``save_pretrained`` / ``from_pretrained``
    ([`odelm.pretrained.PretrainedMixin`][odelm.pretrained.PretrainedMixin]) and is a
    ``transformers`` model ([`odelm.hf.HuggingFaceLM`][odelm.hf.model.HuggingFaceLM]).
    """

    def __init__(self, config: ODETransformerConfig, causal: bool) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_positions
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        if config.positions == "learned":
            self.position_embedding = nn.Embedding(config.max_positions, config.d_model)
        else:
            self.register_buffer("position_table", sinusoids(config), persistent=False)
        self.embedding_scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        self.dropout = Dropout(config.dropout)
        self.stack = build_stack(config, causal=causal)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def pretrained_config(self) -> dict:
        return self.library_config.to_dict()

    @classmethod
    def from_config(cls, config: dict) -> Backbone:
        return cls(ODETransformerConfig.from_dict(config))  # type: ignore[call-arg]

    def block_modules(self) -> list[nn.Module]:
        """The per-layer modules, in depth order (for per-block gradient-norm logging)."""
        return list(self.stack.layers)

    def position(self, positions: torch.Tensor) -> torch.Tensor:
        """Position vectors ``[T, d_model]``: the learned table's rows or the sinusoids."""
        if "position_embedding" in self._modules:  # config.positions == "learned"
            return self.position_embedding(positions)
        return self.position_table[positions]

    def states(
        self, tokens: torch.Tensor, start: int = 0, context: AttentionContext = NO_CONTEXT
    ) -> torch.Tensor:
        """Final-LayerNorm states ``[B, T, d_model]`` of ``tokens`` at positions ``start...``
        (a causal model with a padding mask in ``context``: each row's positions count its real
        tokens, ``ode_transformer.layers.padded_positions``)."""
        check_tokens(tokens, self.vocab_size, self.max_positions, offset=start)
        mask = context.attention_mask if getattr(self, "is_causal", False) else None
        positions = padded_positions(mask, start, tokens.shape[1], tokens.device)
        x = self.token_embedding(tokens) * self.embedding_scale + self.position(positions)
        x = self.dropout(x)
        return self.norm(self.stack(x, context))
