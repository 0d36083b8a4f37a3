"""The one timing helper of the library's benchmarks and measurements: variants
interleaved, order alternating.

Compared variants run inside one process, one round after another, in order on even
rounds and reversed on odd ones, so no variant always runs first (cold caches) or last;
the medians of their seconds are compared, so a change of machine load hits all alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

Key = TypeVar("Key", bound=Hashable)


def seconds(call: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def alternating(
    calls: dict[Key, Callable[[], Any]],
    rounds: int,
    *,
    warmup: int = 0,
    budget_s: float | None = None,
    min_rounds: int = 1,
) -> dict[Key, list[float]]:
    """Seconds of each call per round, the calls' order reversed on every other round.

    Each call first runs ``warmup`` times untimed. With ``budget_s``, no round starts once
    that many seconds have passed since the first, after at least ``min_rounds`` rounds.
    """
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[Key, list[float]] = {key: [] for key in calls}
    order = list(calls)
    started = time.perf_counter()
    for done in range(rounds):
        over_budget = budget_s is not None and time.perf_counter() - started > budget_s
        if over_budget and done >= min_rounds:
            break
        for key in order if done % 2 == 0 else order[::-1]:
            times[key].append(seconds(calls[key]))
    return times


def medians(times: dict[Key, list[float]]) -> dict[Key, float]:
    """The median seconds of each call of [`alternating`][odelm.timing.alternating]."""
    return {key: statistics.median(values) for key, values in times.items()}
