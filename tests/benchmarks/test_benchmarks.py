"""Benchmarks live in one package with one timing helper; ``odelm bench`` finds them all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from experiments.cli.bench import BENCHMARKS, resolve
from odelm.timing import alternating, medians


def _recorder(log: list[str], name: str) -> Callable[[], None]:
    return lambda: log.append(name)


def test_alternating_reverses_the_order_every_other_round_after_the_warmup() -> None:
    log: list[str] = []
    times = alternating({k: _recorder(log, k) for k in "abc"}, rounds=3, warmup=1)
    assert log == list("abc") + list("abc") + list("cba") + list("abc")
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(s >= 0 for v in times.values() for s in v)


def test_a_spent_budget_stops_after_the_fewest_rounds() -> None:
    log: list[str] = []
    times = alternating({"x": _recorder(log, "x")}, rounds=10, budget_s=0.0, min_rounds=2)
    assert log == ["x", "x"] and len(times["x"]) == 2
    assert len(alternating({"x": _recorder(log, "x")}, rounds=4, budget_s=1e9)["x"]) == 4


def test_medians_are_per_call() -> None:
    assert medians({"a": [3.0, 1.0, 2.0], "b": [4.0, 5.0]}) == {"a": 2.0, "b": 4.5}


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_registered_benchmark_resolves_outside_the_model_packages(name: str) -> None:
    module = BENCHMARKS[name].partition(":")[0]
    assert callable(resolve(name))
    assert not module.startswith(("neuralode_lm.", "ode_transformer.")), module
