"""Transformer sub-layers as ODE right-hand sides ``F(y) = G(LN(y))``, the key/value cache,
and the attention context that carries both through blocks and stacks.

Every ``F`` here returns the *increment* only (never ``y + ...``): the blocks in
``ode_transformer.blocks`` add it to the residual stream with their tableau's weights.
All ``F`` share one signature, ``F(y, context=NO_CONTEXT)``, so a block can pass the cache
and the attention mask through without knowing which sub-layer it drives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from odelm import mixed_precision
from odelm.mixed_precision import Dropout

from .errors import ODETransformerConfigError


class KVCache:
    """A tree of key/value caches with one leaf per attention call site.

    The model owns the root; each layer, sub-block and RK stage takes a child by name, so
    every stage of every block keeps its own keys and values (the stages attend over
    different states). ``position`` counts the tokens already processed and is maintained
    by the model that owns the root. A leaf stores its keys/values in a buffer whose
    capacity doubles when full, so appending one token does not copy the whole past.
    """

    def __init__(self) -> None:
        self.position = 0
        self.cached_length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._children: dict[object, KVCache] = {}

    def child(self, name: object) -> KVCache:
        """The sub-cache called ``name``, created empty on first use."""
        if name not in self._children:
            self._children[name] = KVCache()
        return self._children[name]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``[B, H, T_new, d_head]`` keys/values; return all cached ones so far."""
        old, new = self.cached_length, self.cached_length + keys.shape[2]
        if self._keys is None or new > self._keys.shape[2]:
            capacity = max(new, 2 * old, 16)
            grown_keys = keys.new_empty(*keys.shape[:2], capacity, keys.shape[3])
            grown_values = values.new_empty(*values.shape[:2], capacity, values.shape[3])
            if self._keys is not None:
                grown_keys[:, :, :old] = self._keys[:, :, :old]
                grown_values[:, :, :old] = self._values[:, :, :old]
            self._keys, self._values = grown_keys, grown_values
        self._keys[:, :, old:new] = keys
        self._values[:, :, old:new] = values
        self.cached_length = new
        return self._keys[:, :, :new], self._values[:, :, :new]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows ``index`` in every leaf (beam search reorders hypotheses)."""
        if self._keys is not None:
            self._keys = self._keys.index_select(0, index)
            self._values = self._values.index_select(0, index)
        for node in self._children.values():
            node.reorder(index)


@dataclass(frozen=True)
class AttentionContext:
    """What attention needs besides the states: a key/value cache node and an attention mask.

    ``cache`` (None: no incremental decoding) is the node of [`KVCache`][ode_transformer.KVCache]
    this call site owns; ``attention_mask`` ``[B, T]`` is True at real keys (the library's one mask
    convention, [`odelm.contract`][odelm.contract]), False at padding. Layers, blocks and RK
    stages hand ``context.child(name)`` down, so every attention call site gets its own
    cache leaf while the mask travels unchanged.
    """

    cache: KVCache | None = None
    attention_mask: torch.Tensor | None = None

    @property
    def is_empty(self) -> bool:
        """True when there is neither a cache nor a mask (plain full-sequence attention)."""
        return self.cache is None and self.attention_mask is None

    def child(self, name: object) -> AttentionContext:
        """The context of sub-call-site ``name``: the child cache, the same mask."""
        if self.cache is None:
            return self
        return AttentionContext(self.cache.child(name), self.attention_mask)


NO_CONTEXT = AttentionContext()
"""The empty context: no cache, no attention mask."""


class MultiHeadSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, causal or bidirectional."""

    def __init__(
        self, d_model: int, n_heads: int, attention_dropout: float = 0.0, causal: bool = True
    ) -> None:
        super().__init__()
        check_heads(d_model, n_heads)
        self.n_heads = n_heads
        self.causal = causal
        self.attention_dropout = attention_dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        """Attend over ``x`` [B, T, D] (plus the context's cached positions); no query
        attends to a key the context's attention mask marks False (padding)."""
        cache, attention_mask = context.cache, context.attention_mask
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads)
        if context.is_empty and qkv.dtype in (torch.bfloat16, torch.float16) and x.is_cpu:
            # mixed precision (odelm.mixed_precision): bf16 products, fp32 softmax, on
            # q, k, v made contiguous head by head at once (no gather of their gradients)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).contiguous().unbind(0)
            p = self.attention_dropout if self.training else 0.0
            y = mixed_precision.attention(q, k, v, p, self.causal and T > 1)
            return self.out(y.transpose(1, 2).reshape(B, T, D))
        q, k, v = qkv.unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        past = 0
        if cache is not None:
            past = cache.cached_length
            k, v = cache.append(k, v)
        mask = None
        if self.causal and T > 1 and (past > 0 or attention_mask is not None):
            query_pos = torch.arange(past, past + T, device=x.device)
            mask = torch.arange(past + T, device=x.device)[None, :] <= query_pos[:, None]
        if attention_mask is not None:
            keep = attention_mask[:, None, None, :]
            if self.causal:  # a query at padding also sees itself: no row without a key
                keys = torch.arange(past + T, device=x.device)
                keep = keep | (keys[None, :] == keys[past:, None])
            mask = keep if mask is None else mask & keep
        dropout_p = self.attention_dropout if self.training else 0.0
        causal = self.causal and T > 1 and mask is None
        if q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cpu":
            # with a cache or a mask: SDPA in fp32, on a CPU faster than its bf16 kernels
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), mask, dropout_p, causal
                ).to(q.dtype)  # back to the model's dtype for its output projection
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
            )
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    """Position-wise ``W2 dropout(relu(W1 x + b1)) + b2`` (ReLU dropout as in the paper)."""

    def __init__(self, d_model: int, d_ff: int, relu_dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(relu_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class PreNormAttention(nn.Module):
    """``F(y) = dropout(SAN(LN(y)))``: the self-attention sub-layer as an ODE function."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        causal: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.attention = MultiHeadSelfAttention(d_model, n_heads, attention_dropout, causal)
        self.dropout = Dropout(dropout)

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        return self.dropout(self.attention(self.norm(y), context))


class PreNormFFN(nn.Module):
    """``F(y) = dropout(FFN(LN(y)))``: the feed-forward sub-layer as an ODE function."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        relu_dropout: float = 0.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.ffn = FeedForward(d_model, d_ff, relu_dropout)
        self.dropout = Dropout(dropout)

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        """Position-wise, so ``context`` is accepted and unused."""
        return self.dropout(self.ffn(self.norm(y)))


class PreNormAttentionFFN(nn.Module):
    """Attention then FFN as one function: ``F(y) = layer(y) - y`` for a pre-norm layer.

    With ``a = SAN_F(y)``: ``F(y) = a + FFN_F(y + a)``, computed without forming
    ``layer(y)`` so no ``y`` is added and subtracted again.
    """

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
        self.attention = PreNormAttention(d_model, n_heads, dropout, attention_dropout, causal, eps)
        self.ffn = PreNormFFN(d_model, d_ff, dropout, relu_dropout, eps)

    def forward(
        self,
        y: torch.Tensor,
        context: AttentionContext = NO_CONTEXT,
    ) -> torch.Tensor:
        a = self.attention(y, context)
        return a + self.ffn(y + a)


def padded_positions(
    attention_mask: torch.Tensor | None, start: int, length: int, device: torch.device
) -> torch.Tensor:
    """The positions of tokens ``start .. start + length``: ``[length]`` without a mask, else
    ``[B, length]`` counted over each row's real tokens only (``attention_mask [B, start +
    length]``, True on real tokens), so a left-padded row sees the positions it has alone."""
    if attention_mask is None:
        return torch.arange(start, start + length, device=device)
    counts = attention_mask.long().cumsum(1) - 1
    return counts[:, start : start + length].clamp(min=0)


def check_heads(d_model: int, n_heads: int) -> None:
    """The one check that ``n_heads`` splits ``d_model`` (each head gets ``d_model / n_heads``
    dimensions): the attention layer's and ``ODETransformerConfig``'s."""
    if d_model % n_heads != 0:
        hint = ", ".join(str(h) for h in (1, 2, 4, 8, 16) if d_model % h == 0)
        raise ODETransformerConfigError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; each head gets "
            f"d_model / n_heads dimensions, so choose a head count that divides the model "
            f"width (e.g. {hint})"
        )
