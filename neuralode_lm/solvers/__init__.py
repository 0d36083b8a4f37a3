"""One solver facade over torchdiffeq, TorchDyn and torchode.

``solve(field, y0, t, config)`` (or ``solve(field, y0, t, method=..., rtol=...)``)
integrates ``dz/ds = field(s, z)`` from ``t[0]`` through every time in ``t`` and returns
the states ``[len(t), *y0.shape]`` with a [`SolverStats`][neuralode_lm.SolverStats]; ``odeint(func,
y0, t)`` is the same with ``torchdiffeq.odeint``'s signature and defaults. The facade only
translates names and options and watches the solve (function evaluations, steps, a step cap,
non-finite states); every number is computed by the backend library.

Layout: ``config`` (the options, spelled once, and the facade's rules),
``errors``, ``monitor`` (statistics and the one step monitor), ``facade``
(``solve``) and one adapter module per backend (``<backend>_adapter.run``). A new backend
is a new adapter module plus its entry in ``BACKEND_METHODS``. TorchDyn and torchode are
optional: asking for one that is not installed raises an error that says how to install it.
"""

from .config import (
    ADAPTIVE_METHODS,
    BACKEND_METHODS,
    DEFAULT_MAX_NUM_STEPS,
    FIXED_METHODS,
    SolverConfig,
    fixed_grid,
    grid_steps,
)
from .errors import (
    FieldOutputError,
    MaxStepsExceeded,
    NonFiniteStateError,
    SolverConfigError,
    SolverError,
    StepSizeUnderflowError,
)
from .facade import odeint, solve
from .monitor import SolverStats

__all__ = [
    "ADAPTIVE_METHODS",
    "BACKEND_METHODS",
    "DEFAULT_MAX_NUM_STEPS",
    "FIXED_METHODS",
    "FieldOutputError",
    "MaxStepsExceeded",
    "NonFiniteStateError",
    "SolverConfig",
    "SolverConfigError",
    "SolverError",
    "SolverStats",
    "StepSizeUnderflowError",
    "fixed_grid",
    "grid_steps",
    "odeint",
    "solve",
]
