"""The continuous-depth family's user errors (solver errors live in ``solvers.errors``)."""

from __future__ import annotations

from odelm.errors import OdelmError

__all__ = ["ModelConfigError"]


class ModelConfigError(OdelmError, ValueError):
    """A model, head or field option is out of range, unknown, or contradicts another."""
