"""One base class for every error a user can cause or fix.

The command line catches [`OdelmError`][odelm.errors.OdelmError] and prints one line
(``odelm: error: ...``); anything else is a programming bug and keeps its traceback.
Each library error also derives from the built-in class that describes it
(``ValueError``, ``RuntimeError``, ``OSError``, ...), so ``except ValueError`` in user
code keeps working.
"""

from __future__ import annotations


class OdelmError(Exception):
    """An error the user can act on: the message says what was wrong and how to fix it."""


class ConfigError(OdelmError, ValueError):
    """The one error of a bad config, in every package: a key or constructor argument is
    unknown, out of range, of the wrong type, or contradicts another; the message names it
    and what it must be (``ModelConfigError``, ``SolverConfigError`` and
    ``ODETransformerConfigError`` are its older names)."""
