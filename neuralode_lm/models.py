"""Language models of the continuous-depth family, each meeting the model contract.

``logits, aux = model(tokens)``; ``logits[:, t]`` predicts ``tokens[:, t + 1]``. Models over
GPT-2 also take ``model(tokens, attention_mask=mask)`` (``accepts_attention_mask``), which
makes left-padded sentences score as unpadded ones. The ODE
models put ``aux["nfe"]`` (forward function evaluations of this call), the step counts and,
with regularisation in training, ``aux["reg"]`` (add it to the loss); after ``backward()``
``model.solver_stats.nfe_backward`` holds the backward NFE.

* baselines: [`LSTMLM`][neuralode_lm.LSTMLM] (report section 3.4), [`GPT2LM`][neuralode_lm.GPT2LM]
  (3.5);
* [`ODELSTM`][neuralode_lm.ODELSTM] (3.6), [`ODEGPT2`][neuralode_lm.ODEGPT2] (3.7),
  [`AugmentedODEGPT2`][neuralode_lm.AugmentedODEGPT2] (3.8): an encoder and a causal ODE head by
  default, or with ``reconstruction=True`` the report's non-causal reconstruction decoder.

Every model saves and loads with ``save_pretrained(dir)`` / ``from_pretrained(dir)``
([`odelm.pretrained.PretrainedMixin`][odelm.pretrained.PretrainedMixin]).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

import torch
from torch import nn

from odelm.hf import HuggingFaceLM
from odelm.pretrained import PretrainedMixin

from .configs import (
    RENAMED,
    AugODEGPT2Config,
    GPT2LMConfig,
    LSTMConfig,
    ODEGPT2Config,
    ODEHeadConfig,
    ODELSTMConfig,
    fields_of,
    from_options,
)
from .encoders import GPT2Encoder, LSTMEncoder
from .errors import ModelConfigError
from .heads import CausalODEHead, ReconstructionODEDecoder
from .stats import ForwardStats
from .transformer import NODETransformerLM

__all__ = [
    "GPT2LM",
    "LSTMLM",
    "MODELS",
    "ODEGPT2",
    "ODELSTM",
    "AugmentedODEGPT2",
    "build_model",
]


class LSTMLM(PretrainedMixin, HuggingFaceLM):
    """The report's LSTM baseline: 300-d embedding, 300-unit LSTM, dropout 0.1, linear.

    Options are [`LSTMConfig`][neuralode_lm.LSTMConfig] fields (or ``config=``), e.g.
    ``tie_embeddings=True`` to share the embedding with the output layer. Stateful: pass
    ``state`` (``None`` for a fresh stream) and read the next one from ``aux["state"]``.
    """

    is_causal = True
    supports_state = True
    config_class = LSTMConfig
    renamed_keys = RENAMED
    input_embeddings_name = "encoder.embedding"

    def __init__(self, vocab_size: int, config: LSTMConfig | None = None, **options: Any) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.encoder = LSTMEncoder(vocab_size, config, **options)
        self.config = self.encoder.config
        self.head = nn.Linear(self.encoder.hidden_dim, vocab_size)
        self.encoder.tie_output(self.head)

    def forward(
        self,
        tokens: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        hidden, aux = self.features(tokens, state, attention_mask)
        return self.head(hidden), aux

    def features(
        self,
        tokens: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The LSTM's (dropped-out) states ``[B, T, hidden_dim]``, which
        [`output_layer`][neuralode_lm.LSTMLM.output_layer] maps to the logits, and ``aux``
        (``{"state": (h, c)}``); ``attention_mask`` (True on real tokens): padding leaves
        the state unchanged (``LSTMEncoder.forward_with_state``)."""
        hidden, state = self.encoder.forward_with_state(tokens, state, attention_mask)
        return hidden, {"state": state}

    @property
    def output_layer(self) -> nn.Linear:
        """The linear softmax layer (tied to the embedding with ``tie_embeddings``)."""
        return self.head

    def block_modules(self) -> list[nn.Module]:
        return [self.encoder, self.head]


def _gpt2_pretrained_config(config: dict[str, Any], encoder: GPT2Encoder) -> dict[str, Any]:
    """A saved GPT-2 model rebuilds from its architecture, not from the hub or a local path
    (the weights file holds the trained weights)."""
    return {**config, "pretrained": None, "config": encoder.config.to_dict(), "offline": None}


def _gpt2_encoder(vocab_size: int, options: GPT2LMConfig, layer: int) -> GPT2Encoder:
    pretrained, config = options.pretrained, options.config
    freeze, offline = options.freeze, options.offline
    if pretrained is not None and config is not None:
        raise ModelConfigError(
            "pass either pretrained (a directory or hub name) or config, not both"
        )
    if pretrained is None:
        return GPT2Encoder.from_config(config, layer=layer, freeze=freeze, vocab_size=vocab_size)
    encoder = GPT2Encoder.from_pretrained(pretrained, layer=layer, freeze=freeze, offline=offline)
    if encoder.vocab_size != vocab_size:
        raise ModelConfigError(
            f"the pretrained GPT-2 at {os.fspath(pretrained)!r} has vocab_size "
            f"{encoder.vocab_size}, but vocab_size={vocab_size} was asked for; tokenize with "
            "that model's tokenizer (GPT-2 BPE) or train from a config"
        )
    return encoder


class GPT2LM(PretrainedMixin, HuggingFaceLM):
    """GPT-2 with its tied output embedding, as ``GPT2LMHeadModel``; pretrained or from config.

    Options are [`GPT2LMConfig`][neuralode_lm.GPT2LMConfig] fields (``config`` is GPT-2's
    own ``GPT2Config`` or a dict of its fields).
    """

    is_causal = True
    config_class = GPT2LMConfig
    input_embeddings_name = "encoder.model.wte"
    output_embeddings_name = None  # the logits are hidden @ wte.T

    def __init__(self, vocab_size: int, **options: Any) -> None:
        super().__init__()
        config = from_options(GPT2LMConfig, options)
        self.config = config
        self.vocab_size = vocab_size
        self.encoder = _gpt2_encoder(vocab_size, config, -1)

    @property
    def max_positions(self) -> int:
        return self.encoder.max_positions

    def pretrained_config(self) -> dict[str, Any]:
        return _gpt2_pretrained_config(super().pretrained_config(), self.encoder)

    accepts_attention_mask = True

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        hidden = self.encoder(tokens, attention_mask)
        return hidden @ self.encoder.model.wte.weight.T, {}

    def block_modules(self) -> list[nn.Module]:
        return [self.encoder.model.wte, *self.encoder.model.h, self.encoder.model.ln_f]


class _ODELanguageModel(PretrainedMixin, HuggingFaceLM):
    """Encoder + continuous-depth head; reports the solver's statistics."""

    config_class: ClassVar[type | None] = ODEHeadConfig
    output_embeddings_name = "head.proj"

    def __init__(
        self, encoder: nn.Module, vocab_size: int, config: ODEHeadConfig, field_hidden: int | None
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.encoder = encoder
        head_class = ReconstructionODEDecoder if config.reconstruction else CausalODEHead
        self.head = head_class(
            encoder.output_dim, vocab_size, field_hidden=field_hidden, **config.head_options()
        )

    @property
    def is_causal(self) -> bool:
        return self.head.is_causal

    @property
    def exactly_causal(self) -> bool:
        """Causal to the last bit (``CausalODEHead.exactly_causal``), not within the
        solver's tolerance only: a training step may then leave out the last position."""
        return bool(getattr(self.head, "exactly_causal", False))

    @property
    def solver_stats(self) -> ForwardStats:
        """Statistics of the latest forward pass (``nfe_backward`` filled by its backward
        pass); the same type as
        [`NODETransformerLM.solver_stats`][neuralode_lm.NODETransformerLM.solver_stats]."""
        return self.head.last_stats

    @property
    def accepts_attention_mask(self) -> bool:
        """Whether the encoder honours a padding mask (GPT-2 does; the LSTM reads pads)."""
        return isinstance(self.encoder, GPT2Encoder)

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        if attention_mask is None:
            return self.head(self.encoder(tokens))
        return self.head(self.encoder(tokens, attention_mask), attention_mask)

    def block_modules(self) -> list[nn.Module]:
        return [self.encoder, self.head]


class ODELSTM(_ODELanguageModel):
    """The report's ODE-LSTM: the LSTM baseline's states decoded by an ODE (MLP field, 100).

    Options are [`ODELSTMConfig`][neuralode_lm.ODELSTMConfig] fields: the LSTM's
    ([`LSTMConfig`][neuralode_lm.LSTMConfig], also accepted as ``config=``) and the head's
    ([`ODEHeadConfig`][neuralode_lm.ODEHeadConfig]: ``field``, ``integration_time``,
    ``solver``, ``augment_dim``, ``augment_init``, ``kinetic_weight``, ``jacobian_weight``,
    ``reconstruction`` and, for the causal head, ``exact_causal_eval``).
    ``tie_embeddings=True`` shares the embedding with the head's readout, which needs the ODE
    state's width (``hidden_dim + augment_dim``) to equal ``embed_dim``. Stateful like
    ``LSTMLM``.
    """

    supports_state = True
    config_class = ODELSTMConfig
    renamed_keys = RENAMED
    input_embeddings_name = "encoder.embedding"

    def __init__(
        self,
        vocab_size: int,
        config: ODELSTMConfig | LSTMConfig | None = None,
        **options: Any,
    ) -> None:
        base = None if config is None else ODELSTMConfig(**fields_of(config))
        settings = from_options(ODELSTMConfig, options, base)
        encoder = LSTMEncoder(vocab_size, settings.lstm())
        super().__init__(encoder, vocab_size, settings.head(), settings.field_hidden)
        self.config = settings
        encoder.tie_output(self.head.proj)

    def forward(  # type: ignore[override]  # stateful: state before the mask, as LSTMLM's
        self,
        tokens: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        hidden, state = self.encoder.forward_with_state(tokens, state, attention_mask)
        logits, aux = self.head(hidden, attention_mask)
        return logits, {**aux, "state": state}


class ODEGPT2(_ODELanguageModel):
    """The report's ODE-GPT2: GPT-2 hidden layer ``layer`` (12 there) decoded by an ODE.

    Options are [`ODEGPT2Config`][neuralode_lm.ODEGPT2Config] fields; the field's hidden
    width defaults to ``n_embd`` (768 in the report).
    """

    config_class = ODEGPT2Config
    input_embeddings_name = "encoder.model.wte"

    def __init__(self, vocab_size: int, **options: Any) -> None:
        config = from_options(self.config_class, options)
        encoder = _gpt2_encoder(vocab_size, config, config.layer)
        if config.augment_dim is None:  # aug-ode-gpt2: as wide as GPT-2's state
            config = dataclasses.replace(config, augment_dim=encoder.output_dim)
        super().__init__(encoder, vocab_size, config.head(), config.field_hidden)
        self.config = config

    @property
    def max_positions(self) -> int:
        return self.encoder.max_positions

    def pretrained_config(self) -> dict[str, Any]:
        return _gpt2_pretrained_config(super().pretrained_config(), self.encoder)


class AugmentedODEGPT2(ODEGPT2):
    """ODE-GPT2 with ``augment_dim`` extra dimensions (default ``n_embd``, doubling the state)
    initialised, as in the report, to GPT-2's state at the first token (``augment_init``
    "first"; "zeros" is Dupont et al.'s original)."""

    config_class = AugODEGPT2Config


MODELS: dict[str, type[nn.Module]] = {
    "lstm": LSTMLM,
    "ode-lstm": ODELSTM,
    "gpt2": GPT2LM,
    "ode-gpt2": ODEGPT2,
    "aug-ode-gpt2": AugmentedODEGPT2,
    "node-transformer": NODETransformerLM,
}


def build_model(name: str, vocab_size: int, **kwargs: Any) -> nn.Module:
    """A model by name (``lstm``, ``ode-lstm``, ``gpt2``, ``ode-gpt2``, ``aug-ode-gpt2``,
    ``node-transformer``).

    ``kwargs`` go to the class; ODE models take ``reconstruction=True`` for the report's
    non-causal decoder.
    """
    if name not in MODELS:
        raise ModelConfigError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ModelConfigError(f"vocab_size must be a positive int, got {vocab_size!r}")
    return MODELS[name](vocab_size, **kwargs)
