"""Every decimal number in a protocol-v2 study page's prose is in its data: a generated table
(the page's blocks, the study's cells of the README's verdict table and of `verdicts.md`), a
cell of the study's `results.csv` or `tune.csv`, a value of a run's `result.json` (records
and re-trains), the study's `compute.md` or `depth/` tables, or its grid file (the design).
A number is matched at the digits the prose quotes it to; a signed one only by a value of
its sign. Integers (steps, seeds, counts) and code are not read. A number is looked for
anywhere in that data, so a slip onto another of its values passes; a number the data does
not hold fails."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from experiments.comparison.tables import grid_has_fixed_budget
from experiments.training.config import load_yaml
from tests.support.paths import ROOT

RESULTS = ROOT / "docs" / "results"
GRIDS = ROOT / "experiments" / "configs" / "grids"
V2_GRIDS = [
    path.stem for path in GRIDS.glob("study*.yaml") if grid_has_fixed_budget(load_yaml(path))
]
PAGES = sorted(
    page
    for page in RESULTS.glob("study*/README.md")
    if any(grid.startswith(page.parent.name) for grid in V2_GRIDS)
)
"""The pages of the protocol-v2 studies (warm-up + cosine over a fixed budget) and their
index pages; the v1 pages they replace are kept as they were written."""
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*\.\d+(?:e-?\d+)?")
BLOCK = re.compile(r"<!-- odelm:(\w+) -->(.*?)<!-- /odelm:\1 -->", re.DOTALL)


def _numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def _value(number: str) -> float:
    return float(number.replace(",", "").replace("−", "-"))


def _prose(text: str) -> str:
    """The page's own words: no generated blocks, code, inline code or link targets."""
    text = BLOCK.sub(" ", text)
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    text = re.sub(r"`[^`]*`", " ", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def _sources(page: Path) -> list[str]:
    """Every number of the data behind a page: its folder's and its sub-studies' (a page
    ``study-grammar`` reads ``study-grammar-d1`` and ``-d3`` too)."""
    found = [n for _, block in BLOCK.findall(page.read_text()) for n in _numbers(block)]
    for folder in RESULTS.glob(f"{page.parent.name}*"):
        for verdicts in (ROOT / "README.md", RESULTS / "verdicts.md"):  # the study's cells
            cells = verdicts.read_text().split("|")
            found += [n for cell in cells if f"`{folder.name}`" in cell for n in _numbers(cell)]
        for table in folder.glob("*.csv"):
            found += [cell for row in csv.reader(table.open()) for cell in row]
        for result in [
            *folder.glob("records/*/result.json"),
            *folder.glob("retrain/*/result.json"),
        ]:
            found += [repr(v) for v in json.loads(result.read_text()).values() if _is_number(v)]
        for text in [*folder.glob("*.md"), *folder.glob("depth/**/*.md")]:
            if text.name != "README.md":
                found += _numbers(text.read_text())
        grid = GRIDS / f"{folder.name}.yaml"
        if grid.is_file():
            found += _numbers(grid.read_text())
    return found


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.parent.name)
def test_every_decimal_number_of_a_study_page_is_in_its_data(page):
    values = []
    for source in _sources(page):
        try:
            values.append(_value(source))
        except ValueError:
            continue
    missing = []
    for quoted in _numbers(_prose(page.read_text())):
        digits, number = len(quoted.split(".")[1].split("e")[0]), _value(quoted)
        signed = quoted[0] in "+-−"
        if "e" in quoted:
            matched = any(value == number for value in values)
        elif signed:
            matched = any(round(value, digits) == round(number, digits) for value in values)
        else:
            matched = any(round(abs(value), digits) == round(number, digits) for value in values)
        if not matched:
            missing.append(quoted)
    assert not missing, f"{page}: numbers the data does not hold: {missing}"
