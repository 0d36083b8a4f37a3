"""Continuous-depth language models: ODE decoders over LSTM and GPT-2 encoders.

The solver facade [`solve`][neuralode_lm.solve] (torchdiffeq, TorchDyn, torchode) and its
``torchdiffeq.odeint``-compatible twin [`odeint`][neuralode_lm.odeint], vector fields, the causal
ODE head and the NODE-LM report's reconstruction decoder, encoders, and the models
(``build_model("ode-lstm", vocab_size)`` etc.) and the continuous-depth Transformer
[`NODETransformerLM`][neuralode_lm.NODETransformerLM], all trained in minibatches.
"""

from .configs import (
    AugODEGPT2Config,
    GPT2LMConfig,
    LSTMConfig,
    NODETransformerConfig,
    ODEGPT2Config,
    ODEHeadConfig,
    ODELSTMConfig,
)
from .encoders import GPT2Encoder, LSTMEncoder
from .errors import ModelConfigError
from .fields import FIELDS, AutonomousField, MLPField, TimeConcatField, as_field, make_field
from .heads import CausalODEHead, ReconstructionODEDecoder, RegularizedField
from .models import (
    GPT2LM,
    LSTMLM,
    MODELS,
    ODEGPT2,
    ODELSTM,
    AugmentedODEGPT2,
    build_model,
)
from .solvers import (
    MaxStepsExceeded,
    NonFiniteStateError,
    SolverConfig,
    SolverConfigError,
    SolverError,
    SolverStats,
    StepSizeUnderflowError,
    odeint,
    solve,
)
from .stats import ForwardStats
from .transformer import NODETransformerLM

__all__ = [
    "FIELDS",
    "GPT2LM",
    "LSTMLM",
    "MODELS",
    "ODEGPT2",
    "ODELSTM",
    "AugODEGPT2Config",
    "AugmentedODEGPT2",
    "AutonomousField",
    "CausalODEHead",
    "ForwardStats",
    "GPT2Encoder",
    "GPT2LMConfig",
    "LSTMConfig",
    "LSTMEncoder",
    "MLPField",
    "MaxStepsExceeded",
    "ModelConfigError",
    "NODETransformerConfig",
    "NODETransformerLM",
    "NonFiniteStateError",
    "ODEGPT2Config",
    "ODEHeadConfig",
    "ODELSTMConfig",
    "ReconstructionODEDecoder",
    "RegularizedField",
    "SolverConfig",
    "SolverConfigError",
    "SolverError",
    "SolverStats",
    "StepSizeUnderflowError",
    "TimeConcatField",
    "as_field",
    "build_model",
    "make_field",
    "odeint",
    "solve",
]
