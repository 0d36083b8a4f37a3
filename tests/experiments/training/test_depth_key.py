"""A result's depth kind is ``depth`` (``model.family`` is the model's package); results
written before the rename say ``family``, and every reader reads either the same:
``results.csv`` and ``results.md`` (tables), the models of the NFE figure (plots),
``results.csv`` rows (verdicts) and the model card."""

from __future__ import annotations

import csv
from typing import Any

import pytest

from experiments.comparison.plots import continuous
from experiments.comparison.tables import CSV_COLUMNS, group_by_model, write_tables
from experiments.comparison.verdicts import read_results
from experiments.training.cards import card_text
from experiments.training.config import parse_config
from experiments.training.runs import result_depth
from tests.support.runs import make_tiny_config

KEYS = ["family", "depth"]


def _results(key: str) -> list[dict[str, Any]]:
    """Two models of two seeds each, their depth kind under ``key``."""
    return [
        {"name": name, "seed": seed, "run": f"{name}-seed{seed}", key: depth}
        | {"test_ppl": ppl + seed, "parameters": 1000, "protocol": "P", "model": name}
        for name, depth, ppl in (("lstm", "baseline", 10.0), ("ode-lstm", "continuous depth", 9.0))
        for seed in (1, 2)
    ]


@pytest.mark.parametrize("key", KEYS)
def test_the_helper_reads_either_key(key):
    assert result_depth({key: "continuous depth"}) == "continuous depth"
    assert result_depth({}) is None


def test_tables_plots_and_verdicts_read_family_and_depth_the_same(tmp_path):
    written: dict[str, tuple[str, str, list[str], list[Any]]] = {}
    for key in KEYS:
        out = tmp_path / key
        out.mkdir()
        results = _results(key)
        write_tables(results, out, "lstm")
        rows = read_results(out / "results.csv")
        drawn = continuous(group_by_model(results))  # the models whose NFE is drawn
        csv_text = (out / "results.csv").read_text()
        written[key] = (csv_text, (out / "results.md").read_text(), drawn, rows)
    assert written["family"] == written["depth"]
    csv_text, _, drawn, rows = written["depth"]
    assert "depth" in CSV_COLUMNS and "family" not in CSV_COLUMNS
    assert [row["depth"] for row in csv.DictReader(csv_text.splitlines())] == [
        "baseline",
        "baseline",
        "continuous depth",
        "continuous depth",
    ]
    assert drawn == ["ode-lstm"]
    # a results.csv written before the rename: its family column reads as the depth
    old = tmp_path / "old.csv"
    old.write_text(csv_text.replace("run,depth,", "run,family,", 1))
    assert [result_depth(r) for r in read_results(old)] == [result_depth(r) for r in rows]


def test_the_card_reads_family_and_depth_the_same(tmp_path):
    config = parse_config(make_tiny_config(tmp_path, "card-run"))
    result = {"model": "m", "parameters": 10, "is_causal": True, "protocol": "P", "test_ppl": 12.0}
    result |= {
        "recipe": "custom",
        "steps": 4,
        "selected": "best",
        "seed": 3,
        "config_sha256": "ab",
        "test_ppl_per_word": 15.0,
    }
    cards = {key: card_text(config, {**result, key: "discrete depth"}, "0" * 40) for key in KEYS}
    assert cards["family"] == cards["depth"]
    assert (
        "- discrete-depth" in cards["depth"] and "A discrete depth language model" in cards["depth"]
    )
