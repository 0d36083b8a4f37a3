"""The tutorials in docs/tutorials/ run: their ```python blocks, executed in order in one
namespace per page, at the sizes the page shows (tiny), with the page's own assertions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

TUTORIALS = ROOT / "docs" / "tutorials"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: Path) -> list[str]:
    """The code of every ```python block of a markdown page, in order."""
    return BLOCK.findall(page.read_text())


def test_there_are_two_tutorials_with_code():
    pages = sorted(TUTORIALS.glob("*.md"))
    assert [p.name for p in pages] == ["rk-transformer.md", "solver-facade.md"]
    assert all(len(python_blocks(page)) >= 3 for page in pages)


@pytest.mark.parametrize(
    "name", ["rk-transformer", pytest.param("solver-facade", marks=pytest.mark.slow)]
)
@pytest.mark.slow
def test_tutorial_runs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = TUTORIALS / f"{name}.md"
    namespace: dict = {"__name__": f"tutorial_{name.replace('-', '_')}"}
    for index, code in enumerate(python_blocks(page)):
        exec(compile(code, f"{page.name}, block {index + 1}", "exec"), namespace)  # noqa: S102 (our own docs)
    checks = {"rk-transformer": "test_ppl", "solver-facade": "losses"}
    assert checks[name] in namespace  # the last block ran to its end
    assert list(tmp_path.iterdir()) == []  # a tutorial leaves nothing in the folder
