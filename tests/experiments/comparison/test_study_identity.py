"""The study grids' runs keep their identity: every run a study's grid file expands to (the
trials at each tuned value, the seeds at each arm's chosen value, the seed-noise runs) has
the ``config_sha256`` its committed record was trained with (``docs/results/GRID/records``).
A refactor that changes what a config means, or an edit of a study's grid, fails here instead
of retraining a finished run or reusing one under a changed config."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from experiments.comparison.compare import expand_grid, grid_baseline, result_seeds
from experiments.comparison.tables import SEED_NOISE, grid_has_fixed_budget
from experiments.comparison.tuning import apply_choices, trial_values, tune_spec
from experiments.training.config import load_yaml, parse_config
from experiments.training.runs import config_sha256
from tests.support.paths import ROOT

GRIDS = ROOT / "experiments" / "configs" / "grids"
RESULTS = ROOT / "docs" / "results"
STUDIES = sorted(
    path.stem
    for path in GRIDS.glob("*.yaml")
    if "tune" in load_yaml(path) and (RESULTS / path.stem / "tune.csv").is_file()
)
"""Every tuned grid whose sweep is published: each record must hash to its planned config,
and a finished grid (one with `results.csv`) must keep a record of every run."""
WITHOUT_RECORDS = {"study-table5-2layer"}
"""Superseded by study2-table5-2layer: its runs were made before records were kept (its
page says so), so it cannot be re-checked run by run."""


def planned_hashes(study: str) -> dict[str, str]:
    """Run folder -> ``config_sha256`` of every run of the study, the tuned values and the
    choices read from its ``tune.csv``."""
    grid = load_yaml(ROOT / "experiments" / "configs" / "grids" / f"{study}.yaml")
    planned = expand_grid(grid, Path("out"), {})
    spec = tune_spec(grid, result_seeds(planned))
    assert spec is not None and spec.also_key is None
    rows = list(csv.DictReader((ROOT / "docs" / "results" / study / "tune.csv").open()))
    spec = replace(spec, values=tuple(sorted({float(row["value"]) for row in rows})))
    choices = {row["arm"]: (float(row["value"]), None) for row in rows if row["chosen"] == "True"}
    hashes = {}
    first = result_seeds(planned)[0]
    for plan in planned:  # every arm's trials, at the tuning seed (a result seed or not)
        if plan.seed == first and plan.name != SEED_NOISE:
            for value in spec.values:
                values = trial_values(spec, plan.name, plan.values, value, None)
                hashes[values["name"]] = config_sha256(parse_config(values))
    for plan in apply_choices(planned, spec, choices, grid_baseline(grid)):
        hashes[plan.run] = config_sha256(parse_config(plan.values))
    return hashes


def check_records(study: str) -> None:
    """Every record of ``study`` has the hash of the config its grid expands to; a finished
    study (one with ``results.csv``) keeps a record of every run, one still training those of
    its tuning trials at least (its choices are read from them)."""
    recorded = {
        folder.name: json.loads((folder / "result.json").read_text())["config_sha256"]
        for folder in (RESULTS / study / "records").iterdir()
    }
    planned = planned_hashes(study)
    assert {name: planned.get(name) for name in recorded} == recorded, study
    if (RESULTS / study / "results.csv").is_file():
        assert planned == recorded, study
    else:
        assert {name for name in planned if name.startswith("tune-")} <= set(recorded), study


@pytest.mark.slow  # 3 s of CPU time: parses every config of both grids
@pytest.mark.parametrize("study", STUDIES)
def test_every_study_run_has_the_identity_of_its_record(study):
    if study in WITHOUT_RECORDS:
        assert not (RESULTS / study / "records").exists()  # else it must be checked too
        return
    check_records(study)


STALLED = 450.0
"""Best validation perplexity above which a run counts as stalled: PTB-mini's unigram
plateau is about 650, every tuned arm ends below 300."""
V2_STUDIES = [
    study for study in STUDIES if grid_has_fixed_budget(load_yaml(GRIDS / f"{study}.yaml"))
]
"""The studies of protocol v2 (warm-up + cosine over a fixed budget) with a published sweep."""


@pytest.mark.parametrize("study", V2_STUDIES)
def test_a_v2_study_page_says_which_runs_stalled(study):
    """Protocol v2: no chosen result run ends above ``STALLED``, and a tuning trial that
    does is named on the page (a stalled run is a finding, never a silent data point); a
    page saying no trial stalled is held to its sweep."""
    trials = list(csv.DictReader((RESULTS / study / "tune.csv").open()))
    stalled = [row["run"] for row in trials if float(row["valid_ppl"] or 0) >= STALLED]
    page = (RESULTS / study / "README.md").read_text()
    assert all(run in page for run in stalled), stalled
    assert not ("No trial stalled" in page and stalled), stalled
    if (RESULTS / study / "results.csv").is_file():
        results = csv.DictReader((RESULTS / study / "results.csv").open())
        assert all(float(row["valid_ppl"]) < STALLED for row in results)


RETRAINED = sorted(path.parent for path in RESULTS.glob("*/retrain/*/result.json"))
"""Runs of a study re-trained from their record (``docs/results/GRID/retrain/RUN``)."""


@pytest.mark.parametrize("retrained", RETRAINED, ids=lambda path: f"{path.parts[-3]}/{path.name}")
def test_a_retrained_run_is_its_record_and_its_page_quotes_both(retrained):
    """A re-trained run has its record's identity, and the study's page quotes the metric of
    both (excess loss on the grammar family, else test perplexity) as they are recorded."""
    study = retrained.parent.parent
    again = json.loads((retrained / "result.json").read_text())
    record = json.loads((study / "records" / retrained.name / "result.json").read_text())
    assert again["config_sha256"] == record["config_sha256"]
    key = "test_excess_nll_per_token" if "test_excess_nll_per_token" in record else "test_ppl"
    digits = 5 if key == "test_excess_nll_per_token" else 2
    page = (study / "README.md").read_text()
    assert f"{again[key]:.{digits}f}" in page and f"{record[key]:.{digits}f}" in page


TIMINGS = {"train/tokens_per_s", "train/mfu", "val/elapsed_s"}
"""The columns of ``metrics.csv`` that measure the machine, not the run."""


@pytest.mark.parametrize("retrained", RETRAINED, ids=lambda path: f"{path.parts[-3]}/{path.name}")
def test_a_run_reproduced_to_the_digit_repeats_its_whole_training_curve(retrained):
    """Where a page says a re-trained run reproduced its record (the same test metric, every
    digit), its ``metrics.csv`` is the record's in every row and every column but the
    timings; a re-train that moved (another CPU type) says so on its page instead."""
    study = retrained.parent.parent
    again = json.loads((retrained / "result.json").read_text())
    record = json.loads((study / "records" / retrained.name / "result.json").read_text())
    key = "test_excess_nll_per_token" if "test_excess_nll_per_token" in record else "test_ppl"
    page = (study / "README.md").read_text()
    if again[key] != record[key]:
        assert "moves a run" in page  # the page reads it against the seed noise
        return
    with (retrained / "logs" / "metrics.csv").open() as handle:
        curve = [
            {k: v for k, v in row.items() if k not in TIMINGS} for row in csv.DictReader(handle)
        ]
    with (study / "records" / retrained.name / "logs" / "metrics.csv").open() as handle:
        recorded = [
            {k: v for k, v in row.items() if k not in TIMINGS} for row in csv.DictReader(handle)
        ]
    assert len(curve) > 100 and curve == recorded
    assert f"{len(curve):,} rows" in page
