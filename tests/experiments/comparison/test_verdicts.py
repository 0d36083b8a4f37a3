"""The README's verdict table is the one `odelm verdicts` builds from the grids' results.csv
files, each claim decided by its one pre-registered primary with Holm over the primaries
only; a changed number on either side, a primary changed after its grid has results, or an
input that cannot be read fails here, and a failed `--write` writes nothing."""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from experiments.cli.main import main
from experiments.comparison import verdicts
from experiments.comparison.pages import pages_with_blocks, refreshed
from experiments.comparison.stats import detectable_difference, paired_difference
from experiments.comparison.verdict_tables import BEGIN, END, PAGE, markdown, summary
from experiments.comparison.verdicts import (
    collect,
    load_spec,
    primaries_sha256,
    regimes,
    verdict,
)
from experiments.training.config import ConfigError
from tests.support.paths import ROOT

RESULTS = ROOT / "docs" / "results"


def _block(path: Path) -> str:
    text = path.read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")


def _write_results(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        columns = [
            "name",
            "seed",
            "test_ppl",
            "pair",
            "test_excess_nll_per_token",
            "test_ppl_ratio",
        ]
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def test_readme_verdict_table_is_the_generated_one():
    claims = collect(RESULTS)
    assert _block(ROOT / "README.md") == summary(claims, regimes(), f"docs/results/{PAGE}")
    assert _block(RESULTS / PAGE) == markdown(claims, regimes(), RESULTS)
    for page in pages_with_blocks(RESULTS):  # each study page's tables, drawn from its data
        assert page.read_text() == refreshed(page), page


def test_every_claim_has_one_primary_per_regime_and_no_comparison_is_listed_twice():
    spec = load_spec()
    assert len(spec["claims"]) == 7
    assert [len(claim["primary"]) for claim in spec["claims"]] == [3, 3, 3, 3, 1, 3, 3]
    keys = [
        (item["grid"], item["model"], item["baseline"])
        for claim in spec["claims"]
        for item in [*claim["primary"].values(), *claim["secondary"]]
    ]
    assert len(keys) == len(set(keys))
    labels = [i["label"] for c in spec["claims"] for i in c["secondary"] if i["kind"] == "early"]
    assert "Adam, 190 steps" in labels  # a quoted comma is kept, not cut


def test_the_registered_commit_holds_the_same_primaries():
    """The commit named in verdicts.yaml registered exactly today's primaries (so none was
    chosen after its grid's data), and its hash is the one recorded beside it."""
    spec = load_spec()
    registered = spec["registered"]
    assert registered["primaries_sha256"] == primaries_sha256(spec)
    shown = subprocess.run(
        ["git", "show", f"{registered['commit']}:experiments/configs/verdicts.yaml"],
        cwd=ROOT,
        capture_output=True,
        check=False,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr  # the commit is in this repository's history
    assert primaries_sha256(yaml.safe_load(shown.stdout)) == registered["primaries_sha256"]
    grids = {item["grid"] for claim in spec["claims"] for item in claim["primary"].values()}
    for grid in grids:  # each study says so
        text = (ROOT / "experiments" / "configs" / "grids" / f"{grid}.yaml").read_text()
        assert f"registered in commit {registered['commit']}" in text, grid


def _study_root(tmp_path: Path, rk4_shift: float = -12.0) -> Path:
    """A results folder where study2-table5-2layer has results (5 seeds): RK4 better than
    the residual block by about ``-rk4_shift``."""
    root = tmp_path / "results"
    offsets = [1.5, -2.0, 0.5, 3.0, -1.0]
    rows = []
    for seed, offset in enumerate(offsets, start=1):
        base = 300.0 + 4 * seed
        rows += [
            {"name": "residual", "seed": seed, "test_ppl": base},
            {"name": "rk4", "seed": seed, "test_ppl": base + rk4_shift + offset},
            {"name": "residual-8layer", "seed": seed, "test_ppl": base - 1 + offset / 2},
            {"name": "macaron", "seed": seed, "test_ppl": base + 2 * offset},
            {"name": "rk2", "seed": seed, "test_ppl": base + 1},
            {"name": "rk2-learnable", "seed": seed, "test_ppl": base + 2},
            {"name": "residual-4layer", "seed": seed, "test_ppl": base},
        ]
    _write_results(root / "study2-table5-2layer" / "results.csv", rows)
    for name in {
        item["grid"]
        for claim in load_spec()["claims"]
        for item in claim["secondary"]
        if item["kind"] not in verdicts.PLANNED
    }:
        shutil.copytree(RESULTS / name, root / name)
    return root


def test_holm_runs_over_every_primary_of_every_regime(tmp_path):
    """With one grid's three primaries in, Holm runs over the 19 primaries of the 3 regimes
    (the pending ones at p = 1, ranked last): each p is multiplied by 19, 18, 17 in rank
    order; the detectable difference is the one at that rank's level 0.05 / (19 - rank);
    the secondaries keep their unadjusted p."""
    claims = collect(_study_root(tmp_path))
    offsets = dict(enumerate([1.5, -2.0, 0.5, 3.0, -1.0], start=1))
    zero = dict.fromkeys(offsets, 0.0)
    by_hand = [
        paired_difference({s: -12.0 + o for s, o in offsets.items()}, zero),  # RK4 vs residual
        paired_difference({s: -11.0 + o / 2 for s, o in offsets.items()}, zero),  # vs 8 layers
        paired_difference({s: 2 * o for s, o in offsets.items()}, zero),  # Macaron
    ]
    ranked = sorted(range(3), key=lambda i: by_hand[i].p_value)
    running = 0.0
    for rank, index in enumerate(ranked):
        primary = claims[index]["primary"]["ptb-mini"]
        running = max(running, min(1.0, (19 - rank) * by_hand[index].p_value))
        assert primary.paired.mean == pytest.approx(by_hand[index].mean)
        assert primary.p_holm == pytest.approx(running, rel=1e-9)
        assert primary.level == pytest.approx(0.05 / (19 - rank))
        expected = detectable_difference(by_hand[index].sd, 5, 0.05 / (19 - rank))
        assert primary.detectable == pytest.approx(expected)
    words = [verdict(c["primary"]["ptb-mini"]) for c in claims]
    assert words == ["holds", "holds", "not shown", "pending", "pending", "pending", "pending"]
    assert {verdict(c["primary"].get("grammar-d3")) for c in claims} == {"pending", "-"}
    secondary = next(e for e in claims[0]["secondary"] if e.label == "2 layers RK4")
    assert secondary.p_holm is None and secondary.paired.p_value < 0.05
    primary = claims[0]["primary"]["ptb-mini"]
    row = next(line for line in summary(claims, regimes()).splitlines() if "equal param" in line)
    assert f"p_Holm {primary.p_holm:.2g}, n 5, detectable ±{primary.detectable:.2f}" in row


def test_the_grammar_regime_reads_excess_loss(tmp_path):
    """A grammar grid's primary is the paired difference of excess loss (nats per token),
    not of perplexity, and is shown with 4 decimals."""
    root = _study_root(tmp_path)
    rows = []
    for seed in range(1, 6):
        for name, excess in [("residual-2layer", 0.050), ("rk4", 0.030)]:
            value = excess + 0.001 * seed
            rows.append({"name": name, "seed": seed, "test_ppl": 9.5 * math.exp(value),
                         "test_excess_nll_per_token": value, "test_ppl_ratio": math.exp(value)})  # fmt: skip
    for name in ("residual", "residual-4layer", "residual-8layer", "macaron", "node-shared",
                 "node-weights4", "lstm", "ode-lstm"):  # fmt: skip
        rows += [{"name": name, "seed": s, "test_ppl": 10.0, "test_excess_nll_per_token": 0.06,
                  "test_ppl_ratio": 1.06} for s in range(1, 6)]  # fmt: skip
    _write_results(root / "study-grammar-d3" / "results.csv", rows)
    primary = collect(root)[0]["primary"]["grammar-d3"]
    assert primary.regime.metric == "test_excess_nll_per_token"
    assert primary.paired.mean == pytest.approx(-0.020)
    assert "2 layers RK4 vs residual -0.0200" in summary(collect(root), regimes())


def test_cap_bound_runs_are_counted_only_where_no_fixed_budget_set_the_end(tmp_path, monkeypatch):
    """Under warm-up + cosine to 0 over a fixed budget a best at the last validation is the
    end of the decay (results.csv flags it) and a verdict counts none (the grid's pilot
    checks the budget); under a plateau rule a run that ran to the cap is counted."""
    assert verdicts._fixed_budget("study2-table5-2layer")
    assert not verdicts._fixed_budget("study-table5-2layer")  # the plateau rule of 0.3
    root = _study_root(tmp_path)
    path = root / "study2-table5-2layer" / "results.csv"
    rows = list(csv.DictReader(path.open()))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "cap_bound"])
        writer.writeheader()
        writer.writerows({**row, "cap_bound": "True"} for row in rows)
    claims = collect(root)
    assert claims[0]["primary"]["ptb-mini"].cap_bound == 0
    assert "cap-bound" not in summary(claims, regimes())
    monkeypatch.setattr(verdicts, "_fixed_budget", lambda grid: False)
    claims = collect(root)
    assert claims[0]["primary"]["ptb-mini"].cap_bound == 10  # RK4 and residual, 5 seeds
    assert "10 run(s) cap-bound" in summary(claims, regimes())


def test_a_worse_primary_does_not_hold_and_a_small_one_is_not_shown(tmp_path):
    worse = collect(_study_root(tmp_path / "a", rk4_shift=+15.0))
    assert verdict(worse[0]["primary"]["ptb-mini"]) == "does not hold"
    small = collect(_study_root(tmp_path / "b", rk4_shift=-0.4))
    assert verdict(small[0]["primary"]["ptb-mini"]) == "not shown"
    assert math.isfinite(small[0]["primary"]["ptb-mini"].detectable)


def test_a_primary_changed_after_its_grid_has_results_is_refused(tmp_path):
    root = _study_root(tmp_path)
    spec = yaml.safe_load(verdicts.SPEC.read_text())
    spec["claims"][0]["primary"]["ptb-mini"]["baseline"] = "residual-4layer"  # after the data
    spec["claims"][0]["secondary"] = [
        s for s in spec["claims"][0]["secondary"] if s["model"] != "rk4" or s["kind"] != "study"
    ]
    path = tmp_path / "verdicts.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match="primaries differ from those registered"):
        collect(root, path)
    before = tmp_path / "before"  # the published results without those of any primary's grid
    shutil.copytree(RESULTS, before, ignore=shutil.ignore_patterns("records", "depth", "*.png"))
    for claim in spec["claims"]:
        for primary in claim["primary"].values():
            (before / primary["grid"] / "results.csv").unlink(missing_ok=True)
    assert collect(before, path)  # no primary has results yet: still free to change


def test_the_seed_noise_shown_is_the_a_a_row_against_the_run_it_repeats():
    """A plateau-protocol comparison with another arm (RK4 vs 8 layers) shows the grid's
    seed-noise row against the residual block it repeats at seeds 1001-1005, not against
    the 8 layers."""
    rows = list(csv.DictReader((RESULTS / "study-table5-2layer" / "results.csv").open()))
    residual = {r["seed"]: float(r["test_ppl"]) for r in rows if r["name"] == "residual"}
    noise = [float(r["test_ppl"]) - residual[r["pair"]] for r in rows if r["name"] == "seed-noise"]
    assert len(noise) == 5
    claims = collect(RESULTS)
    shown = [e.noise.mean for e in claims[1]["secondary"] if e.kind == "study-v1"]
    assert len(shown) == 3 and shown == [pytest.approx(sum(noise) / 5, abs=1e-9)] * 3
    assert f"seed noise {sum(noise) / 5:+.2f} [" in markdown(claims, regimes(), RESULTS)


def test_a_changed_result_changes_the_table(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(RESULTS, root)
    path = root / "macaron-field" / "results.csv"
    before = markdown(collect(root), regimes(), root)
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    rows[0]["test_ppl"] = str(float(rows[0]["test_ppl"]) + 5.0)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert markdown(collect(root), regimes(), root) != before


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing-folder", "is not a folder"),
        ("nan", "line 2 .* test_ppl is 'nan', not a number"),
        ("no-csv", "cannot read .*results.csv"),
        ("no-markers", "has no verdict markers"),
    ],
)
def test_verdicts_write_nothing_unless_every_input_was_read(tmp_path, capsys, damage, message):
    """A typo in --results, a nan or a missing results.csv, or a README without markers:
    one line, exit 2, and neither the README nor verdicts.md changes."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS, root)
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    page_before, readme_before = (root / PAGE).read_bytes(), readme.read_bytes()
    results = root
    if damage == "missing-folder":
        results = tmp_path / "typo"
    elif damage == "nan":
        path = root / "macaron-field" / "results.csv"
        lines = path.read_text().splitlines()
        head, first = lines[0].split(","), lines[1].split(",")
        first[head.index("test_ppl")] = "nan"
        path.write_text("\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n")
    elif damage == "no-csv":
        (root / "macaron-field" / "results.csv").unlink()
    else:
        readme.write_text(readme.read_text().replace(END, ""))
        readme_before = readme.read_bytes()
    code = main(["verdicts", "--results", str(results), "--write", str(readme)])
    printed = capsys.readouterr().err
    assert code == 2, printed
    assert len(printed.strip().splitlines()) == 1
    assert re.search(message, printed), printed
    assert readme.read_bytes() == readme_before
    assert (root / PAGE).read_bytes() == page_before


def test_a_study_pages_tables_are_drawn_from_its_grid(tmp_path, capsys):
    """A page's generated blocks are redrawn from results.csv and tune.csv by `odelm
    verdicts --write`: a hand edit inside a block is undone, the prose around it is kept,
    and the table equals what `odelm compare` wrote to results.md."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS, root)
    folder = root / "study-node-lm"
    page = folder / "README.md"
    page.write_text(
        "# A study\n\nProse stays.\n\n<!-- odelm:results -->\n| edited by hand |\n"
        "<!-- /odelm:results -->\n\n<!-- odelm:tuning -->\n<!-- /odelm:tuning -->\nEnd.\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    assert main(["verdicts", "--results", str(root), "--write", str(readme)]) == 0
    text = page.read_text()
    assert "edited by hand" not in text and text.startswith("# A study\n\nProse stays.")
    table = text.split("<!-- odelm:results -->\n", 1)[1].split("<!-- /odelm:results -->")[0]
    published = (folder / "results.md").read_text()  # results.md of study-node-lm
    assert table == published
    tuning = text.split("<!-- odelm:tuning -->\n", 1)[1].split("<!-- /odelm:tuning -->")[0]
    assert "| lstm-tied | 2" in tuning and "**" in tuning  # the chosen rate in bold
    rows = list(csv.DictReader((folder / "tune.csv").open()))
    chosen = next(r for r in rows if r["arm"] == "ode-lstm-tied" and r["chosen"] == "True")
    assert f"**{float(chosen['valid_ppl']):.2f}**" in tuning
    assert "generated tables rewritten" in capsys.readouterr().out
