"""Vector fields ``f(s, z) -> dz/ds`` for continuous-depth decoders.

Every field is an ``nn.Module`` called as ``field(s, z)`` with ``z`` of shape ``[..., D]``
and ``s`` a scalar tensor (torchdiffeq, TorchDyn) or a tensor of shape ``z.shape[:-1]``
(torchode, one time per row). [`as_field`][neuralode_lm.as_field] turns any user module into such a
field. The built-in fields are registered by name in ``FIELDS`` (a new field: a class here and
its entry there).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from .errors import ModelConfigError

__all__ = [
    "FIELDS",
    "AutonomousField",
    "MLPField",
    "TimeConcatField",
    "as_field",
    "make_field",
]


class MLPField(nn.Module):
    """The NODE-LM report's field: ``f(s, z) = W2 ReLU(W1 z + b1) + b2`` (autonomous).

    The report sizes the hidden layer at 100 for ODE-LSTM and 768 for ODE-GPT2.
    """

    def __init__(self, dim: int, hidden: int | None = None) -> None:
        super().__init__()
        if dim <= 0:
            raise ModelConfigError(f"dim must be positive, got {dim}")
        hidden = dim if hidden is None else hidden
        if hidden <= 0:
            raise ModelConfigError(f"hidden must be positive, got {hidden}")
        self.dim, self.hidden = dim, hidden
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def _time_column(s: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``s`` as a ``[..., 1]`` column matching ``like[..., :1]`` (scalar or per-row times)."""
    s = torch.as_tensor(s, dtype=like.dtype, device=like.device)
    return s.expand(like.shape[:-1]).unsqueeze(-1)


class TimeConcatField(nn.Module):
    """The time-concatenated "NODE-t" field of Alba & Stronov (2019), as the report gives it.

    ``X = ReLU(z)``, ``A = ReLU(W1 [s | X] + b1)``, ``f(s, z) = z + W2 [s | A] + b2``; with
    ``residual=False`` the leading ``z`` term is dropped (it makes the linear part of the
    dynamics ``dz/ds = z``, i.e. growth by ``e^S``).
    """

    def __init__(self, dim: int, hidden: int | None = None, *, residual: bool = True) -> None:
        super().__init__()
        if dim <= 0:
            raise ModelConfigError(f"dim must be positive, got {dim}")
        hidden = dim if hidden is None else hidden
        self.dim, self.hidden, self.residual = dim, hidden, residual
        self.inner = nn.Linear(dim + 1, hidden)
        self.outer = nn.Linear(hidden + 1, dim)

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        column = _time_column(s, z)
        a = torch.relu(self.inner(torch.cat([column, torch.relu(z)], dim=-1)))
        out = self.outer(torch.cat([column, a], dim=-1))
        return z + out if self.residual else out


class AutonomousField(nn.Module):
    """Adapts a module ``g(z)`` to the field signature ``f(s, z) = g(z)``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.module(z)


def _positional_arity(module: nn.Module) -> int | None:
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return sum(1 for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty)


def as_field(module: nn.Module) -> nn.Module:
    """A field from a user module: ``f(s, z)`` as is, ``g(z)`` wrapped as autonomous."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"a vector field must be an nn.Module f(s, z) (or g(z)), got {type(module).__name__}"
        )
    arity = _positional_arity(module)
    if arity == 1:
        return AutonomousField(module)
    if arity in (2, None):
        return module
    raise TypeError(
        f"{type(module).__name__}.forward takes {arity} required arguments; a vector field "
        "takes (s, z) or just (z)"
    )


# The built-in fields by name: each class takes ``(dim, hidden)``.
FIELDS: dict[str, type[nn.Module]] = {"mlp": MLPField, "time-concat": TimeConcatField}


def make_field(kind: str, dim: int, hidden: int | None = None) -> nn.Module:
    """A built-in field by name: ``"mlp"`` (the report's) or ``"time-concat"`` (NODE-t)."""
    if kind not in FIELDS:
        raise ModelConfigError(f"unknown field type {kind!r}; valid: {', '.join(FIELDS)}")
    return FIELDS[kind](dim, hidden)
