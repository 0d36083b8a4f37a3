"""The structure rules, as tests: no module over 400 lines, no import
circle, packages import only downwards in the layering (``odelm`` at the bottom), and so do
``experiments``' sub-packages; no harness module imports more than 10 of its modules.
Imports inside functions and under ``if TYPE_CHECKING:`` count like any other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import ROOT

LAYERS = ("odelm", "ode_transformer", "neuralode_lm", "experiments", "benchmarks")
"""The package layering, bottom first: a package imports only itself and packages before it
(``odelm`` no other package of the library; the model packages never ``experiments``; no
package imports ``benchmarks``, which ``odelm bench`` finds by name)."""
PACKAGES = LAYERS
MODULES = {
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
    for package in PACKAGES
    for path in (ROOT / package).rglob("*.py")
}


def _imports(name: str, path: Path) -> set[str]:
    """Library modules that ``name`` imports anywhere, deferred imports inside functions and
    type-only imports (``if TYPE_CHECKING:``) included (``from x import y`` counts ``x.y``
    when that is a module, else ``x``)."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(edges.get(module, ())):
            circle = visit(target, (*path, module))
            if circle:
                return circle
        done.add(module)
        return None

    for module in sorted(edges):
        circle = visit(module, ())
        if circle:
            return circle
    return None


def _package_edges(name: str, targets: set[str]) -> set[str]:
    """Edges into a package's ``__init__`` only re-export; follow them to real modules."""
    return {t for t in targets if not (name.startswith(t + ".") or t == name)}


def test_the_circle_finder_finds_a_circle():
    assert _find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_module_imports_form_no_circle():
    edges = {name: _package_edges(name, _imports(name, path)) for name, path in MODULES.items()}
    circle = _find_circle(edges)
    assert circle is None, "import circle: " + " -> ".join(circle)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_400_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= 400, f"{name} has {lines} lines"


def _upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """``"a.x -> b.y"`` for every import of a package later in :data:`LAYERS` than its own."""
    level = {package: index for index, package in enumerate(LAYERS)}
    return [
        f"{name} -> {target}"
        for name, targets in sorted(edges.items())
        for target in sorted(targets)
        if level[target.split(".")[0]] > level[name.split(".")[0]]
    ]


def test_the_layering_check_finds_an_upward_import():
    edges = {
        "odelm.decoding": {"odelm.errors", "experiments.training.task"},
        "experiments.x": {"odelm"},
    }
    assert _upward_imports(edges) == ["odelm.decoding -> experiments.training.task"]


def test_packages_import_only_downwards():
    edges = {name: _imports(name, path) for name, path in MODULES.items()}
    assert "odelm.contract" in edges["experiments.training.task"]  # the walk sees the shared pieces
    assert _upward_imports(edges) == []


SUBPACKAGES = ("data", "models", "training", "evaluation", "comparison", "cli")
"""``experiments``' sub-packages, bottom first: corpora and batches, a model from a config,
a training run (config, Lightning task, run folder, the test of a model on a split),
evaluation of trained runs, grids of runs, the command line. A sub-package imports only
itself and those before it, with no exception (the FLOPs counter and BLEU sit in ``models``,
``evaluate`` in ``training``, which tests a run with them); the top-level modules
(``config_errors``, ``plotting``, ``reference``, ``safe_yaml``) are leaves every layer may import,
``__main__`` sits above ``cli``."""


def _harness_level(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "experiments" or len(parts) == 1:
        return -1  # another package (packages_import_only_downwards) or the package itself
    if parts[1] in SUBPACKAGES:
        return SUBPACKAGES.index(parts[1])
    return len(SUBPACKAGES) if parts[1] == "__main__" else -1  # a top-level leaf


def _harness_upward(edges: dict[str, set[str]]) -> set[str]:
    """``"experiments.a.x -> experiments.b.y"`` for every import of a later sub-package."""
    return {
        f"{name} -> {target}"
        for name, targets in edges.items()
        for target in targets
        if _harness_level(target) > _harness_level(name) >= 0
    }


def test_the_subpackage_check_finds_an_upward_import():
    edges = {
        "experiments.training.result": {"experiments.evaluation.evaluate", "experiments.data.x"},
        "experiments.cli.main": {"experiments.training.train", "experiments.reference"},
        "experiments.reference": {"odelm.errors"},
    }
    assert _harness_upward(edges) == {
        "experiments.training.result -> experiments.evaluation.evaluate"
    }


def test_experiments_subpackages_import_only_downwards():
    harness = {name: path for name, path in MODULES.items() if name.startswith("experiments.")}
    upward = _harness_upward({name: _imports(name, path) for name, path in harness.items()})
    assert upward == set(), f"upward imports: {sorted(upward)}"
    leaves = ("config_errors", "plotting", "reference", "safe_yaml")
    for leaf in (f"experiments.{name}" for name in leaves):
        assert not {t for t in _imports(leaf, MODULES[leaf]) if t.startswith("experiments")}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("experiments.")))
def test_no_harness_module_imports_more_than_10_of_its_modules(name):
    own = sorted(
        target
        for target in _imports(name, MODULES[name])
        if target.startswith("experiments.") and MODULES[target].name != "__init__.py"
    )
    assert len(own) <= 10, f"{name} imports {len(own)} harness modules: {', '.join(own)}"
