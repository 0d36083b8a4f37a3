"""A budget pilot's page is its records: every row of its table (best validation perplexity,
its step, test perplexity, per arm and budget) is the run's ``result.json``, every record
has its row, and the budget the page chooses is the one its study's grid file trains (or
the grid file says its budget waits on the pilot)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results"
GRIDS = ROOT / "experiments" / "configs" / "grids"
PAGES = sorted(RESULTS.glob("pilot-*/README.md"))
ROW = re.compile(
    r"^\| (?P<arm>[^|]+) \| (?P<epochs>\d+) epochs \((?P<steps>[\d,]+) steps\) \| "
    r"(?P<valid>[\d.]+) \| (?P<step>[\d,]+)(?P<note>[^|]*) \| (?P<test>[\d.]+) \|$"
)
RECORD_NAMES = {
    "RK4": "rk4",
    "looped x4": "looped4",
    "GPT-2": "gpt2",
    "ODE-GPT2": "ode-gpt2",
    "LSTM": "lstm-tied",
    "ODE-LSTM": "ode-lstm-tied",
}
"""A table's arm name -> its records' name (``records/NAME-Eep``); other arms are their name."""
CHOSEN = re.compile(r"\*\*Budget: (\d+) epochs|budget is \*\*(\d+) epochs\*\*")


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("pilot", sorted(GRIDS.glob("pilot-*-cosine.yaml")), ids=lambda p: p.stem)
def test_a_pilot_has_its_page_or_its_study_waits_on_it(pilot):
    study = re.match(r"# Budget pilot for ([\w-]+) ", pilot.read_text())
    assert study, "the pilot grid's first line names no study"
    waiting = "pending its pilot" in (GRIDS / f"{study[1]}.yaml").read_text()
    assert (RESULTS / pilot.stem / "README.md").is_file() or waiting


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.parent.name)
def test_a_pilot_pages_table_is_its_records(page):
    rows = [m for line in page.read_text().splitlines() if (m := ROW.match(line))]
    shown = {f"{RECORD_NAMES.get(m['arm'], m['arm'])}-{m['epochs']}ep": m for m in rows}
    assert sorted(shown) == sorted(p.name for p in (page.parent / "records").iterdir())
    for name, row in shown.items():
        record = json.loads((page.parent / "records" / name / "result.json").read_text())
        assert (record["steps"], record["best_step"]) == (
            _number(row["steps"]),
            _number(row["step"]),
        ), name
        assert f"{record['valid_ppl']:.2f}" == row["valid"], name
        last = record["best_step"] == record["steps"]  # said so beside the step
        assert ("(the last validation)" in row["note"]) == last, name
        assert f"{record['test_ppl']:.2f}" == row["test"], name


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.parent.name)
def test_the_budget_a_pilot_chooses_is_its_grids(page):
    text = page.read_text()
    study = re.search(r"^# Budget pilot for `([\w-]+)`", text, re.MULTILINE)
    assert study, "the page's title names no study grid"
    grid = GRIDS / f"{study[1]}.yaml"
    chosen = CHOSEN.search(text)
    if chosen:
        epochs = int(chosen[1] or chosen[2])
        assert yaml.safe_load(grid.read_text())["shared"]["trainer"]["max_epochs"] == epochs
    else:
        assert "pending its pilot" in grid.read_text() and "**Status:" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.parent.name)
def test_every_percentage_a_pilot_page_quotes_is_one_of_its_arms_changes(page):
    """Each "X%" of the prose (but the 1% bar) is the relative change of one arm's best
    validation perplexity between two of its budgets, to X's digits."""
    text = page.read_text()
    rows = [m for line in text.splitlines() if (m := ROW.match(line))]
    changes = [
        abs(float(b["valid"]) - float(a["valid"])) / float(a["valid"]) * 100
        for a in rows
        for b in rows
        if a["arm"] == b["arm"] and int(a["epochs"]) < int(b["epochs"])
    ]
    quoted = [q for q in re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)%", text) if q != "1"]
    for q in quoted:
        digits = len(q.partition(".")[2])
        assert any(round(change, digits) == float(q) for change in changes), f"{q}%"
