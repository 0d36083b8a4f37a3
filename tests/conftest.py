"""Shared fixtures: the real data dir (``$ODELM_DATA_DIR``, or a ``shared/data`` folder beside
the repository), tiny corpora, and the tiny run config the training tests share; and the
fast tier's CPU-time record (``--record-fast-tier``, tests/support/fast_tier.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.support import fast_tier
from tests.support.paths import ROOT
from tests.support.runs import TINY_MODEL, make_tiny_config


def shared_data_dir() -> Path | None:
    """``$ODELM_DATA_DIR`` or ``../shared/data`` beside the repository, when it exists."""
    for candidate in (os.environ.get("ODELM_DATA_DIR"), ROOT.parent / "shared" / "data"):
        if candidate and Path(candidate, "ptb").is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    found = shared_data_dir()
    if found is None:
        pytest.skip("real PTB / WikiText-2 files not found (set ODELM_DATA_DIR)")
    return found


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., dict[str, Any]]:
    """The factory :func:`make_tiny_config`."""
    return make_tiny_config


@pytest.fixture
def tiny_model() -> dict[str, Any]:
    """A fresh copy of :data:`TINY_MODEL`."""
    return dict(TINY_MODEL)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two
    threads can stall each op for milliseconds; restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def text_corpus_dir(tmp_path: Path) -> Path:
    """A tiny text corpus folder with train/valid/test files."""
    lines = {
        "train": "the cat sat\nthe dog ran\n\na cat ran <unk>\n",
        "valid": "the dog sat\na cat sat\n",
        "test": "the cat ran\n",
    }
    for split, text in lines.items():
        (tmp_path / f"{split}.txt").write_text(text)
    return tmp_path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny run (grammar corpus, 4 steps), one per test module."""

    from experiments.cli.main import main

    out = tmp_path_factory.mktemp("trained")
    config_file = out / "run.yaml"
    config_file.write_text(yaml.safe_dump(make_tiny_config(out, "run", trainer={"max_steps": 4})))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    return out / "run"


CPU = pytest.StashKey[dict[str, float]]()
"""CPU seconds of each fast-tier test this session ran (node id: seconds)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-fast-tier",
        action="store_true",
        help="write the CPU seconds of each fast-tier test that ran to tests/fast_tier.json",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[CPU] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[fast_tier.COLLECTION_CPU] = fast_tier.cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before ``-m`` and ``-k`` deselect any: when the whole tests folder was collected,
    the node ids of the fast tier (for tests/project/test_fast_tier.py and the record)."""
    tests = Path(__file__).resolve().parent
    from_testpaths = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    base = config.rootpath if from_testpaths else config.invocation_params.dir
    if config.args and all(Path(base, arg).resolve() == tests for arg in config.args):
        fast = [item.nodeid for item in items if item.get_closest_marker("slow") is None]
        config.stash[fast_tier.FAST_TIER] = fast


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start = fast_tier.cpu_seconds()
    yield
    if item.get_closest_marker("slow") is None:
        item.config.stash[CPU][item.nodeid] = fast_tier.cpu_seconds() - start


def _whole_fast_tier(config: pytest.Config) -> bool:
    """Whether this session ran the whole fast tier (``-m "not slow"`` over the tests
    folder, no ``-k``): the only run whose per-test CPU times compare with the record's
    (a test run alone also pays the imports an earlier test paid in the record)."""
    known = config.stash.get(fast_tier.FAST_TIER, None) is not None
    return known and config.option.markexpr == fast_tier.FAST and not config.option.keyword


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.getoption("--record-fast-tier") or exitstatus not in (0, 1):
        return  # 1: some tests failed, their CPU time still counts; others: interrupted
    whole = _whole_fast_tier(config)
    collection = config.stash.get(fast_tier.COLLECTION_CPU, None) if whole else None
    fast_tier.save(config.stash[CPU], collection, config.stash.get(fast_tier.FAST_TIER, None))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """After a whole fast-tier run, name the tests that took over twice their recorded CPU
    time (and 2 s more); a note, not a failure (tests/project/test_fast_tier.py fails on the record
    itself)."""
    if config.getoption("--record-fast-tier"):
        terminalreporter.write_line(f"fast tier: record written to {fast_tier.RECORD}")
        return
    if not _whole_fast_tier(config):
        return
    recorded = fast_tier.load()["tests"]
    over = [
        f"{node}: {cpu:.1f} s CPU (recorded {recorded[node]:.1f} s)"
        for node, cpu in config.stash[CPU].items()
        if node in recorded and cpu > 2 * recorded[node] + 2.0
    ]
    if over:
        terminalreporter.section("fast tier: slower than recorded")
        for line in over:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            'mark them slow, or re-record: python -m pytest -m "not slow" --record-fast-tier'
        )
