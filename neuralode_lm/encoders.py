"""Causal encoders ``tokens [B, T] -> hidden [B, T, D]`` for the ODE heads and baselines.

* [`LSTMEncoder`][neuralode_lm.LSTMEncoder]: embedding + LSTM + dropout, configured by one
  [`LSTMConfig`][neuralode_lm.LSTMConfig];
  the NODE-LM report's baseline (300-d, dropout 0.1) is
  [`LSTMEncoder.report_preset`][neuralode_lm.LSTMEncoder.report_preset].
* [`GPT2Encoder`][neuralode_lm.GPT2Encoder]: a ``transformers`` ``GPT2Model`` whose hidden layer
  ``layer`` (0 = embeddings, ``n_layer`` = the final, layer-normed output; the report uses the 12th)
  feeds the head; from a local directory, a hub name when the hub is reachable, or a
  ``GPT2Config`` for training from scratch; frozen or fine-tuned.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ode_transformer.backbone import TokenInputError, check_tokens
from odelm.checkpointing import Checkpointable
from odelm.mixed_precision import Dropout, recurrent_in_fp32

from .configs import LSTMConfig
from .errors import ModelConfigError

__all__ = ["GPT2Encoder", "LSTMConfig", "LSTMEncoder", "is_offline"]


def check_token_batch(
    tokens: torch.Tensor, vocab_size: int, max_positions: float = math.inf, offset: int = 0
) -> None:
    """``TokenInputError`` for tokens a model cannot read: not ``[batch, time]`` integer ids
    in ``[0, vocab_size)``, too long, or empty (no row or no position: nothing to predict)."""
    check_tokens(tokens, vocab_size, max_positions, offset)  # type: ignore[arg-type]
    if tokens.numel() == 0:
        raise TokenInputError(
            f"tokens must hold at least one sequence of at least one token, got shape "
            f"{tuple(tokens.shape)}"
        )


class LSTMEncoder(Checkpointable, nn.Module):
    """Embedding -> dropout -> LSTM -> dropout; ``[B, T] -> [B, T, hidden_dim]``, causal.

    ``forward_with_state`` also takes and returns the LSTM's ``(h, c)``, so a caller can
    continue a stream across consecutive windows (truncated backpropagation through time).
    With gradient checkpointing on ([`odelm.checkpointing`][odelm.checkpointing]) the LSTM
    runs one layer at a time, each layer recomputed in the backward pass: the same outputs
    as the fused ``nn.LSTM`` (and on the CPU the same dropout masks between layers).
    """

    def __init__(self, vocab_size: int, config: LSTMConfig | None = None, **options: Any) -> None:
        super().__init__()
        config = LSTMConfig.coerce(config, options)
        if vocab_size <= 0:
            raise ModelConfigError(f"vocab_size must be positive, got {vocab_size}")
        self.config, self.vocab_size, self.hidden_dim = config, vocab_size, config.hidden_dim
        self.embedding = nn.Embedding(vocab_size, config.embed_dim)
        if config.init_range is not None:
            nn.init.uniform_(self.embedding.weight, -config.init_range, config.init_range)
        if config.embeddings is not None:
            if tuple(config.embeddings.shape) != (vocab_size, config.embed_dim):
                raise ModelConfigError(
                    f"embeddings must have shape ({vocab_size}, {config.embed_dim}), "
                    f"got {tuple(config.embeddings.shape)}"
                )
            with torch.no_grad():
                self.embedding.weight.copy_(config.embeddings)
        self.embedding.weight.requires_grad_(not config.freeze_embeddings)
        self.input_dropout = Dropout(config.input_dropout)
        self.lstm = nn.LSTM(
            config.embed_dim,
            config.hidden_dim,
            num_layers=config.n_layers,
            batch_first=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )
        self.dropout = Dropout(config.dropout)

    @classmethod
    def report_preset(cls, vocab_size: int, **overrides: Any) -> LSTMEncoder:
        """The report's baseline LSTM: 300-d inputs (GloVe there), 300 units, dropout 0.1."""
        options: dict[str, Any] = {"embed_dim": 300, "hidden_dim": 300, "dropout": 0.1}
        options.update(overrides)
        return cls(vocab_size, **options)

    @property
    def output_dim(self) -> int:
        return self.hidden_dim

    def forward_with_state(
        self,
        tokens: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Hidden states ``[B, T, hidden_dim]`` and the ``(h, c)`` after the last token;
        ``attention_mask`` (True on real tokens): padding leaves the state as it was, so a
        padded row's real tokens get the states they get alone, and ``(h, c)`` is each row's
        after its last real token."""
        check_token_batch(tokens, self.embedding.weight.shape[0])  # a LoRA wrapper too
        inputs = self.input_dropout(self.embedding(tokens))
        if self.checkpointing():
            return self._by_layer(inputs, state, attention_mask)
        if attention_mask is not None:
            return self._masked(inputs, state, attention_mask)
        if recurrent_in_fp32(inputs):
            with torch.autocast(inputs.device.type, enabled=False):
                floats = None if state is None else (state[0].float(), state[1].float())
                out, state = self.lstm(inputs.float(), floats)
        else:
            out, state = self.lstm(inputs, state)
        return self.dropout(out), state

    def _masked(
        self,
        inputs: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The LSTM one step at a time, each row's state updated only at its real tokens."""
        fp32 = recurrent_in_fp32(inputs)
        inputs = inputs.float() if fp32 else inputs
        if state is None:
            zeros = inputs.new_zeros(self.lstm.num_layers, inputs.shape[0], self.hidden_dim)
            state = (zeros, zeros)
        h, c = (state[0].to(inputs.dtype), state[1].to(inputs.dtype))
        outputs = []
        keep = attention_mask.bool()[None, :, :, None]  # [1, B, T, 1]: layers, rows, time
        off = torch.autocast(inputs.device.type, enabled=False)
        with off if fp32 else contextlib.nullcontext():
            for t in range(inputs.shape[1]):
                out, (h_new, c_new) = self.lstm(inputs[:, t : t + 1], (h, c))
                h = torch.where(keep[:, :, t], h_new, h)
                c = torch.where(keep[:, :, t], c_new, c)
                outputs.append(out)
        return self.dropout(torch.cat(outputs, dim=1)), (h, c)

    def _by_layer(
        self,
        inputs: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The LSTM one checkpointed layer at a time, with its dropout between layers."""
        fp32 = recurrent_in_fp32(inputs)
        inputs = inputs.float() if fp32 else inputs
        layers = self.lstm.num_layers
        if state is None:
            zeros = inputs.new_zeros(layers, inputs.shape[0], self.hidden_dim)
            state = (zeros, zeros)
        h, c = (state[0].to(inputs.dtype), state[1].to(inputs.dtype))
        ends: list[tuple[torch.Tensor, torch.Tensor]] = []
        off = torch.autocast(inputs.device.type, enabled=False)
        with off if fp32 else contextlib.nullcontext():
            for k in range(layers):
                layer_state = (h[k : k + 1], c[k : k + 1])
                inputs, end = self.checkpointed(self._layer, k, inputs, layer_state, attention_mask)
                ends.append(end)
                if k < layers - 1:
                    inputs = F.dropout(inputs, self.lstm.dropout, self.training)
        h = torch.cat([end[0] for end in ends])
        return self.dropout(inputs), (h, torch.cat([end[1] for end in ends]))

    def _layer(
        self,
        k: int,
        inputs: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Layer ``k`` of the LSTM over ``inputs`` (its own weights, as ``nn.LSTM`` runs
        them); with ``attention_mask``, one step at a time, the state kept at padding."""
        weights = self.lstm._flat_weights[4 * k : 4 * k + 4]

        def run(x: torch.Tensor, hc: tuple[torch.Tensor, torch.Tensor]) -> Any:
            return torch._VF.lstm(x, hc, weights, True, 1, 0.0, self.training, False, True)

        if attention_mask is None:
            out, h, c = run(inputs, state)
            return out, (h, c)
        (h, c), outputs = state, []
        keep = attention_mask.bool()[None, :, :, None]  # [1, B, T, 1]
        for t in range(inputs.shape[1]):
            out, h_new, c_new = run(inputs[:, t : t + 1], (h, c))
            h, c = torch.where(keep[:, :, t], h_new, h), torch.where(keep[:, :, t], c_new, c)
            outputs.append(out)
        return torch.cat(outputs, dim=1), (h, c)

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.forward_with_state(tokens, None, attention_mask)[0]

    def tie_output(self, projection: nn.Linear) -> None:
        """Apply ``init_range`` and ``tie_embeddings`` to the output projection of an LM."""
        config = self.config
        if config.init_range is not None:
            nn.init.uniform_(projection.weight, -config.init_range, config.init_range)
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)
        if config.tie_embeddings:
            if projection.in_features != config.embed_dim:
                raise ModelConfigError(
                    f"tie_embeddings needs the output projection's input width "
                    f"({projection.in_features}) to equal embed_dim ({config.embed_dim}); "
                    "set embed_dim to that width or tie_embeddings to false"
                )
            projection.weight = self.embedding.weight


def is_offline(offline: bool | None = None) -> bool:
    """Whether to stay off the network: ``offline`` if given, else the HF environment."""
    if offline is not None:
        return offline
    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag.strip().lower() in ("1", "true", "yes", "on") for flag in flags)


def _looks_like_path(name: str) -> bool:
    return (
        os.path.isabs(name)
        or name.startswith(("./", "../", "~", ".\\"))
        or name.count("/") > 1
        or os.path.exists(name)
    )


def load_gpt2_model(
    name_or_path: str | os.PathLike[str], *, offline: bool | None = None, **kwargs: Any
) -> nn.Module:
    """``GPT2Model.from_pretrained`` that fails clearly, and without a network attempt offline.

    A local directory is loaded with ``local_files_only=True``. Anything else is a hub name,
    tried only when not offline (``offline=True``, ``HF_HUB_OFFLINE=1`` or
    ``TRANSFORMERS_OFFLINE=1``); a missing path is a ``FileNotFoundError`` either way.
    """
    from transformers import GPT2Model

    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{path} has no config.json; save a model there with "
                "`model.save_pretrained(path)` or point to a Hugging Face model directory"
            )
        return GPT2Model.from_pretrained(str(path), local_files_only=True, **kwargs)
    if _looks_like_path(name) or isinstance(name_or_path, Path):
        raise FileNotFoundError(
            f"pretrained GPT-2 directory {name!r} does not exist (or is not a directory); pass "
            "an existing directory "
            "(saved with save_pretrained) or a GPT2Config to train from scratch"
        )
    if is_offline(offline):
        raise FileNotFoundError(
            f"{name!r} is not a local directory and offline mode is on (offline=True, "
            "HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE), so the hub was not contacted; pass a "
            "local directory saved with save_pretrained, or a GPT2Config"
        )
    try:
        return GPT2Model.from_pretrained(name, **kwargs)
    except OSError as error:
        raise FileNotFoundError(
            f"could not load GPT-2 {name!r} from the Hugging Face hub ({error}); pass a local "
            "directory saved with save_pretrained, or a GPT2Config to train from scratch"
        ) from error


def gpt2_config(config: Any = None, **overrides: Any) -> Any:
    """A ``GPT2Config`` from a config, a dict of its fields, or defaults, with overrides."""
    from transformers import GPT2Config

    if config is None:
        fields: dict[str, Any] = {}
    elif isinstance(config, GPT2Config):
        fields = config.to_dict()
    elif isinstance(config, dict):
        fields = dict(config)
    else:
        raise TypeError(f"config must be a GPT2Config or a dict, got {type(config).__name__}")
    fields.update(overrides)
    vocab = fields.get("vocab_size", GPT2Config().vocab_size)
    for special in ("bos_token_id", "eos_token_id"):
        # GPT-2's default special id 50256 does not exist in a smaller vocabulary.
        if fields.get(special, 50256) is not None and fields.get(special, 50256) >= vocab:
            fields[special] = vocab - 1
    return GPT2Config(**fields)


class GPT2Encoder(nn.Module):
    """A ``GPT2Model`` whose hidden layer ``layer`` is the output ``[B, T, n_embd]``.

    ``layer`` indexes ``hidden_states``: 0 is the embedding output, ``n_layer`` (or -1, the
    default) the final layer after ``ln_f``; the report's "12th decoder" of GPT-2 small is
    12. ``freeze=True`` stops gradients into GPT-2 and keeps it in eval mode (no dropout).
    """

    def __init__(self, model: nn.Module, *, layer: int = -1, freeze: bool = False) -> None:
        super().__init__()
        self.model = model
        n_layer = model.config.n_layer
        if not -(n_layer + 1) <= layer <= n_layer:
            raise ValueError(
                f"layer must be in [0, {n_layer}] (or negative from the end) for a "
                f"{n_layer}-layer GPT-2, got {layer}"
            )
        self.layer = layer % (n_layer + 1)
        self.freeze = freeze
        if freeze:
            self.model.requires_grad_(False)
        elif self.layer < n_layer:
            # The blocks above ``layer`` and the final norm never reach the output: frozen,
            # so every trainable parameter gets a gradient (DDP's unused-parameter check).
            for unused in (*self.model.h[self.layer :], self.model.ln_f):
                unused.requires_grad_(False)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        layer: int = -1,
        freeze: bool = False,
        offline: bool | None = None,
    ) -> GPT2Encoder:
        """From a local directory, or a hub name when not offline (see ``load_gpt2_model``)."""
        return cls(load_gpt2_model(name_or_path, offline=offline), layer=layer, freeze=freeze)

    @classmethod
    def from_config(
        cls, config: Any = None, *, layer: int = -1, freeze: bool = False, **overrides: Any
    ) -> GPT2Encoder:
        """A randomly initialised GPT-2 for training from scratch."""
        from transformers import GPT2Model

        return cls(GPT2Model(gpt2_config(config, **overrides)), layer=layer, freeze=freeze)

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def output_dim(self) -> int:
        return self.model.config.n_embd

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.model.config.n_positions

    def train(self, mode: bool = True) -> GPT2Encoder:
        super().train(mode)
        if self.freeze:
            self.model.eval()
        return self

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the GPT-2 weights and config where
        [`from_pretrained`][neuralode_lm.GPT2Encoder.from_pretrained] can read them."""
        self.model.save_pretrained(os.fspath(directory))

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states ``[B, T, n_embd]``; ``attention_mask [B, T]`` (True on real tokens)
        hides padding from attention and numbers positions from each row's first real
        token, so a left-padded row gives its real tokens the states of the unpadded one."""
        if tokens.shape[1] > self.max_positions:
            raise ValueError(
                f"sequence length {tokens.shape[1]} exceeds GPT-2's n_positions "
                f"{self.max_positions}"
            )
        masking: dict[str, torch.Tensor] = {}
        if attention_mask is not None:
            mask = attention_mask.long()
            masking = {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze):
            if self.layer == self.model.config.n_layer:
                return self.model(tokens, use_cache=False, **masking).last_hidden_state
            out = self.model(tokens, use_cache=False, output_hidden_states=True, **masking)
            return out.hidden_states[self.layer]
