"""The continuous-depth family's user errors (solver errors live in ``solvers.errors``)."""

from __future__ import annotations

from odelm.errors import ConfigError

__all__ = ["ModelConfigError"]

ModelConfigError = ConfigError
"""A model, head or field option is out of range, unknown, or contradicts another."""
