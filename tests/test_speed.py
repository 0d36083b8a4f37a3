"""The speed benchmarks' parts: Lightning's precision plugins, alternating timing, the
matrix-product peak (cached per precision and thread count) and the MFU column."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from experiments.cli.bench import BENCHMARKS, resolve
from experiments.comparison.tables import markdown_table
from experiments.training import speed
from experiments.training.speed import PrecisionNameError, TrainingStep, alternate, build_task


def test_speed_benchmarks_are_registered() -> None:
    for name in ("precision-speedup", "compile-speedup", "peak", "harness-throughput"):
        assert name in BENCHMARKS and callable(resolve(name))


def test_peak_is_measured_once_per_precision_and_thread_count(monkeypatch) -> None:
    calls: list[torch.dtype] = []

    def fake(dtype: torch.dtype, repeats: int = 10) -> float:
        calls.append(dtype)
        return 100.0 if dtype == torch.float32 else 400.0

    monkeypatch.setattr(speed, "matmul_gflops", fake)
    monkeypatch.setattr(speed, "_PEAKS", {})
    assert speed.peak_gflops("32-true", 1) == 100.0
    assert speed.peak_gflops("bf16-mixed", 1) == 400.0
    assert speed.peak_gflops("32-true", 1) == 100.0
    assert calls == [torch.float32, torch.bfloat16]


def test_matmul_gflops_is_a_positive_rate() -> None:
    assert speed.matmul_gflops(torch.float32, repeats=1) > 0.1


def test_alternate_reports_each_calls_median() -> None:
    counts = {"a": 0, "b": 0}

    def bump(name: str):
        return lambda: counts.__setitem__(name, counts[name] + 1)

    seconds = alternate({"a": bump("a"), "b": bump("b")}, rounds=3, warmup=2)
    assert counts == {"a": 5, "b": 5} and set(seconds) == {"a", "b"}


def test_training_step_trains_under_either_precision() -> None:
    tokens = torch.randint(0, speed.VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    for precision in ("32-true", "bf16-mixed"):
        task = build_task("transformer")
        step = TrainingStep(task, precision)
        before = task.model.decoder.weight.detach().clone()
        assert step(tokens) > 0
        assert not torch.equal(before, task.model.decoder.weight)
    with pytest.raises(PrecisionNameError, match="32-true or bf16-mixed"):
        TrainingStep(build_task("transformer"), "fp8-magic")


def test_results_table_shows_mfu_beside_tokens_per_second() -> None:
    row = {"name": "m", "seed": 0, "family": "baseline", "test_ppl": 10.0}
    table = markdown_table([{**row, "train_tokens_per_s": 1000.0, "train_mfu": 0.125}], "m")
    header = [cell.strip() for cell in table.splitlines()[0].strip("|").split("|")]
    assert header.index("train MFU") == header.index("train tokens/s") + 1
    assert "| 1000 | 12.5% |" in table and "matrix-product peak" in table


@pytest.mark.slow
def test_the_utilisation_peak_counts_cpu_time_so_a_busy_core_does_not_change_it(
    monkeypatch,
) -> None:
    """A busy process on the same core halves the wall-clock matrix-product rate but not
    the rate per second of CPU time, the peak the training's utilisation is measured
    against (a wall-clock peak measured at a busy moment gave utilisations over 100%)."""
    core = min(os.sched_getaffinity(0))  # Linux, as the project's machines
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        monkeypatch.setattr(speed, "_CPU_PEAKS", {})
        idle = speed.peak_gflops_per_cpu_second("32-true")
        busy = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass",
            ]
        )
        try:
            time.sleep(0.5)
            monkeypatch.setattr(speed, "_CPU_PEAKS", {})
            loaded = speed.peak_gflops_per_cpu_second("32-true")
            torch.set_num_threads(1)
            wall = speed.matmul_gflops(torch.float32)
        finally:
            busy.kill()
            busy.wait()
    finally:
        os.sched_setaffinity(0, before)
    assert wall < 0.75 * idle  # the competitor did take the core
    assert loaded == pytest.approx(idle, rel=0.25)
