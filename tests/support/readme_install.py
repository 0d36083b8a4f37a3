"""Run a script as it runs in the environment the README's install command makes.

``python tests/support/readme_install.py SCRIPT [ARGS...]`` runs ``SCRIPT`` as ``python SCRIPT ARGS``
would (``__main__``, its folder first on ``sys.path``), except that a top-level module that
``pip install torch && pip install -e .`` would not have installed is missing, as it would
be there: ``import`` raises ``ModuleNotFoundError``, ``importlib.util.find_spec`` gives
``None`` (libraries probe optional packages that way).

Which modules those are is computed from the installed metadata: the distributions the
README's install brings are ``odelm`` and the closure of setup.cfg's ``install_requires``
under each distribution's own requirements (environment markers evaluated, requested extras
followed, ``pip`` itself); a top-level module is refused when every installed distribution
that provides it lies outside that closure (a test or docs extra, a dev tool, an optional
solver backend). Modules no distribution claims (the standard library, the editable
install's finders) are left alone.

Why this and not a fresh venv per test run: the README's install downloads torch and about
sixty other wheels (gigabytes, minutes, a network), which the tests must not need. What it
does not reproduce is the versions a fresh resolve would pick today; ``.ci/run`` installs
the wheel in a fresh venv for that.
"""

from __future__ import annotations

import configparser
import importlib.machinery
import importlib.metadata
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_EXTRAS: tuple[str, ...] = ()
"""The extras of the README's install command (``pip install -e .``: none)."""


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def install_requires() -> list[str]:
    """setup.cfg's ``install_requires`` lines (requirement strings)."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "setup.cfg")
    lines = (line.strip() for line in config["options"]["install_requires"].splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def installed_closure(roots: list[str]) -> set[str]:
    """Canonical names of the installed distributions ``roots`` (requirement strings) pull
    in, themselves included: each one's requirements whose markers hold here, for no extra
    and for the extras asked of it."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(line) for line in roots]
    while todo:
        requirement = todo.pop()
        name = canonical(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            distribution = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # would be installed there, is not here: nothing here to refuse
        extras = {canonical(extra) for extra in requirement.extras}
        key = name + "[" + ",".join(sorted(extras)) + "]"
        if key in seen:
            continue
        seen |= {key, name}
        for line in distribution.requires or []:
            nested = Requirement(line)
            marker = nested.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras}):
                nested.marker = None
                todo.append(nested)
    return {key for key in seen if "[" not in key}


def refused_modules() -> set[str]:
    """Top-level modules installed here only by distributions the README's install would
    not have installed."""
    # a fresh venv holds pip (and setuptools before Python 3.12, where torch requires it)
    allowed = installed_closure(install_requires()) | {"odelm", "pip", "setuptools"}
    refused = set()
    for module, providers in importlib.metadata.packages_distributions().items():
        if not {canonical(p) for p in providers} & allowed:
            refused.add(module)
    return refused


class InstalledOnly(importlib.machinery.PathFinder):
    """``sys.path``'s finder, blind to the top-level modules of :func:`refused_modules`: they
    are missing as they are in that venv (``import`` raises ``ModuleNotFoundError``,
    ``importlib.util.find_spec`` gives ``None``)."""

    refused: frozenset[str] = frozenset()

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if path is None and fullname in cls.refused:
            return None
        return super().find_spec(fullname, path, target)


def main(argv: list[str]) -> None:
    script = Path(argv[0]).resolve()
    InstalledOnly.refused = frozenset(refused_modules())
    sys.meta_path[:] = [
        InstalledOnly if finder is importlib.machinery.PathFinder else finder
        for finder in sys.meta_path
    ]
    sys.argv = [str(script), *argv[1:]]
    sys.path[0] = str(script.parent)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
