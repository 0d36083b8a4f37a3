"""The run-configuration layer stays small: its files, listed here, hold at most
``MAX_LINES`` lines together, and the layer's entry points live in them (so that the count
cannot shrink by moving configuration code to an unlisted file)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from experiments.cli import options, usage
from experiments.config_errors import config_error
from experiments.models.schema import check_model
from experiments.training import config, identity, run_schema
from tests.support.paths import ROOT

CONFIG_LAYER = (
    "experiments/training/run_schema.py",
    "experiments/training/config.py",
    "experiments/training/identity.py",
    "experiments/config_errors.py",
    "experiments/models/schema.py",
    "experiments/cli/options.py",
    "experiments/cli/usage.py",
)
"""The run-configuration layer: run sections, parser, identity, model schema, config errors,
the CLI's option building and usage errors."""
MAX_LINES = 1_400

ENTRY_POINTS = (
    run_schema.RunConfig,
    run_schema.TrainerConfig,
    config.parse_config,
    config.add_run_arguments,
    config.load_yaml,
    identity.config_sha256,
    check_model,
    config_error,
    options.train_parser,
    options.compare_parser,
    options.eval_parser,
    usage.usage_error,
)


def test_every_file_of_the_layer_exists():
    missing = [name for name in CONFIG_LAYER if not (ROOT / name).is_file()]
    assert missing == []


def test_the_layer_is_at_most_1400_lines():
    lines = {name: len((ROOT / name).read_text().splitlines()) for name in CONFIG_LAYER}
    assert sum(lines.values()) <= MAX_LINES, f"{sum(lines.values())} lines: {lines}"


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda entry: entry.__qualname__)
def test_the_layers_entry_points_live_in_its_files(entry):
    path = Path(inspect.getsourcefile(entry) or "").resolve().relative_to(ROOT)
    assert path.as_posix() in CONFIG_LAYER
