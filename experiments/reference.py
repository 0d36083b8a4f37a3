"""Reference models for the harness: a bigram LM and the field's reference Transformer.

``BigramLM``: ``logits[:, t]`` depends on ``tokens[:, t]`` alone, so it is causal by
construction, and its maximum-likelihood table has a closed form (smoothed bigram counts),
which lets tests check the harness's perplexity against a number computed by hand.

``WordLMTransformer``: the Transformer of pytorch/examples ``word_language_model``
(post-norm ``nn.TransformerEncoder`` layers with a final LayerNorm, sinusoidal positions,
embeddings scaled by ``sqrt(d_model)``), so a comparison can hold the field's baseline.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from odelm import mixed_precision
from odelm.checkpointing import Checkpointable
from odelm.hf import HuggingFaceLM
from odelm.mixed_precision import Dropout
from odelm.pretrained import PretrainedMixin


@dataclass(frozen=True)
class BigramConfig:
    """``reference bigram``: a table of next-token logits; it has no options."""

    def to_dict(self) -> dict[str, Any]:
        """No fields: ``config.json`` holds the vocabulary size only."""
        return {}


@dataclass(frozen=True)
class WordLMTransformerConfig:
    """``reference transformer``: pytorch/examples word_language_model's Transformer.

    Attributes:
        d_model: width of the embeddings and layers
        n_heads: attention heads
        d_ff: hidden width of the feed-forward network
        n_layers: post-norm encoder layers
        dropout: dropout on the embeddings
        layer_dropout: dropout inside every layer
        init_range: embedding and decoder weights uniform in [-init_range, init_range]
        max_positions: longest sequence (sinusoidal positions)
    """

    d_model: int = 200
    n_heads: int = 2
    d_ff: int = 200
    n_layers: int = 2
    dropout: float = 0.2
    layer_dropout: float = 0.1
    init_range: float = 0.1
    max_positions: int = 512

    def to_dict(self) -> dict[str, Any]:
        """The fields as ``config.json`` holds them."""
        return dataclasses.asdict(self)


class BigramLM(PretrainedMixin, HuggingFaceLM):
    """``logits[b, t] = table[tokens[b, t]]``: the smallest model that meets the contract."""

    is_causal = True
    config_class = BigramConfig
    input_embeddings_name = "table"
    output_embeddings_name = None

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size, self.config = vocab_size, BigramConfig()
        self.table = nn.Embedding(vocab_size, vocab_size)
        nn.init.zeros_(self.table.weight)

    # A bigram reads only the previous token, so no real token's prediction ever sees
    # padding: it honours any attention mask without using it.
    accepts_attention_mask = True

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.table(tokens), {}

    @classmethod
    def from_counts(cls, ids: torch.Tensor, vocab_size: int, smoothing: float = 0.1) -> BigramLM:
        """The additively smoothed maximum-likelihood bigram model of a token stream."""
        counts = torch.full((vocab_size, vocab_size), smoothing, dtype=torch.float64)
        counts.index_put_(
            (ids[:-1], ids[1:]), torch.ones(ids.numel() - 1, dtype=torch.float64), accumulate=True
        )
        model = cls(vocab_size)
        with torch.no_grad():
            model.table.weight.copy_((counts / counts.sum(1, keepdim=True)).log().float())
        return model

    def block_modules(self) -> list[nn.Module]:
        return [self.table]

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = False,
    ) -> nn.Module:
        """The table is vocabulary x vocabulary: both its rows (the previous token) and its
        columns (the next) are resized; kept entries stay, new ones are N(0, 0.02) (or, with
        ``mean_resizing``, the old entries' mean)."""
        if new_num_tokens is None:
            return self.table
        if pad_to_multiple_of:
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        old = self.table.weight
        keep = min(new_num_tokens, old.shape[0])
        table = nn.Embedding(new_num_tokens, new_num_tokens).to(old.device, old.dtype)
        with torch.no_grad():
            if mean_resizing:
                table.weight.fill_(old.mean())
            else:
                table.weight.normal_(0.0, 0.02)
            table.weight[:keep, :keep] = old[:keep, :keep]
        self.table = table
        self._resized_vocabulary(new_num_tokens)
        return table


class _EncoderLayer(Checkpointable, nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` (post-norm, batch first) whose dropouts draw cheap masks
    and whose causal self-attention runs as
    [`odelm.mixed_precision.attention`][odelm.mixed_precision.attention] under CPU mixed precision
    (bf16 products, fp32 softmax); ``nn.TransformerEncoderLayer`` otherwise, bit for bit."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__(d_model, n_heads, d_ff, dropout=dropout, batch_first=True)
        self.dropout, self.dropout1, self.dropout2 = (Dropout(dropout) for _ in range(3))

    def forward(self, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The layer, recomputed in the backward pass under gradient checkpointing."""
        layer = super().forward
        return self.checkpointed(layer, src, *args, **kwargs)  # type: ignore[no-any-return]

    def _sa_block(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        if not (is_causal and key_padding_mask is None and mixed_precision.cpu_mixed_precision(x)):
            return super()._sa_block(x, attn_mask, key_padding_mask, is_causal)
        attention = self.self_attn  # is_causal: attn_mask is the causal mask
        batch, length, width = x.shape
        qkv = nn.functional.linear(x, attention.in_proj_weight, attention.in_proj_bias)
        heads = qkv.view(batch, length, 3, attention.num_heads, -1).permute(2, 0, 3, 1, 4)
        p = attention.dropout if self.training else 0.0
        y = mixed_precision.attention(*heads.contiguous().unbind(0), p, causal=True)
        return self.dropout1(attention.out_proj(y.transpose(1, 2).reshape(batch, length, width)))


class WordLMTransformer(PretrainedMixin, HuggingFaceLM):
    """The word_language_model Transformer LM, written with ``torch.nn`` layers.

    Embeddings (uniform in ``[-init_range, init_range]``) scaled by ``sqrt(d_model)`` plus
    sinusoidal positions, dropout ``dropout``; ``n_layers`` post-norm encoder layers (ReLU
    FFN, Xavier-uniform weights, dropout ``layer_dropout``) under a causal mask, a final
    LayerNorm, and an untied linear decoder (uniform weights, zero bias).
    """

    is_causal = True
    config_class = WordLMTransformerConfig
    input_embeddings_name = "embedding"
    output_embeddings_name = "decoder"

    def __init__(
        self,
        vocab_size: int,
        *,
        d_model: int = 200,
        n_heads: int = 2,
        d_ff: int = 200,
        n_layers: int = 2,
        dropout: float = 0.2,
        layer_dropout: float = 0.1,
        init_range: float = 0.1,
        max_positions: int = 512,
    ) -> None:
        super().__init__()
        self.config = WordLMTransformerConfig(
            d_model, n_heads, d_ff, n_layers, dropout, layer_dropout, init_range, max_positions
        )
        self.vocab_size, self.d_model, self.max_positions = vocab_size, d_model, max_positions
        self.embedding = nn.Embedding(vocab_size, d_model)
        position = torch.arange(max_positions, dtype=torch.float).unsqueeze(1)
        rate = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_positions, d_model)
        table[:, 0::2] = torch.sin(position * rate)
        table[:, 1::2] = torch.cos(position * rate)
        self.register_buffer("positions", table, persistent=False)
        self.dropout = Dropout(dropout)
        layer = _EncoderLayer(d_model, n_heads, d_ff, layer_dropout)
        self.layers = nn.TransformerEncoder(
            layer, n_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        for parameter in self.layers.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        self.decoder = nn.Linear(d_model, vocab_size)
        nn.init.uniform_(self.embedding.weight, -init_range, init_range)
        nn.init.uniform_(self.decoder.weight, -init_range, init_range)
        nn.init.zeros_(self.decoder.bias)

    def features(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The final LayerNorm's states ``[B, T, d_model]``, which ``output_layer``
        maps to the logits, and ``aux``; ``attention_mask`` (True on real tokens) hides
        padding from attention (a query at padding sees itself) and counts each row's
        positions over its real tokens."""
        length = tokens.shape[1]
        if length > self.max_positions:
            raise ValueError(f"{length} tokens exceed max_positions={self.max_positions}")
        if attention_mask is None:
            x = self.embedding(tokens) * math.sqrt(self.d_model) + self.positions[:length]
            mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
            return self.layers(self.dropout(x), mask=mask, is_causal=True), {}
        real = attention_mask.bool()
        positions = (real.long().cumsum(1) - 1).clamp(min=0)
        x = self.embedding(tokens) * math.sqrt(self.d_model) + self.positions[positions]
        order = torch.arange(length, device=tokens.device)
        allowed = (order[None, :] <= order[:, None]) & real[:, None, :] | (
            order[None, :] == order[:, None]
        )
        blocked = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        blocked = blocked.masked_fill(~allowed, float("-inf"))
        heads = self.layers.layers[0].self_attn.num_heads
        mask = blocked.repeat_interleave(heads, dim=0)  # [B * heads, T, T]
        return self.layers(self.dropout(x), mask=mask), {}

    @property
    def output_layer(self) -> nn.Linear:
        """The decoder: ``forward(tokens)`` is ``(output_layer(hidden), aux)`` of
        ``features``."""
        return self.decoder

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        hidden, aux = self.features(tokens, attention_mask)
        return self.decoder(hidden), aux

    def block_modules(self) -> list[nn.Module]:
        return [self.embedding, *self.layers.layers, self.decoder]
