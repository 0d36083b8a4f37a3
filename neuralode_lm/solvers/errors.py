"""The errors a solve can end in; each says what went wrong and what to try."""

from __future__ import annotations

from odelm.errors import ConfigError, OdelmError

__all__ = [
    "FieldOutputError",
    "MaxStepsExceeded",
    "NonFiniteStateError",
    "SolverConfigError",
    "SolverError",
    "StepSizeUnderflowError",
    "UnknownSolverOptionError",
]


SolverConfigError = ConfigError
"""A solver option is unknown, out of range, or not offered by the chosen backend."""


class UnknownSolverOptionError(SolverConfigError, TypeError):
    """A solver option name that [`SolverConfig`][neuralode_lm.SolverConfig] does not have."""


class FieldOutputError(OdelmError, ValueError):
    """The vector field returned something other than a tensor of the state's shape."""


class SolverError(OdelmError, RuntimeError):
    """A solve stopped early; carries the NFE, step count and last step size when it did."""

    advice = "see the backend's documentation"

    def __init__(
        self, message: str, *, nfe: int, steps: int, last_step_size: float | None, phase: str
    ) -> None:
        super().__init__(message)
        self.nfe = nfe
        self.steps = steps
        self.last_step_size = last_step_size
        self.phase = phase


class MaxStepsExceeded(SolverError):
    """The solver needed more steps than ``max_num_steps`` allows."""

    advice = (
        "the dynamics may be stiff or the tolerances too tight: raise max_num_steps "
        "(None for no cap), loosen rtol/atol, or regularise the field (kinetic/Jacobian)"
    )


class NonFiniteStateError(SolverError):
    """The state or the vector field became NaN or infinite during the solve."""

    advice = (
        "the dynamics diverged: lower the learning rate, shorten the integration "
        "interval, or regularise the field (kinetic/Jacobian)"
    )


class StepSizeUnderflowError(SolverError):
    """The adaptive step size shrank to zero (below float resolution) with finite states."""

    advice = (
        "the solver cannot meet rtol/atol: loosen them or use a fixed-grid method with step_size"
    )
