"""One frozen, typed configuration per model of the continuous-depth family.

Every choice is a ``Literal`` (its valid values are the type), every field is documented
(``Attributes:``, which is also the help of the run config's ``model:`` keys). The ODE
models' configs hold their encoder's fields and the head's fields side by side, and hand
each part its own config ([`ODELSTMConfig.lstm`][neuralode_lm.ODELSTMConfig.lstm],
[`ODEHeadConfig.head`][neuralode_lm.ODEHeadConfig.head]), so no options dict is split by name.

One name per concept: the layer count is ``n_layers`` everywhere. The spellings of odelm
0.3 and before (``RENAMED``) are refused with a hint naming the new key
(``check_renamed``); a model saved by those versions loads (its class's
``renamed_keys``, [`odelm.pretrained.PretrainedMixin`][odelm.pretrained.PretrainedMixin]).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ode_transformer.layers import check_heads

from .errors import ModelConfigError
from .solvers.config import ADAPTIVE_METHODS, BACKEND_METHODS, SolverConfig

__all__ = [
    "RENAMED",
    "AugODEGPT2Config",
    "AugmentInit",
    "CausalMode",
    "FieldName",
    "GPT2LMConfig",
    "LSTMConfig",
    "NODETransformerConfig",
    "ODEGPT2Config",
    "ODEHeadConfig",
    "ODELSTMConfig",
    "TimeConditioning",
    "check_renamed",
    "from_options",
]

FieldName = Literal["mlp", "time-concat"]
"""The built-in vector fields (``neuralode_lm.fields.FIELDS``)."""
AugmentInit = Literal["zeros", "first"]
"""How augmented dimensions start: zeros (Dupont et al.) or the first real token's state."""
TimeConditioning = Literal["none", "concat", "film", "weights", "hypernetwork"]
"""How the depth field of ``node-transformer`` sees the depth ``s``: through its norms
(``concat``, ``film``) or its weights (``weights``, ``hypernetwork``)."""
CausalMode = Literal["shared", "prefix"]
"""``node-transformer``'s solves: one per batch, or every prefix alone in evaluation."""

RENAMED = {"num_layers": "n_layers", "n_blocks": "n_layers", "tie_weights": "tie_embeddings"}
"""Model keys of odelm 0.3 and before, and the one name each has now."""
WHAT = {"n_layers": "the layer count", "tie_embeddings": "tying the output to the embedding"}


def check_renamed(options: dict[str, Any], where: str = "") -> None:
    """``ModelConfigError`` naming the new key when ``options`` uses an old spelling."""
    for old, new in RENAMED.items():
        if old in options:
            raise ModelConfigError(
                f"{where}{old} was renamed {new} (one name for {WHAT[new]} in every model); "
                f"write {new}: {options[old]!r}"
            )


def from_options(cls: type, options: dict[str, Any], base: Any = None) -> Any:
    """``cls(**options)`` (over the fields of ``base``, a dataclass, when given), refusing
    an old spelling with its new name and an unknown key with the valid ones."""
    check_renamed(options)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise ModelConfigError(
            f"unknown {cls.__name__} key {unknown[0]}; valid: {', '.join(names)}"
        )
    inherited = {} if base is None else fields_of(base, names)
    return cls(**{**inherited, **options})


def fields_of(config: Any, names: list[str] | None = None) -> dict[str, Any]:
    """The fields of a dataclass instance as a shallow dict (tensors kept, not copied),
    only ``names`` when given."""
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if names is None or f.name in names
    }


def _choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The ``Literal`` fields of a config class and their values."""
    return {
        name: typing.get_args(hint)
        for name, hint in typing.get_type_hints(cls).items()
        if typing.get_origin(hint) is Literal
    }


def _positive_int(config: Any, names: tuple[str, ...]) -> None:
    """``ModelConfigError`` naming the first of ``names`` that is set (not None) but not a
    positive integer."""
    for name in names:
        value = getattr(config, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")


def _at_least_zero(config: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if not value >= 0:
            raise ModelConfigError(f"{name} must be >= 0, got {value!r}")


class _Config:
    """What every model config shares: its checks on construction (each class checks its
    own fields and calls its base's ``__post_init__``; the ``Literal`` choices here, which a
    run config's parser also enforces) and ``to_dict``: the config as ``config.json`` holds
    it (``embeddings`` left to the weights file)."""

    def __post_init__(self) -> None:
        for name, valid in _choices(type(self)).items():
            value = getattr(self, name)
            if name != "field" and value not in valid:  # field: a FIELDS name or a module
                raise ModelConfigError(
                    f"unknown {name} {value!r}; valid: {', '.join(map(str, valid))}"
                )

    def to_dict(self) -> dict[str, Any]:
        """The config's fields as a dict (an ``embeddings`` tensor left out)."""
        return {k: v for k, v in fields_of(self).items() if k != "embeddings"}


@dataclass(frozen=True)
class LSTMConfig(_Config):
    """The LSTM encoder of ``lstm`` and ``ode-lstm`` (pytorch/examples word_language_model).

    Attributes:
        embed_dim: width of the token embeddings
        hidden_dim: units of each LSTM layer
        n_layers: stacked LSTM layers
        dropout: dropout on the LSTM outputs and between layers
        input_dropout: dropout on the embeddings (word_language_model uses dropout for both)
        tie_embeddings: the output projection shares the embedding matrix (needs its
            input width to equal embed_dim)
        init_range: embedding and output weights uniform in [-init_range, init_range], zero
            bias (null: PyTorch's defaults)
        embeddings: initial embedding matrix [vocab, embed_dim] (Python API only)
        freeze_embeddings: keep the embeddings fixed
    """

    embed_dim: int = 300
    hidden_dim: int = 300
    n_layers: int = 1
    dropout: float = 0.1
    input_dropout: float = 0.0
    tie_embeddings: bool = False
    init_range: float | None = None
    embeddings: torch.Tensor | None = None
    freeze_embeddings: bool = False

    def __post_init__(self) -> None:
        if min(self.embed_dim, self.hidden_dim, self.n_layers) <= 0:
            raise ModelConfigError("embed_dim, hidden_dim and n_layers must be positive")
        for name in ("dropout", "input_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ModelConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.init_range is not None and not self.init_range > 0:
            raise ModelConfigError(f"init_range must be positive or None, got {self.init_range}")
        super().__post_init__()

    @classmethod
    def coerce(cls, config: LSTMConfig | None, options: dict[str, Any]) -> LSTMConfig:
        """``config`` with ``options`` (its field names) replaced, or a new one from them."""
        return from_options(cls, options, config)


@dataclass(frozen=True)
class ODEHeadConfig(_Config):
    """The continuous-depth head of the ODE models (``neuralode_lm.heads``).

    Attributes:
        field: the vector field f(s, z): mlp or time-concat (a module in the Python API)
        field_hidden: hidden width of the field (null: the model's default)
        integration_time: the depth S; the state is solved on s in [0, S]
        solver: the solver facade's settings, e.g. {method: dopri5, rtol: 1e-3, adjoint:
            true} (null: dopri5 at its default tolerances)
        augment_dim: extra state dimensions (Dupont et al.)
        augment_init: zeros, or first (the encoder state at the first real token)
        kinetic_weight: weight of the kinetic-energy regulariser (RNODE)
        jacobian_weight: weight of the Jacobian Frobenius regulariser (RNODE)
        exact_causal_eval: evaluation solves each position with its own step control
            (causal head only)
        reconstruction: the NODE-LM report's non-causal reconstruction decoder
    """

    field: FieldName = "mlp"
    field_hidden: int | None = None
    integration_time: float = 1.0
    solver: dict[str, Any] | None = None
    augment_dim: int = 0
    augment_init: AugmentInit = "zeros"
    kinetic_weight: float = 0.0
    jacobian_weight: float = 0.0
    exact_causal_eval: bool = False
    reconstruction: bool = False

    def __post_init__(self) -> None:
        if not self.integration_time > 0:
            raise ModelConfigError(
                f"integration_time S must be positive (s in [0, S]), got {self.integration_time!r}"
            )
        if self.augment_dim is not None and not self.augment_dim >= 0:
            raise ModelConfigError(f"augment_dim must be >= 0, got {self.augment_dim!r}")
        _at_least_zero(self, ("kinetic_weight", "jacobian_weight"))
        if self.reconstruction and self.exact_causal_eval:
            raise ModelConfigError(
                "exact_causal_eval applies to the causal head; the reconstruction decoder "
                "reads the whole sentence and is not causal (drop one of the two options)"
            )
        solver = SolverConfig.coerce(self.solver)
        if self.jacobian_weight > 0 and solver.backend == "torchode" and solver.adjoint:
            raise ModelConfigError(
                "the Jacobian regulariser needs autograd inside the field, which torchode's "
                "per-sample (vmapped) adjoint does not provide; use adjoint=False or "
                "another backend"
            )
        if self.exact_causal_eval and not solver.fixed:
            torchode = BACKEND_METHODS["torchode"]
            if solver.method not in torchode:
                raise ModelConfigError(
                    f"exact_causal_eval solves each position with its own step control "
                    f"(torchode), which has no {solver.method!r}; use one of "
                    f"{', '.join(sorted(torchode & ADAPTIVE_METHODS))} or a fixed-grid method"
                )
        super().__post_init__()

    def head(self) -> ODEHeadConfig:
        """The head's own part of a model config."""
        return ODEHeadConfig(**fields_of(self, [f.name for f in dataclasses.fields(ODEHeadConfig)]))

    def head_options(self) -> dict[str, Any]:
        """The keyword arguments of the head class this config picks."""
        options = fields_of(self.head())
        for name in ("field_hidden", "reconstruction", "exact_causal_eval"):
            options.pop(name)
        if not self.reconstruction:
            options["exact_causal_eval"] = self.exact_causal_eval
        return options


@dataclass(frozen=True)
class ODELSTMConfig(ODEHeadConfig, LSTMConfig):
    """``ode-lstm``: the LSTM encoder's fields and the ODE head's (field width 100).

    Attributes:
        field_hidden: hidden width of the field (the report's 100)
    """

    field_hidden: int | None = 100

    def lstm(self) -> LSTMConfig:
        """The encoder's own part of the config."""
        return LSTMConfig(**fields_of(self, [f.name for f in dataclasses.fields(LSTMConfig)]))


@dataclass(frozen=True)
class GPT2LMConfig(_Config):
    """``gpt2``: GPT-2 with its tied output embedding, pretrained or from a config.

    Attributes:
        pretrained: a local GPT-2 folder or a Hugging Face hub name (null: train from config)
        config: a GPT2Config's fields, e.g. {n_layer: 2, n_embd: 64, n_head: 4} (Hugging
            Face's own names)
        freeze: keep GPT-2's weights fixed (and in eval mode)
        offline: never contact the hub (null: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE decide)
    """

    pretrained: str | None = None
    config: dict[str, Any] | None = None
    freeze: bool = False
    offline: bool | None = None


@dataclass(frozen=True)
class ODEGPT2Config(ODEHeadConfig, GPT2LMConfig):
    """``ode-gpt2``: GPT-2's hidden layer ``layer`` decoded by the ODE head.

    Attributes:
        layer: GPT-2 hidden layer read by the head (0: embeddings, -1: the last)
        field_hidden: hidden width of the field (null: GPT-2's n_embd)
    """

    layer: int = -1


@dataclass(frozen=True)
class AugODEGPT2Config(ODEGPT2Config):
    """``aug-ode-gpt2``: ODE-GPT2 with an augmented state initialised at the first token.

    Attributes:
        augment_dim: extra state dimensions (null: GPT-2's n_embd, doubling the state)
        augment_init: zeros, or first (the report's: GPT-2's state at the first token)
    """

    augment_dim: int | None = None  # type: ignore[assignment]
    augment_init: AugmentInit = "first"


@dataclass(frozen=True)
class NODETransformerConfig(_Config):
    """``node-transformer``: n_layers depth ODEs of one attention + FFN field each.

    Attributes:
        d_model: width of the residual stream
        n_heads: attention heads
        d_ff: hidden width of the feed-forward network
        n_layers: depth ODEs (blocks), each with its own field
        max_positions: longest sequence (learned positions)
        integration_time: the depth S of each block
        time_conditioning: how the field sees s: none; concat or film (its norms); weights
            (each linear map W(s) = sum_k P_k(2s/S - 1) W_k over weight_basis Legendre
            polynomials) or hypernetwork (W(s) = W + A diag(g(s)) B, g a small network)
        solver: adaptive: {method: dopri5, rtol: 1e-3, adjoint: true}; a fixed grid:
            {method: rk4} with steps, or {method: rk4, step_size: 0.25}
        steps: fixed-grid steps per block (null: one, or solver.step_size)
        kinetic_weight: weight of the kinetic-energy regulariser (RNODE)
        jacobian_weight: weight of the Jacobian Frobenius regulariser (RNODE)
        causal_mode: shared (one solve per batch) or prefix (evaluation solves every
            prefix alone: exactly causal, adaptive only)
        dropout: dropout on the embeddings
        field_dropout: dropout inside the field (keep 0 for adaptive solvers)
        layer_norm_eps: LayerNorm epsilon
        weight_basis: K, the basis functions of time_conditioning weights (null: 4; 1 is
            the shared field)
        hypernetwork_rank: rank r of time_conditioning hypernetwork's update (null: 4)
    """

    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 512
    n_layers: int = 1
    max_positions: int = 256
    integration_time: float = 1.0
    time_conditioning: TimeConditioning = "none"
    solver: dict[str, Any] | None = None
    steps: int | None = None
    kinetic_weight: float = 0.0
    jacobian_weight: float = 0.0
    causal_mode: CausalMode = "shared"
    dropout: float = 0.1
    field_dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    weight_basis: int | None = None
    hypernetwork_rank: int | None = None

    def __post_init__(self) -> None:
        sizes = ("d_model", "n_heads", "d_ff", "n_layers", "max_positions")
        _positive_int(self, (*sizes, "weight_basis", "hypernetwork_rank"))
        check_heads(self.d_model, self.n_heads)
        if not self.integration_time > 0:
            raise ModelConfigError(
                f"integration_time S must be positive, got {self.integration_time!r}"
            )
        _at_least_zero(self, ("kinetic_weight", "jacobian_weight"))
        for name, mode in (("weight_basis", "weights"), ("hypernetwork_rank", "hypernetwork")):
            if getattr(self, name) is not None and self.time_conditioning != mode:
                raise ModelConfigError(f"{name} applies to time_conditioning {mode} only")
        super().__post_init__()
