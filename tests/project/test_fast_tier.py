"""The fast tier's stated time (tests/README.md) stays within reach: the fast tier
(``python -m pytest -m "not slow"``) is the suite the CPU-time record ``tests/fast_tier.json``
covers, every test in it stays under a per-test budget, and the record's total is what
tests/README.md states, within a budget that fits 2 minutes on a 2-core CI machine. CPU seconds from
a committed record rather than a clock read now: the check cannot flake on a loaded
machine (tests/support/fast_tier.py says how the record is made)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import fast_tier
from tests.support.paths import ROOT

RERECORD = 'python -m pytest -m "not slow" --record-fast-tier'


@pytest.fixture(scope="module")
def fast_tier_ids(request: pytest.FixtureRequest) -> list[str]:
    """The fast tier's node ids: from this session's collection when it collected the whole
    tests folder (conftest), else from ``pytest --collect-only`` in a subprocess."""
    known = request.config.stash.get(fast_tier.FAST_TIER, None)
    if known is not None:
        return known
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", fast_tier.FAST]
        + ["-p", "no:cacheprovider", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if line.startswith("tests/")]


def readme_fast_tier_cpu_s() -> float:
    """The fast tier's CPU seconds as tests/README.md states them."""
    readme = (ROOT / "tests" / "README.md").read_text()
    match = re.search(r"The fast tier: (\d+) s of CPU time", readme)
    assert match, "tests/README.md no longer states the fast tier's CPU time"
    return float(match.group(1))


def test_every_fast_test_is_recorded(fast_tier_ids):
    recorded = fast_tier.load()["tests"]
    missing = sorted(set(fast_tier_ids) - set(recorded))
    assert not missing, (
        f"{len(missing)} fast-tier tests have no recorded CPU time ({missing[:5]}...): mark "
        f"them slow, or record them: {RERECORD}"
    )


def test_no_fast_test_is_over_its_budget():
    over = {k: v for k, v in fast_tier.load()["tests"].items() if v > fast_tier.PER_TEST_CPU_S}
    assert not over, (
        f"fast-tier tests over {fast_tier.PER_TEST_CPU_S} s of CPU time: {over}; mark them "
        "@pytest.mark.slow or make them cheaper"
    )


def test_the_readme_states_the_recorded_fast_tier_time():
    """Recorded total <= the stated figure <= the budget, and the figure is no more than
    a fifth above the record (a stale, generous claim fails too)."""
    record = fast_tier.load()
    assert record["collection_cpu_s"] > 0, f"no whole fast-tier run recorded: {RERECORD}"
    recorded, stated = fast_tier.total(record), readme_fast_tier_cpu_s()
    assert recorded <= stated <= 1.2 * recorded + 1, (recorded, stated)
    assert stated <= fast_tier.TOTAL_CPU_S, (stated, fast_tier.TOTAL_CPU_S)
