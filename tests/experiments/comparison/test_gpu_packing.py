"""A study packed on one GPU: ``odelm compare --jobs N`` starts a local GPU job only
when its device has the memory the run needs (``experiments.comparison.gpus.MemoryGate``),
with ``torch.cuda`` monkeypatched to a device of a given size: how many runs fit at once,
waiting while a run is in flight, refusing in one line a run larger than the device or one
kept waiting by memory other processes hold. Then the packing benchmark's arithmetic (runs
per hour, a grid's predicted wall time) and, slow, its short mode on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import gpu_packing
from experiments.comparison import gpus, launchers
from experiments.comparison.gpus import GPUMemoryError, MemoryGate, fitting_runs, run_memory_mb
from experiments.comparison.launchers import Job, Launch, run_jobs
from tests.support.paths import ROOT

GIB = 2**30
STUDY_MODEL = {"family": "ode_transformer", "d_model": 200, "n_heads": 2, "d_ff": 200,
               "max_positions": 64, "n_layers": 4, "block": "residual"}  # fmt: skip


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """One visible fake GPU of 80 GiB; set ``free`` (bytes) to what other processes leave."""
    memory = {"free": 80 * GIB, "total": 80 * GIB, "calls": 0}

    def mem_get_info(index: Any = 0) -> tuple[float, float]:
        assert index in (0, torch.device("cuda"))
        memory["calls"] += 1
        return memory["free"], memory["total"]

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    return memory


def _job(name: str, memory_mb: float, gpus: int = 1) -> Job:
    return Job(name, f"[{name}]", "training", ["true"], Path("log"), Path("progress"), 1, ".",
               gpus=gpus, memory_mb=memory_mb)  # fmt: skip


def _running(*jobs: Job) -> dict[str, tuple[Job, Any, float]]:
    return {job.run: (job, None, 0.0) for job in jobs}


def test_as_many_runs_start_as_the_device_holds(device: dict[str, float]) -> None:
    gate, running = MemoryGate(), {}
    for index in range(12):
        job = _job(f"run{index}", 10 * 1024)
        if not gate.ready(job, running):
            break
        running |= _running(job)
    assert len(running) == 8 == fitting_runs(10 * 1024, 80 * 1024)  # 8 x 10 GiB in 80 GiB
    device["free"] = 75 * GIB  # the 8 runs hold little yet: their estimates stay reserved
    assert gate.ready(_job("late", 10 * 1024), running) is False


def test_a_job_waits_while_a_run_is_in_flight_and_starts_when_it_ends(
    device: dict[str, float],
) -> None:
    gate, first = MemoryGate(wait_s=5), _job("first", 60 * 1024)
    assert gate.ready(first, {})
    device["free"] = 20 * GIB
    second = _job("second", 30 * 1024)
    assert gate.ready(second, _running(first), clock=0.0) is False
    assert gate.ready(second, _running(first), clock=1e6) is False  # waits: first will end
    device["free"] = 80 * GIB
    assert gate.ready(second, {}, clock=1e6 + 1) is True


def test_a_run_larger_than_the_device_or_kept_waiting_by_others_is_refused(
    device: dict[str, float],
) -> None:
    with pytest.raises(GPUMemoryError, match=r"needs about 102400 MiB but GPU 0 has 81920 MiB"):
        MemoryGate("local", [_job("small", 1024), _job("huge", 100 * 1024)])  # before any start
    device["free"] = 4 * GIB  # another user's process holds the rest
    gate, job = MemoryGate(wait_s=600), _job("run", 10 * 1024)
    assert gate.ready(job, {}, clock=0.0) is False
    assert gate.ready(job, {}, clock=599.0) is False
    with pytest.raises(GPUMemoryError) as refused:
        gate.ready(job, {}, clock=601.0)
    assert "\n" not in str(refused.value) and "lower --jobs" in str(refused.value)


def test_cpu_jobs_remote_launchers_and_machines_without_cuda_pass_unchecked(
    device: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert MemoryGate().ready(_job("cpu", 10**9, gpus=0), {})
    assert MemoryGate("ray").ready(_job("gpu", 10**9), {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert MemoryGate().ready(_job("gpu", 10**9), {})
    assert device["calls"] == 0


def test_run_jobs_keeps_in_flight_only_what_fits(
    device: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``odelm compare --jobs 8`` of six 30 GiB runs on an 80 GiB device: two at a time."""
    flights: list[int] = []

    class Launcher:
        def __init__(self) -> None:
            self.live: dict[str, int] = {}

        def start(self, job: Job) -> str:
            self.live[job.run] = 2  # polls until it ends
            flights.append(len(self.live))
            return job.run

        def outcome(self, run: str) -> tuple[int, str] | None:
            self.live[run] -= 1
            if self.live[run]:
                return None
            del self.live[run]
            return 0, "exit 0"

        def close(self) -> None:
            pass

    monkeypatch.setattr(launchers, "make_launcher", lambda *args: Launcher())
    monkeypatch.setattr(launchers, "POLL_S", 0.0)
    done: list[str] = []
    jobs = [_job(f"run{index}", 30 * 1024) for index in range(6)]
    run_jobs(jobs, Launch(jobs=8), Path("."), lambda job, *rest: done.append(job.run))
    assert sorted(done) == sorted(job.run for job in jobs) and max(flights) == 2


def test_the_packing_benchmark_says_how_many_runs_fit(device: dict[str, float]) -> None:
    values = {"model": STUDY_MODEL, "data": {"batch_size": 20, "bptt": 35}}
    fit = gpu_packing.runs_that_fit([values], torch.device("cuda"))
    assert fit["runs"] == int(80 * 1024 // run_memory_mb(STUDY_MODEL, 20, 35)) > 16
    assert gpu_packing.runs_that_fit([values], torch.device("cpu"))["runs"] is None


def test_a_run_estimate_counts_its_context_weights_and_activations() -> None:
    small, large = run_memory_mb(STUDY_MODEL, 20, 35), run_memory_mb(STUDY_MODEL, 40, 35)
    assert gpus.CONTEXT_MB < small < 2048 and large > small
    deeper = run_memory_mb({**STUDY_MODEL, "n_layers": 8}, 20, 35)
    assert deeper > small


def test_runs_per_hour() -> None:
    reports = [{"steps": 100, "seconds": 10.0, "startup_s": 20.0}] * 2  # 10 steps/s each
    assert gpu_packing.runs_per_hour(reports, [1000, 1000]) == pytest.approx(2 * 3600 / 120)
    assert gpu_packing.runs_per_hour([{"error": "worker exit 1"}], [1000]) is None
    assert gpu_packing.runs_per_hour(reports, [None, 1000]) is None
    assert gpu_packing.run_steps({"trainer": {"max_steps": 8000}}, None) == 8000
    assert gpu_packing.run_steps({"trainer": {"max_epochs": 20}}, 95) == 1900
    assert gpu_packing.run_steps({"trainer": {"max_epochs": 20}}, None) is None


@pytest.mark.slow  # expands a grid of 86 runs: the full suite runs it
def test_a_grids_predicted_wall_time() -> None:
    predicted = gpu_packing.predict_grid_hours("study2-continuous", 43.0)
    # 9 models x 5 seeds, 5 seed-noise runs, 4 learning rates x 9 models tuned at seed 0
    assert predicted["runs"] == 9 * 5 + 5 + 4 * 9 and predicted["hours"] == pytest.approx(2.0)


@pytest.mark.slow
def test_the_packing_benchmark_runs_workers_side_by_side_in_the_short_mode(
    tmp_path: Path,
) -> None:
    records = gpu_packing.gpu_packing(str(tmp_path), short=True)
    rates = {r["metric"]: r["value"] for r in records}
    grid = gpu_packing.SHORT_GRID
    assert rates[f"{grid} runs_per_hour N=1"] > 0  # one worker, started as on a GPU
    assert rates[f"{grid} runs_per_hour N=16 over N=1"] is None  # one level here
    assert all(r["target"] is None for r in records)  # the short mode claims nothing
    saved = json.loads((tmp_path / "packing.json").read_text())[grid]
    assert saved["levels"]["1"]["workers"][0]["steps"] > 0
    assert saved["speedup_basis"] == "not measured: one level"


def test_the_speedup_counts_runs_or_else_training_steps() -> None:
    levels = [{"runs_per_hour": 10.0, "steps_per_hour": 1e4},
              {"runs_per_hour": 70.0, "steps_per_hour": 8e4}]  # fmt: skip
    assert gpu_packing.speedup(levels) == (7.0, "runs")
    unknown = [{**level, "runs_per_hour": None} for level in levels]  # no corpus here
    assert gpu_packing.speedup(unknown) == (8.0, "training steps")
    assert gpu_packing.speedup([{**levels[0], "steps_per_hour": None}] * 2)[0] == 1.0
    assert gpu_packing.speedup([{"runs_per_hour": None, "steps_per_hour": None}] * 2)[0] is None
    assert gpu_packing.speedup(levels[:1]) == (None, "not measured: one level")
    reports = [{"steps": 50, "seconds": 10.0}, {"steps": 30, "seconds": 10.0}]
    assert gpu_packing.steps_per_hour(reports) == pytest.approx(3600 * 8)
    assert gpu_packing.steps_per_hour([{"error": "worker exit 1"}]) is None


@pytest.mark.slow
def test_a_failing_worker_is_reported_with_its_last_line() -> None:
    values = {"model": {"family": "ode_transformer", "d_model": 6, "n_heads": 4}, "seed": 0}
    job = gpu_packing.worker_job(values, 50, "cpu", 0.1, short=False) | {"harness": False}
    report = gpu_packing.run_level([job], ROOT)
    assert report[0]["error"].startswith("worker exit 1: ")
    assert "d_model=6 is not divisible by n_heads=4" in report[0]["error"]
