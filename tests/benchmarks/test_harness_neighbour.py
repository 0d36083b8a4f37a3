"""``odelm bench harness-throughput --neighbour``: the neighbour process it starts, the
conditions it reports, and the threads of the library's step against the plain loop's."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from benchmarks import harness
from benchmarks import neighbour as neighbour_module
from experiments.cli.bench import bench_parser, run
from experiments.training.speed import SPEED_MODELS, batches

TINY_LSTM = {**SPEED_MODELS["lstm"], "embed_dim": 8, "hidden_dim": 8}
"""The benchmark's LSTM at width 8: its loops, cheaply."""


def _fake_ratio(name, data, folder, rounds):
    return {
        "bench": "harness-throughput",
        "metric": f"tokens_per_s_library_over_plain {name}",
        "value": 1.0,
        "target": harness.TARGET,
        "unit": "x",
        "better": "higher",
        "library_ms_per_step": 1.0,
        "plain_ms_per_step": 1.0,
        "cpu_ratio": 1.0,
        "running": list(events),
    }


events: list[str] = []


@contextmanager
def _fake_neighbour():
    events.append("started")
    try:
        yield
    finally:
        events.append("ended")


def test_the_neighbour_mode_measures_both_models_idle_then_beside_it(monkeypatch) -> None:
    events.clear()
    monkeypatch.setattr(harness, "_ratio", _fake_ratio)
    monkeypatch.setitem(harness.CONDITIONS, " beside a neighbour", _fake_neighbour)
    records = run("harness-throughput", {"neighbour": True})
    assert [r["metric"] for r in records] == [
        "tokens_per_s_library_over_plain lstm",
        "tokens_per_s_library_over_plain transformer",
        "tokens_per_s_library_over_plain lstm beside a neighbour",
        "tokens_per_s_library_over_plain transformer beside a neighbour",
    ]
    assert [r["running"] for r in records] == [[], [], ["started"], ["started"]]
    assert events == ["started", "ended"]  # one neighbour for both models, ended after them
    assert all(r["target"] == 0.95 and r["met"] for r in records)
    events.clear()
    assert len(run("harness-throughput", {})) == 2 and events == []  # idle only by default
    assert bench_parser().parse_args(["harness-throughput", "--neighbour"]).neighbour is True


def test_both_sides_report_wall_and_cpu_seconds_per_step(monkeypatch) -> None:
    monkeypatch.setitem(SPEED_MODELS, "lstm", TINY_LSTM)
    steps = harness.plain_steps("lstm", batches(3))()
    assert len(steps) == 2  # the first step (warming up) left out
    for wall, cpu in steps:
        assert 0 < cpu <= wall * 1.05 + 1e-3  # one thread: no more CPU than wall time


def test_the_neighbour_stops_by_itself_past_its_limit_or_without_its_parent(capsys) -> None:
    neighbour_module.train(limit_s=0.0, parent=os.getppid())
    neighbour_module.train(limit_s=60.0, parent=-1)  # not its parent: it ends at once
    assert capsys.readouterr().out == ""  # no step taken in either


class _Threads(harness.StepClock):
    """Also records torch's thread count and the process's OS threads at each batch start."""

    seen: ClassVar[list[tuple[int, frozenset[str]]]] = []

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, task, batch, batch_idx)
        _Threads.seen.append((torch.get_num_threads(), frozenset(os.listdir("/proc/self/task"))))


@pytest.mark.slow  # two Lightning fits, about a second each
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_library_step_runs_on_the_plain_loops_threads_and_starts_none(
    monkeypatch, tmp_path, threads
) -> None:
    monkeypatch.setitem(SPEED_MODELS, "lstm", TINY_LSTM)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _Threads.seen = []
        monkeypatch.setattr(harness, "StepClock", _Threads)
        steps = harness.library_steps("lstm", batches(4), tmp_path)()
    finally:
        torch.set_num_threads(before)
    assert len(steps) == 2
    counts = {count for count, _ in _Threads.seen}
    assert counts == {threads}  # the threads the caller (and the plain loop) computes on
    first = _Threads.seen[1][1]  # after the first step: Lightning's and its loggers' own
    assert all(tasks == first for _, tasks in _Threads.seen[1:])  # no thread per step


@pytest.mark.slow  # starts a Python process that imports torch
def test_the_neighbour_trains_on_one_thread_and_is_killed_even_on_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside"), neighbour_module.neighbour() as process:
        assert process.poll() is None
        assert len(os.listdir(f"/proc/{process.pid}/task")) == 1
        raise RuntimeError("inside")
    assert process.poll() is not None


def test_the_record_pairs_each_round_and_holds_the_cpu_ratio(monkeypatch, tmp_path) -> None:
    walls = iter([0.3, 0.2, 0.1, 0.4, 0.2, 0.2, 0.1, 0.2])  # L P, P L, L P, P L

    def side(cpu):
        return lambda *args: lambda: [(next(walls), cpu)] * 2

    monkeypatch.setattr(harness, "library_steps", side(0.125))
    monkeypatch.setattr(harness, "plain_steps", side(0.1))
    record = harness._ratio("lstm", batches(1), tmp_path, rounds=3)
    assert record["round_ratios"] == [0.25, 1.0, 0.5]  # round 0 (0.3, 0.2) not counted
    assert record["value"] == pytest.approx(0.1 / 0.2)  # medians: plain 0.1, library 0.2
    assert record["cpu_ratio"] == pytest.approx(0.8)
