"""``odelm``: the leaf package every other package may import: errors, the model contract,
decoding, saving, timing and the version.

It imports no other package of the library, so ``neuralode_lm``, ``ode_transformer`` and
``experiments`` can all depend on it without creating a cycle.
"""

from odelm.errors import OdelmError

__version__ = "0.3.0"

__all__ = ["OdelmError", "__version__"]
