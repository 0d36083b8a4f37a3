"""The warm-up + cosine schedule: the rate is a function of the step alone (linear warm-up to
the peak, a cosine decay to 0 at the run's last step), and a run's logged rates follow it
whatever its validations say."""

from __future__ import annotations

import csv
import math
from itertools import pairwise

import pytest

from experiments.training.config import parse_config
from experiments.training.optimizers import warmup_cosine_lambda
from experiments.training.train import train
from tests.support.runs import make_tiny_config


def test_warmup_is_linear_and_the_cosine_reaches_zero_at_the_budget():
    factor = warmup_cosine_lambda(warmup_steps=4, total_steps=24)
    assert [factor(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factor(4) == pytest.approx(1.0)  # the peak: the first step of the decay
    assert factor(14) == pytest.approx(0.5)  # half way through the 20 decay steps
    assert factor(9) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert factor(24) == pytest.approx(0.0, abs=1e-12)
    assert factor(1000) == pytest.approx(0.0, abs=1e-12)  # never negative past the budget
    rates = [factor(s) for s in range(4, 25)]
    assert all(a >= b for a, b in pairwise(rates))  # monotone after the warm-up


def test_no_warmup_starts_at_the_peak():
    factor = warmup_cosine_lambda(warmup_steps=0, total_steps=10)
    assert factor(0) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_a_runs_logged_rates_are_the_schedule_and_no_validation_moves_them(tmp_path):
    values = make_tiny_config(
        tmp_path,
        name="cosine",
        optim={"optimizer": "sgd", "lr": 0.5, "schedule": "cosine", "warmup_steps": 3},
        trainer={"max_steps": 12, "val_every": 2, "val_batches": 1, "log_every": 1},
    )
    train(parse_config(values))
    with (tmp_path / "cosine" / "logs" / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("lr-SGD")]
    rates = {int(row["step"]): float(row["lr-SGD"]) for row in rows}
    factor = warmup_cosine_lambda(3, 12)
    assert len(rates) >= 10
    for step, rate in rates.items():
        assert rate == pytest.approx(0.5 * factor(step), rel=1e-6, abs=1e-12), step
