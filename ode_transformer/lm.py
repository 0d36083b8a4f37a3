"""A decoder-only language model built from ODE Transformer blocks.

Reading order: the config, then the model (embeddings -> stack -> final LayerNorm -> tied
softmax), then generation (greedy, sampling, beam search) with a key/value cache in which
every RK stage of every block keeps its own keys and values, then saving and loading.
Meets the library's model contract: ``logits, aux = model(tokens)``, ``model.is_causal``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import BLOCKS
from .layers import KVCache
from .stacks import STACKS, SUBLAYERS, build_stack
from .tableau import Tableau

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
STRATEGIES = ("greedy", "sample", "beam")


# -----------------------------------------------------------------------------------------
# Configuration


@dataclass
class ODETransformerConfig:
    """Sizes and architecture of an ODE Transformer LM or encoder.

    ``block`` names a block of :data:`ode_transformer.blocks.BLOCKS`; alternatively pass
    ``tableau=(A, b)`` (explicit, fixed weights), which sets ``block="custom"``.
    ``sublayer`` picks ``F`` (attention, FFN, or both as one function) and ``stack`` how
    layers combine (:data:`ode_transformer.stacks.STACKS`).
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
    block: str = "residual"
    tableau: tuple | None = None
    sublayer: str = "both"
    stack: str = "plain"
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; each head "
                "gets d_model / n_heads dimensions, so pick a head count that divides d_model"
            )
        for name in ("dropout", "attention_dropout", "relu_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
        if self.tableau is not None:
            if self.block not in ("residual", "custom"):
                raise ValueError(
                    f"pass either block={self.block!r} or tableau=(A, b), not both "
                    "(a user tableau makes block='custom')"
                )
            tableau = (
                Tableau(*self.tableau) if not isinstance(self.tableau, Tableau) else self.tableau
            )
            self.tableau = (tableau.A, tableau.b)
            self.block = "custom"
        elif self.block not in BLOCKS:
            raise ValueError(
                f"unknown block {self.block!r}; valid: {', '.join(BLOCKS)} "
                "(or pass tableau=(A, b) for your own explicit Runge-Kutta method)"
            )
        if self.sublayer not in SUBLAYERS:
            raise ValueError(f"unknown sublayer {self.sublayer!r}; valid: {', '.join(SUBLAYERS)}")
        if self.stack not in STACKS:
            raise ValueError(f"unknown stack {self.stack!r}; valid: {', '.join(STACKS)}")
        if self.stack == "macaron":
            if self.block != "residual" or self.sublayer != "both":
                raise ValueError(
                    "stack='macaron' builds its own FFN/attention/FFN layers; leave "
                    f"block='residual' and sublayer='both' (got {self.block!r}, {self.sublayer!r})"
                )
            if self.d_ff % 2 != 0:
                raise ValueError(
                    f"stack='macaron' halves d_ff, which must be even; got {self.d_ff}"
                )

    def to_dict(self) -> dict:
        """JSON-ready dict (the tableau as nested lists)."""
        out = dataclasses.asdict(self)
        if self.tableau is not None:
            out["tableau"] = [[list(row) for row in self.tableau[0]], list(self.tableau[1])]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ODETransformerConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error that names the valid ones."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid: {', '.join(sorted(fields))}")
        return cls(**data)


def check_tokens(
    tokens: torch.Tensor, vocab_size: int, max_positions: int, offset: int = 0
) -> None:
    """Raise a clear ValueError for token tensors the model cannot embed."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a LongTensor of shape [batch, time], got {shape}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be integer ids (torch.long), got dtype {tokens.dtype}")
    if offset + tokens.shape[1] > max_positions:
        raise ValueError(
            f"sequence of {offset + tokens.shape[1]} positions is longer than max_positions="
            f"{max_positions}; truncate the input or build the model with a larger max_positions"
        )
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}), got range "
            f"[{int(tokens.min())}, {int(tokens.max())}]"
        )


def init_weights(module: nn.Module) -> None:
    """GPT-style initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


# -----------------------------------------------------------------------------------------
# The model


class ODETransformerLM(nn.Module):
    """Causal LM: token + position embeddings, an ODE Transformer stack, LayerNorm, softmax."""

    is_causal = True

    def __init__(self, config: ODETransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_positions
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_positions, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=True)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(init_weights)
        if config.tie_embeddings:
            self.head.weight = self.token_embedding.weight

    def block_modules(self) -> list[nn.Module]:
        """The per-layer modules, in depth order (for per-block gradient-norm logging)."""
        return list(self.stack.layers)

    def hidden_states(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final-LayerNorm states ``[B, T, d_model]``; with a ``cache`` the tokens continue
        the cached sequence (positions start at ``cache.position``), extending it in place."""
        start = 0 if cache is None else cache.position
        check_tokens(tokens, self.vocab_size, self.max_positions, offset=start)
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        x = self.stack(x, cache)
        if cache is not None:
            cache.position += tokens.shape[1]
        return self.norm(x)

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Logits ``[B, T, V]`` where ``logits[:, t]`` predicts ``tokens[:, t + 1]`` (``cache``:
        see :meth:`hidden_states`); ``aux["nfe"]`` counts sub-layer evaluations per position."""
        return self.head(self.hidden_states(tokens, cache)), {"nfe": self.stack.nfe}

    def next_token_logits(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` at the last position only (what generation needs)."""
        return self.head(self.hidden_states(tokens, cache)[:, -1])

    # -------------------------------------------------------------------------------------
    # Generation

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        *,
        strategy: str = "greedy",
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_beams: int = 4,
        use_cache: bool = True,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``tokens`` [B, T]; returns prompt + continuation as a LongTensor.

        ``use_cache=False`` recomputes the whole prefix every step (the reference the cache
        is checked against). With ``eos_token_id`` a finished sequence is padded with it and
        generation stops early once every sequence (or every beam) has finished.
        """
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(
                f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}"
            )
        if temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (use strategy='greedy' for argmax), got {temperature}"
            )
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] or be None, got {top_p!r}")
        if strategy == "beam" and (not isinstance(num_beams, int) or num_beams < 1):
            raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}")
        check_tokens(tokens, self.vocab_size, self.max_positions)
        if tokens.shape[1] == 0:
            raise ValueError("generate() needs a prompt of at least one token")
        if tokens.shape[1] + max_new_tokens > self.max_positions:
            raise ValueError(
                f"prompt length {tokens.shape[1]} + max_new_tokens {max_new_tokens} exceeds "
                f"max_positions={self.max_positions}; shorten the prompt or generate fewer tokens"
            )
        was_training = self.training
        self.eval()
        try:
            if strategy == "beam":
                return self._beam_search(tokens, max_new_tokens, num_beams, use_cache, eos_token_id)
            return self._decode(
                tokens,
                max_new_tokens,
                use_cache,
                eos_token_id,
                sample=strategy == "sample",
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
            )
        finally:
            self.train(was_training)

    def _decode(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        use_cache: bool,
        eos_token_id: int | None,
        *,
        sample: bool,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """Greedy or sampled decoding, one token per step."""
        cache = KVCache() if use_cache else None
        sequence, step_input = tokens, tokens
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for _ in range(max_new_tokens):
            logits = self.next_token_logits(step_input, cache)
            if sample:
                probs = F.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
                next_token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            else:
                next_token = logits.argmax(dim=-1)
            if eos_token_id is not None:
                next_token = torch.where(finished, eos_token_id, next_token)
                finished |= next_token == eos_token_id
            sequence = torch.cat([sequence, next_token[:, None]], dim=1)
            if eos_token_id is not None and bool(finished.all()):
                break
            step_input = next_token[:, None] if use_cache else sequence
        return sequence

    def _beam_search(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        num_beams: int,
        use_cache: bool,
        eos_token_id: int | None,
    ) -> torch.Tensor:
        """Beam search on summed log-probabilities; returns the best beam per sequence."""
        B, K, V = tokens.shape[0], num_beams, self.vocab_size
        sequence = tokens.repeat_interleave(K, dim=0)  # [B*K, T]
        scores = torch.full((B, K), float("-inf"), device=tokens.device)
        scores[:, 0] = 0.0  # all beams start equal: keep one so the first step has no duplicates
        finished = torch.zeros(B * K, dtype=torch.bool, device=tokens.device)
        cache = KVCache() if use_cache else None
        step_input = sequence
        for _ in range(max_new_tokens):
            log_probs = F.log_softmax(self.next_token_logits(step_input, cache).float(), dim=-1)
            if eos_token_id is not None:  # a finished beam can only continue with eos, free
                log_probs[finished] = float("-inf")
                log_probs[finished, eos_token_id] = 0.0
            candidates = (scores.reshape(B * K, 1) + log_probs).reshape(B, K * V)
            scores, flat = candidates.topk(K, dim=1)
            source = (torch.arange(B, device=tokens.device)[:, None] * K + flat // V).reshape(-1)
            next_token = (flat % V).reshape(-1)
            sequence = torch.cat([sequence[source], next_token[:, None]], dim=1)
            if cache is not None:
                cache.reorder(source)
            if eos_token_id is not None:
                finished = finished[source] | (next_token == eos_token_id)
                if bool(finished.all()):
                    break
            step_input = next_token[:, None] if use_cache else sequence
        best = scores.argmax(dim=1)
        return sequence.reshape(B, K, -1)[torch.arange(B, device=tokens.device), best]

    # -------------------------------------------------------------------------------------
    # Saving and loading

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.pt`` (the state dict) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_FILE).write_text(json.dumps(self.config.to_dict(), indent=2))
        torch.save(self.state_dict(), directory / WEIGHTS_FILE)

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str = "cpu") -> ODETransformerLM:
        """Rebuild a model saved by :meth:`save_pretrained`."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(
                    f"{directory / name} not found; from_pretrained expects a directory written "
                    "by save_pretrained (config.json + model.pt)"
                )
        config = ODETransformerConfig.from_dict(json.loads((directory / CONFIG_FILE).read_text()))
        model = cls(config)
        state = torch.load(directory / WEIGHTS_FILE, map_location=map_location, weights_only=True)
        model.load_state_dict(state)
        return model


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set logits outside the top-k tokens / the top-p nucleus to -inf (rows of ``[B, V]``).

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``.
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # mass before >= p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
