"""The docs name only things that exist: every module DESIGN.md names, and every local file
the README and docs link to or quote as a path. A moved or renamed module fails here rather
than leaving a newcomer with a dead pointer."""

import importlib
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGES = ("odelm", "neuralode_lm", "ode_transformer", "experiments", "benchmarks")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A path from the repository root (`experiments/foo.py`, `docs/results/quick/`) or a dotted
# module (`experiments.foo`, `odelm.errors.OdelmError`) inside backticks or a bare mention.
_ROOTS = "|".join(PACKAGES)
PATH_RE = re.compile(rf"(?<![\w/.-])((?:{_ROOTS}|docs|tests)/[\w./*-]*[\w/*])")
DOTTED_RE = re.compile(rf"(?<![\w/.-])((?:{_ROOTS})(?:\.[A-Za-z_]\w*)+)")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER_RE = re.compile(r"[A-Z]{3,}")  # `solvers/NAME_adapter.py`: a template, not a file


def _paths(text: str) -> set[str]:
    """Repository paths a text names, without templates."""
    return {p for p in PATH_RE.findall(text) if not PLACEHOLDER_RE.search(p)}


def _exists(path: str) -> bool:
    """A path, a glob (`docs/results/quick/*.png`) or a path with its suffix (`.py`) left out."""
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def _resolves(dotted: str) -> bool:
    """`a.b.c`: the longest prefix that is a module imports, and the rest are attributes."""
    parts = dotted.split(".")
    n = 1
    while n < len(parts) and (
        (ROOT / Path(*parts[: n + 1])).is_dir()
        or (ROOT / Path(*parts[: n + 1])).with_suffix(".py").exists()
    ):
        n += 1
    obj = importlib.import_module(".".join(parts[:n]))
    for attr in parts[n:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def test_every_module_design_names_exists():
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    paths = _paths(text)
    assert "experiments/training/datamodule.py" in paths  # the pattern finds what it should
    assert [p for p in sorted(paths) if not _exists(p)] == []
    dotted = set(DOTTED_RE.findall(text))
    assert "experiments.reference.WordLMTransformer" in dotted
    assert [d for d in sorted(dotted) if not _resolves(d)] == []


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped), and
    its explicit ``<a id="...">`` anchors."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    explicit = set(re.findall(r'<a id="([^"]+)"></a>', text))
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings
    } | explicit


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_and_paths_resolve(doc: Path):
    text = doc.read_text()
    dead = []
    for link in LINK_RE.findall(text):
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        path = doc.parent / target if target else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            dead.append(link)
    dead += [p for p in sorted(_paths(text)) if not _exists(p)]
    assert dead == []


def test_a_dead_link_is_found(tmp_path: Path):
    """The checks above can fail: a missing module and a missing file are reported."""
    assert not _exists("experiments/no_such_module.py")
    assert not _resolves("experiments.training.task.NoSuchClass")
    assert _resolves("experiments.training.datamodule.LMDataModule")
    readme_anchors = _anchors(ROOT / "README.md")
    assert "results" in readme_anchors and "no-such-section" not in readme_anchors
    assert _paths("see `experiments/foo.py` and neuralode_lm/solvers/NAME_adapter.py") == {
        "experiments/foo.py"
    }


SPHINX_ROLE_RE = re.compile(r":(?:py:)?(?:class|func|meth|data|attr|mod|obj|exc|const):`")
"""A Sphinx role (``:class:`X```), which the mkdocs site shows as literal text."""
CROSSREF_RE = re.compile(r"\[`[^`\]]+`\]\[([A-Za-z_][\w.]*)\]")
"""A mkdocstrings cross-reference, ``[`X`][package.module.X]``: the link's target."""


def _package_sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_no_docstring_holds_a_sphinx_role():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _package_sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SPHINX_ROLE_RE.search(line)
    ]
    assert not found, "write [`X`][package.module.X] or ``X``:\n" + "\n".join(found)


def test_docstring_cross_references_name_objects_that_exist():
    targets = {t for p in _package_sources() for t in CROSSREF_RE.findall(p.read_text())}
    assert len(targets) > 50  # the converted roles (mkdocs build --strict checks each link)
    assert not sorted(t for t in targets if not _resolves(t))


REGISTRY_RES = (
    re.compile(r"`(?P<name>[A-Z][A-Z_]+)` (?:\(|in )`(?P<path>[\w/]+\.py)`"),
    re.compile(r"`(?P<path>[\w/]+\.py)` \(`(?P<name>[A-Z][A-Z_]+)`\)"),
)
"""A registry named in DESIGN.md's "Where to add things" table: `NAME` (`path/module.py`),
`NAME` in `path/module.py` or `path/module.py` (`NAME`)."""


def test_each_registry_design_names_is_one_collection_in_its_module():
    """DESIGN.md says each extension point is one registry in one module: every registry its
    table names is a module-level collection there, and no other module of the packages
    assigns a collection of the same name (a second, hand-kept list)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    table = text.split("## Where to add things", 1)[1].split("\n## ", 1)[0]
    named = {(m["name"], m["path"]) for r in REGISTRY_RES for m in r.finditer(table)}
    assert {name for name, _ in named} >= {"TABLEAUX", "STACK_CLASSES", "FIELDS", "SPECS"}
    for name, path in sorted(named):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert isinstance(getattr(module, name), (dict, tuple, list, frozenset, set)), name
        assigned = re.compile(rf"^{name}\s*(:[^=]+)?=", re.MULTILINE)
        others = [
            str(p.relative_to(ROOT))
            for p in _package_sources()
            if p != ROOT / path and assigned.search(p.read_text())
        ]
        assert others == [], f"{name} is also assigned in {others}"


COMMIT_NAMED = re.compile(r"\bcommits? ([0-9a-f]{7,40}(?:(?:,? and |, )[0-9a-f]{7,40})*)")


def test_every_commit_the_docs_name_is_in_the_history_of_this_checkout():
    """A results page, the README or a grid file that says "trained from commit X" (or
    "registered in commit X") names a commit of this branch's history, not one of a branch
    that was never merged."""
    history = subprocess.run(
        ["git", "rev-list", "HEAD"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split()
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    files += (ROOT / "experiments" / "configs" / "grids").glob("*.yaml")
    named = {
        (commit, path.relative_to(ROOT).as_posix())
        for path in files
        for match in COMMIT_NAMED.finditer(" ".join(path.read_text().split()))
        for commit in re.findall(r"[0-9a-f]{7,40}", match[1])
    }
    assert len({commit for commit, _ in named}) > 20  # the pages name the commits they ran
    missing = sorted((c, p) for c, p in named if not any(h.startswith(c) for h in history))
    assert not missing, f"commits not in this branch's history: {missing}"
