"""Registration of the library's ``model_type``s with ``transformers``' Auto classes on
``import odelm``, without importing ``transformers`` (or torch) until the process does.

``import odelm`` calls [`install`][odelm.autoregister.install]: if ``transformers``' Auto classes
are already imported, the types are registered now (``import odelm.hf``); otherwise a finder on
``sys.meta_path`` waits for ``transformers.models.auto.modeling_auto`` (what
``AutoModelForCausalLM``, ``AutoConfig``'s users, ``pipeline`` and ``Trainer`` import) and
registers the types as soon as that module has run. So ``import odelm`` costs nothing more
than before, and ``AutoModelForCausalLM.from_pretrained(RUN / "model")`` works after it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

TRIGGER = "transformers.models.auto.modeling_auto"
"""The module whose import registers the library's model types."""


def register_now() -> None:
    """Register every library ``model_type`` with ``AutoConfig``, ``AutoModel`` and
    ``AutoModelForCausalLM`` (importing [`odelm.hf`][odelm.hf] does it)."""
    import odelm.hf  # noqa: F401  (registers on import)


class _Loader(importlib.abc.Loader):
    """The Auto classes' own loader, then the registration."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _uninstall()
        register_now()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of [`TRIGGER`][odelm.autoregister.TRIGGER]."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRIGGER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_FINDER = _Finder()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Register now if ``transformers``' Auto classes are imported, else when they are."""
    if TRIGGER in sys.modules:
        register_now()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
