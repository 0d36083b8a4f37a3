"""The speed benchmarks' parts: Lightning's precision plugins, alternating timing, the
matrix-product peak (cached per precision and thread count) and the MFU column."""

from __future__ import annotations

import os
import statistics
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
    idle, loaded, wall = [], [], []  # three rounds, each idle then busy: medians compared,
    os.sched_setaffinity(0, {core})  # so one disturbed measurement cannot decide
    try:
        for _ in range(3):
            monkeypatch.setattr(speed, "_CPU_PEAKS", {})
            idle.append(speed.peak_gflops_per_cpu_second("32-true"))
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
                loaded.append(speed.peak_gflops_per_cpu_second("32-true"))
                torch.set_num_threads(1)
                wall.append(speed.matmul_gflops(torch.float32))
            finally:
                busy.kill()
                busy.wait()
    finally:
        os.sched_setaffinity(0, before)
    assert statistics.median(wall) < 0.75 * statistics.median(idle)  # the core was taken
    assert statistics.median(loaded) == pytest.approx(statistics.median(idle), rel=0.25)


class _FakeCudaEvent:
    """A CUDA timing event on the CPU: its time is the order it was recorded in, in seconds;
    ``synchronize`` calls are counted."""

    recorded = 0
    synchronized = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = 0

    def record(self) -> None:
        _FakeCudaEvent.recorded += 1
        self.at = _FakeCudaEvent.recorded

    def synchronize(self) -> None:
        _FakeCudaEvent.synchronized += 1

    def elapsed_time(self, end: _FakeCudaEvent) -> float:
        return 1000.0 * (end.at - self.at)  # milliseconds


def _meter_run(device_type: str, steps: int = 3) -> tuple[object, dict[str, list[float]]]:
    """A ``ThroughputMeter`` through ``steps`` training steps of 2 x 5 tokens on a device of
    ``device_type``, logging every other step; its log."""
    from types import SimpleNamespace

    from experiments.training.throughput import ThroughputMeter

    logs: dict[str, list[float]] = {}
    device = torch.device(device_type)
    trainer = SimpleNamespace(
        world_size=1,
        global_step=0,
        log_every_n_steps=2,
        precision="32-true",
        strategy=SimpleNamespace(root_device=device),
    )
    task = SimpleNamespace(
        device=device, log=lambda key, value: logs.setdefault(key, []).append(value)
    )
    meter = ThroughputMeter()
    meter.setup(trainer, task, "fit")
    meter.on_train_start(trainer, task)
    meter.flops_per_token = 10.0
    batch = torch.zeros(2, 5, dtype=torch.long)
    for step in range(steps):
        trainer.global_step = step
        meter.on_train_batch_start(trainer, task, batch, step)
        meter.on_train_batch_end(trainer, task, None, batch, step)
    meter.on_train_end(trainer, task)
    return meter, logs


def test_cuda_steps_are_timed_with_cuda_events_and_cpu_steps_with_host_clocks(
    monkeypatch,
) -> None:
    """On CUDA each step is timed between CUDA events (kernels run asynchronously), read with
    one synchronisation per logged step and none on the others; on the CPU no event is made
    and the step is timed on the host as before."""
    from experiments.training import throughput

    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(_FakeCudaEvent, "recorded", 0)
    monkeypatch.setattr(_FakeCudaEvent, "synchronized", 0)
    peaks: list[str] = []
    monkeypatch.setattr(
        throughput,
        "training_peak_gflops",
        lambda precision, device: peaks.append(device.type) or 1.0,
    )
    meter, logs = _meter_run("cuda")
    assert (_FakeCudaEvent.recorded, _FakeCudaEvent.synchronized) == (6, 2)  # logged: steps 0, 2
    assert meter.seconds == 3.0 and meter.tokens == 24 and meter.tokens_per_second == 8.0
    assert logs["train/tokens_per_s"] == [8.0, 8.0]
    assert meter.utilisation() == pytest.approx(3 * 10.0 * 24 / 3.0 / 1e9)  # GPU seconds
    assert peaks == ["cuda"] and _FakeCudaEvent.synchronized == 2
    meter, logs = _meter_run("cpu")
    assert _FakeCudaEvent.recorded == 6 and peaks == ["cuda", "cpu"]
    assert 0 < meter.seconds < 1 and meter.utilisation() == pytest.approx(
        3 * 10.0 * 24 / meter.cpu_seconds / 1e9
    )


def test_the_mfu_peak_is_the_gpus_measured_peak_on_cuda_and_the_cpus_on_the_cpu(
    monkeypatch,
) -> None:
    import benchmarks.training_speed as bench

    gpu = {torch.float32: 5e4, torch.bfloat16: 7e5}
    measure = speed.cuda_matmul_gflops
    measured: list[torch.dtype] = []

    def cuda_gflops(dtype: torch.dtype, device: object = "cuda") -> float:
        measured.append(dtype)
        return gpu[dtype]

    monkeypatch.setattr(speed, "peak_gflops_per_cpu_second", lambda precision: 10.0)
    monkeypatch.setattr(speed, "cuda_matmul_gflops", cuda_gflops)
    monkeypatch.setattr(speed, "_CUDA_PEAKS", {})
    cuda = torch.device("cuda", 0)
    assert speed.training_peak_gflops("32-true", torch.device("cpu")) == 10.0 and not measured
    assert speed.training_peak_gflops("bf16-mixed", cuda) == 7e5
    assert speed.training_peak_gflops("bf16-true", cuda) == 7e5  # measured once
    assert speed.training_peak_gflops("32-true", cuda) == 5e4
    assert measured == [torch.bfloat16, torch.float32]
    assert speed.training_peak_gflops("32-true", torch.device("meta")) is None
    # the measurement: CUDA events around each product after a synchronised warm-up
    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    synced: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    assert measure(torch.float32, "cpu", n=4, repeats=2) == 2 * 4**3 / 1e9
    assert synced == ["cpu"]
    # ``odelm bench peak``: the GPU's fp32 and bf16 peaks beside the CPU's where CUDA is
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, repeats=3: 1.0)
    monkeypatch.setattr(bench, "cuda_matmul_gflops", cuda_gflops)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert all("cuda" not in record["metric"] for record in bench.peak())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_records = [record for record in bench.peak() if "cuda" in record["metric"]]
    assert {(r["metric"], r["value"], r["device"]) for r in gpu_records} == {
        ("matmul_gflops fp32 cuda", 5e4, "Fake GPU"),
        ("matmul_gflops bf16 cuda", 7e5, "Fake GPU"),
    }
