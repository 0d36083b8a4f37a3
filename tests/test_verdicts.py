"""The README's verdict table is the one `odelm verdicts` builds from the grids' results.csv
files: a number changed on either side fails here."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from experiments.comparison.verdicts import BEGIN, END, PAGE, collect, markdown, summary, verdict

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def _block(path: Path) -> str:
    text = path.read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")


def test_readme_verdict_table_is_the_generated_one():
    claims = collect(RESULTS)
    assert _block(ROOT / "README.md") == summary(claims, f"docs/results/{PAGE}")
    assert _block(RESULTS / PAGE) == markdown(claims, RESULTS)


def test_the_short_table_names_the_closest_comparison_and_links_each_claim():
    """The README's row for the ODE-LSTM head quotes its most significant field comparison
    (SGD 5: +185.03, Holm p 0.0024) and links its full row on the verdicts page."""
    short = summary(collect(RESULTS))
    row = next(line for line in short.splitlines() if "LSTM encoder" in line)
    assert "head at SGD 5 +185.03* [+178.38, +191.67] p_Holm 0.0024" in row
    assert (
        "(docs/results/verdicts.md#an-ode-head-improves-on-its-lstm-encoder-node-lm-table-1)" in row
    )
    page = (RESULTS / PAGE).read_text()
    assert '<a id="an-ode-head-improves-on-its-lstm-encoder-node-lm-table-1"></a>' in page


def test_generated_numbers_are_the_grids_paired_differences():
    """Against the hand-checked published intervals (Table 5, 2 layers, RK2 vs residual:
    +17.76 [+6.54, +28.98]) and Holm over the whole table: 42 comparisons at 3 seeds leave
    none of Table 5's significant, so its verdict is 'not shown', not 'does not hold'."""
    table = markdown(collect(RESULTS), RESULTS)
    assert "2 layers RK2 +17.76 [+6.54, +28.98] p_Holm" in table
    claims = collect(RESULTS)
    assert verdict(claims[0]["evidence"]).startswith("**not shown")
    assert verdict(claims[3]["evidence"]).startswith("**does not hold**")  # ODE head at SGD 5


def test_a_changed_result_changes_the_table(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(RESULTS / "macaron-field", root / "macaron-field")
    path = root / "macaron-field" / "results.csv"
    before = markdown(collect(root), root)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    rows[0]["test_ppl"] = str(float(rows[0]["test_ppl"]) + 5.0)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert markdown(collect(root), root) != before
