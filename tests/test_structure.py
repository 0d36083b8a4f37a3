"""Structure rules of issues 9 and 17, as tests: no module over 400 lines, no import circle,
packages import only downwards in the layering (``odelm`` at the bottom)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    """Library modules that ``name`` imports anywhere, deferred imports inside functions
    included, ``if TYPE_CHECKING:`` blocks excluded (``from x import y`` counts ``x.y`` when
    that is a module, else ``x``)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for child in ast.walk(node)
    }
    nodes = [node for node in ast.walk(tree) if id(node) not in type_only]
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
