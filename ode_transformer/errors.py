"""The error a user gets for an ODE Transformer they cannot build (a leaf module)."""

from __future__ import annotations

from odelm.errors import ConfigError

ODETransformerConfigError = ConfigError
"""An ODE Transformer part is named wrongly or sized impossibly (tableau, block, layer,
stack, preset or config); the message names the valid choices."""
