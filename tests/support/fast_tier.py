"""The fast tier (``python -m pytest -m "not slow"``) and its recorded CPU time.

tests/README.md states how long the fast tier takes; ``tests/fast_tier.json`` is the record that
statement rests on: the CPU seconds (user + system, of pytest and of the subprocesses it
waited for) each fast-tier test took, and what collection took before the first test.
CPU time, not wall time, because it barely moves with the machine's load (the record was
made on a 2-core machine whose both cores were busy with other work) and so can be checked
without a flaky timing test. ``tests/project/test_fast_tier.py`` checks the record against the
suite: every fast-tier test recorded, none over :data:`PER_TEST_CPU_S`, the total within
what tests/README.md states and within :data:`TOTAL_CPU_S`.

Record after adding, removing or slowing a fast test::

    python -m pytest -m "not slow" --record-fast-tier

A run of only some files (``python -m pytest tests/FOLDER/test_x.py -m "not slow"
--record-fast-tier``) updates the entries of the tests it ran and keeps the others.
"""

from __future__ import annotations

import json
import resource
from typing import Any

import pytest

from tests.support.paths import ROOT

RECORD = ROOT / "tests" / "fast_tier.json"
PER_TEST_CPU_S = 3.0
"""The most CPU seconds one fast-tier test may take (its module's shared fixtures and first
imports included); a slower test is marked ``slow``."""
TOTAL_CPU_S = 100.0
"""The most CPU seconds the whole fast tier (collection included) may take, as recorded on a
2-core machine under load, where CPU time runs above an idle machine's: the former fast
tier measured 270 s this way at load 9 and ran in 1 min 46 s of wall time on a fresh 2-core
machine at load 1-2, and CI took 1.6x that machine's time for the full suite, so 100 s
here is about a minute of wall time in CI (pytest runs its tests one after another, on one
thread), inside the 2 minutes the fast tier is for."""
FAST = "not slow"
"""The marker expression that selects the fast tier."""
FAST_TIER = pytest.StashKey[list[str]]()
"""The fast tier's node ids, stashed on the config when the whole tests folder is collected."""
COLLECTION_CPU = pytest.StashKey[float]()
"""CPU seconds the session took before its first test (start-up, imports, collection)."""


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of the children it waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def load() -> dict[str, Any]:
    """The record: ``{"collection_cpu_s": float, "tests": {node id: CPU seconds}}``."""
    if not RECORD.is_file():
        return {"collection_cpu_s": 0.0, "tests": {}}
    return json.loads(RECORD.read_text())


def total(record: dict[str, Any]) -> float:
    """The fast tier's recorded CPU seconds: collection plus every test."""
    return float(record["collection_cpu_s"]) + sum(record["tests"].values())


def save(
    measured: dict[str, float],
    collection_cpu_s: float | None,
    fast_tier: list[str] | None,
) -> dict[str, Any]:
    """Update the record with ``measured`` (node id: CPU seconds); with the whole fast tier
    known (``fast_tier``), drop the entries of tests no longer in it and, with
    ``collection_cpu_s``, replace the collection time."""
    record = load()
    tests = {**record["tests"], **{k: round(v, 2) for k, v in measured.items()}}
    if fast_tier is not None:
        tests = {k: v for k, v in tests.items() if k in set(fast_tier)}
    if collection_cpu_s is not None:
        record["collection_cpu_s"] = round(collection_cpu_s, 2)
    record["tests"] = dict(sorted(tests.items()))
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    return record
