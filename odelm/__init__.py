"""``odelm``: the leaf package every other package may import: errors, the model contract,
decoding, saving, timing and the version.

It imports no other package of the library, so ``neuralode_lm``, ``ode_transformer`` and
``experiments`` can all depend on it without creating a cycle. Importing it registers the
library's model types with ``transformers``' Auto classes as soon as the process uses them
([`odelm.autoregister`][odelm.autoregister]), so ``import odelm`` is all a process needs before
``AutoModelForCausalLM.from_pretrained(RUN / "model")``.
"""

from odelm.errors import OdelmError

__version__ = "0.3.0"

__all__ = ["OdelmError", "__version__"]

from odelm.autoregister import install as _install  # after the names above

_install()
