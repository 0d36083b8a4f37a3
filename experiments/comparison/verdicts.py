"""The verdicts of the seed papers' claims, computed from the grids' ``results.csv`` files.

``experiments/configs/verdicts.yaml`` lists the data regimes (PTB-mini, read in test
perplexity; the grammar family at depths 1 and 3, read in excess loss over the true
grammar) and each claim with exactly one ``primary`` comparison per regime it is tested in,
registered before its grid ran, and any number of ``secondary`` ones. This module reads each
grid's ``results.csv`` under ``docs/results/``, computes every seed-paired difference with
its 95% interval and p-value, adjusts the primaries' p-values with Holm's method over all
primaries of all regimes (a primary without results counts as p = 1, so the family is the
same before and after the runs), and states for each primary the smallest difference it
could have detected with 80% power at its Holm level. A verdict word belongs to one primary:
**holds** (significantly better after Holm), **does not hold** (significantly worse), **not
shown** (neither), **pending** (no results yet). Secondaries carry their unadjusted p,
labelled exploratory, and never decide a word. The tables are drawn by
``experiments.comparison.verdict_tables``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.comparison.compare import GRIDS_DIR, grid_baseline, grid_path
from experiments.comparison.stats import PairedDifference, detectable_difference, holm
from experiments.comparison.tables import SEED_NOISE, comparisons, grid_has_fixed_budget
from experiments.training.config import ConfigError, load_yaml

SPEC = Path(__file__).parents[1] / "configs" / "verdicts.yaml"
ALPHA = 0.05
KINDS = {
    "study": "replication protocol v2 (tuned, warm-up + cosine)",
    "robustness": "protocol v2, another optimizer",
    "study-v1": "tuned, plateau schedule (protocol of 0.3)",
    "field": "field strength, reference budget",
    "early": "early training",
    "wt2": "WT2-mini, field strength",
}
"""The kinds of secondary evidence, in the order the full table lists them."""
PLANNED = ("study", "robustness")
"""Secondary kinds whose grid may still be pending (a registered grid not yet run)."""
COMPARISON_KEYS = {"grid", "model", "baseline", "label"}
REGIME_KEYS = {"name", "title", "metric", "unit"}


@dataclass(frozen=True)
class Regime:
    """A data regime: its name in verdicts.yaml, its title, the results.csv column its
    comparisons read and that column's unit."""

    name: str
    title: str
    metric: str
    unit: str

    @property
    def digits(self) -> int:
        """Decimals a difference is shown with (perplexities 2, nats per token 4)."""
        return 2 if self.metric == "test_ppl" else 4


@dataclass(frozen=True)
class Evidence:
    """One comparison of a claim, computed (``paired`` None while its grid is pending)."""

    kind: str  # "primary" or a secondary kind of KINDS
    regime: Regime
    grid: str
    label: str
    paired: PairedDifference | None
    noise: PairedDifference | None = None  # the grid's seed-noise row (A/A), if it has one
    cap_bound: int = 0  # runs of the model or baseline still improving at a plateau-rule budget
    p_holm: float | None = None  # primaries only
    level: float | None = None  # primaries only: the Holm level its p was compared with
    detectable: float | None = None  # primaries only: the difference found with 80% power


def primaries_sha256(spec: dict[str, Any]) -> str:
    """The hash of the table's primaries (claim, regime, grid, model, baseline)."""
    rows = [
        [claim["claim"], regime, item["grid"], item["model"], item["baseline"]]
        for claim in spec["claims"]
        for regime, item in claim["primary"].items()
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def load_spec(path: Path = SPEC) -> dict[str, Any]:
    """``verdicts.yaml``, checked: known regimes, at most one primary per claim and regime,
    known kinds, no comparison listed twice."""
    spec = load_yaml(path)
    regimes = spec.get("regimes")
    if not isinstance(regimes, list) or any(set(r) != REGIME_KEYS for r in regimes):
        raise ConfigError(f"{path}: regimes must list {{{', '.join(sorted(REGIME_KEYS))}}}")
    names = {r["name"] for r in regimes}
    seen: set[tuple[str, str, str]] = set()
    for claim in spec.get("claims", []):
        primary = claim.get("primary")
        if not isinstance(primary, dict) or not primary or set(primary) - names:
            raise ConfigError(
                f"{path}: claim {claim.get('claim')!r} needs one primary per regime it is "
                f"tested in, keyed by regime ({', '.join(sorted(names))})"
            )
        for item in [*primary.values(), *claim.get("secondary", [])]:
            keys = set(item) - {"kind", "regime"}
            if keys != COMPARISON_KEYS or item.get("regime", "ptb-mini") not in names:
                raise ConfigError(f"{path}: {item} needs grid, model, baseline and label")
            if "kind" in item and item["kind"] not in KINDS:
                raise ConfigError(
                    f"{path}: secondary kind {item['kind']!r} is not one of {', '.join(KINDS)}"
                )
            key = (item["grid"], item["model"], item["baseline"])
            if key in seen:
                raise ConfigError(f"{path}: {' / '.join(key)} is listed twice; list it once")
            seen.add(key)
    if not isinstance(spec.get("registered"), dict):
        raise ConfigError(f"{path}: no registered: {{commit, primaries_sha256}} section")
    return spec


def read_results(path: Path) -> list[dict[str, Any]]:
    """A grid's ``results.csv`` as rows with numbers; a missing, unreadable or incomplete
    file (a missing or non-finite test perplexity) is one error naming the file and row."""
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"cannot read {path}: {error}; re-run the grid's odelm compare") from None
    if not rows or not {"name", "seed", "test_ppl"} <= set(rows[0]):
        raise ConfigError(f"{path} has no rows with name, seed and test_ppl: not a results.csv")
    for line, row in enumerate(rows, start=2):
        text = row["test_ppl"]
        try:
            row["seed"], row["test_ppl"] = int(row["seed"]), float(text)
        except (TypeError, ValueError):
            row["test_ppl"] = math.nan
        if not math.isfinite(row["test_ppl"]):
            raise ConfigError(
                f"{path} line {line} ({row.get('name')}, seed {row.get('seed')}): test_ppl is "
                f"{text!r}, not a number; re-run that run or remove its row"
            )
        for key in ("test_excess_nll_per_token", "test_ppl_ratio"):
            row[key] = float(row[key]) if row.get(key) else None
        row["pair"] = int(row["pair"]) if row.get("pair") else None
    return rows


def collect(results_root: Path, spec_path: Path = SPEC) -> list[dict[str, Any]]:
    """Every claim with its computed primaries (``primary``: regime name -> Evidence) and
    ``secondary`` evidence, Holm over all primaries of all regimes."""
    if not results_root.is_dir():
        raise ConfigError(
            f"--results {results_root} is not a folder; give the folder holding one folder "
            "per grid (docs/results)"
        )
    spec = load_spec(spec_path)
    regimes = {r["name"]: Regime(**r) for r in spec["regimes"]}
    cache: dict[str, Any] = {}
    claims = []
    for claim in spec["claims"]:
        primary = {
            name: _evidence("primary", regimes[name], item, results_root, cache)
            for name, item in claim["primary"].items()
        }
        secondary = [
            _evidence(i["kind"], regimes[i.get("regime", "ptb-mini")], i, results_root, cache)
            for i in claim.get("secondary", [])
        ]
        claims.append({**claim, "primary": primary, "secondary": secondary})
    _check_registered(spec, claims, spec_path)
    return _with_holm(claims)


def regimes(spec_path: Path = SPEC) -> list[Regime]:
    """The regimes of the table, in its order."""
    return [Regime(**r) for r in load_spec(spec_path)["regimes"]]


def _evidence(
    kind: str, regime: Regime, item: dict[str, Any], root: Path, cache: dict[str, Any]
) -> Evidence:
    grid = item["grid"]
    if grid not in cache:  # each grid's file and seed-noise row, once
        # a registered grid still running (its records folder, no results.csv yet) or not run
        pending = not (root / grid / "results.csv").exists()
        pending = pending and (GRIDS_DIR / f"{grid}.yaml").is_file()
        if pending and kind in ("primary", *PLANNED):
            cache[grid] = None
        else:
            cache[grid] = read_results(root / grid / "results.csv")
    if cache[grid] is None:
        return Evidence(kind, regime, grid, item["label"], None)
    rows = cache[grid]
    missing = {item["model"], item["baseline"]} - {r["name"] for r in rows}
    if missing:
        raise ConfigError(f"{root / grid / 'results.csv'} has no run named {min(missing)}")
    chosen = [r for r in rows if r["name"] in (item["model"], item["baseline"])]
    if any(r.get(regime.metric) is None for r in chosen):
        raise ConfigError(
            f"{root / grid / 'results.csv'} has no {regime.metric} for {item['model']} or "
            f"{item['baseline']}: the {regime.title} regime reads it; re-run the grid"
        )
    paired = comparisons(rows, item["baseline"], regime.metric)[item["model"]]
    capped = 0 if _fixed_budget(grid) else sum(r.get("cap_bound") == "True" for r in chosen)
    return Evidence(
        kind, regime, grid, item["label"], paired, _seed_noise(grid, rows, regime), capped
    )


def _fixed_budget(grid: str) -> bool:
    """`grid_has_fixed_budget` of the grid file named ``grid`` (False when there is none)."""
    path = GRIDS_DIR / f"{grid}.yaml"
    return path.is_file() and grid_has_fixed_budget(load_yaml(path))


def _check_registered(spec: dict[str, Any], claims: list[dict[str, Any]], path: Path) -> None:
    """Refuse primaries changed after any of their grids has results."""
    has_results = any(e.paired is not None for c in claims for e in c["primary"].values())
    if has_results and primaries_sha256(spec) != spec["registered"].get("primaries_sha256"):
        raise ConfigError(
            f"{path}: the primaries differ from those registered in commit "
            f"{spec['registered'].get('commit')} and their grids have results: a primary "
            "cannot change after the data exist; restore it (add a new comparison as a "
            "secondary)"
        )


def _with_holm(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Holm over every primary (pending ones at p = 1), each with its level and the
    difference it could detect at that level."""
    keys = [(index, name) for index, c in enumerate(claims) for name in c["primary"]]
    p_values = [_p(claims[i]["primary"][name]) for i, name in keys]
    adjusted = holm(p_values)
    order = sorted(range(len(keys)), key=lambda k: p_values[k])
    levels = {k: ALPHA / (len(keys) - rank) for rank, k in enumerate(order)}
    for k, (index, name) in enumerate(keys):
        evidence = claims[index]["primary"][name]
        paired = evidence.paired
        if paired is None or paired.p_value is None:
            continue  # pending: in the family at p = 1, with nothing to report
        detectable = detectable_difference(paired.sd or 0.0, paired.n, levels[k])
        claims[index]["primary"][name] = replace(
            evidence, p_holm=adjusted[k], level=levels[k], detectable=detectable
        )
    return claims


def _p(evidence: Evidence) -> float:
    if evidence.paired is None or evidence.paired.p_value is None:
        return 1.0
    return evidence.paired.p_value


def _seed_noise(grid: str, rows: list[dict[str, Any]], regime: Regime) -> PairedDifference | None:
    """The grid's seed-noise row against the run it repeats at other seeds (the preset's
    ``baseline``, whatever the comparison's baseline): the A/A spread; None without one."""
    if not any(r["name"] == SEED_NOISE for r in rows):
        return None
    baseline = grid_baseline(load_yaml(grid_path(grid)))
    return comparisons(rows, baseline, regime.metric)[SEED_NOISE]


def verdict(primary: Evidence | None) -> str:
    """The verdict word of one primary."""
    if primary is None:
        return "-"
    if primary.paired is None or primary.p_holm is None:
        return "pending"
    if primary.p_holm < ALPHA:
        return "holds" if primary.paired.mean < 0 else "does not hold"
    return "not shown"
