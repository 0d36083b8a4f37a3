"""The GPU check (``benchmarks.gpu_check``, ``odelm bench gpu``) runs in its short CPU mode,
so it cannot rot before a GPU is at hand: every phase writes its JSON
record with the keys it promises and finite numbers; a phase past its budget, failing, or
lacking a package is recorded and the next one runs. ``odelm train`` with ``strategy: ddp``
(a subprocess, half a minute of imports on a loaded 2-core machine) is the slow test."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.gpu_check import PHASES, Phase, run_check, run_phase, target_records
from benchmarks.gpu_models import SHORT
from benchmarks.gpu_phases import Context
from experiments.cli import bench

EXPECTED = {
    "environment": ("torch", "cuda_available", "imports_failed", "device_name", "peak_tflops"),
    "families": ("families", "load_run"),
    "throughput": ("size", "runs", "ratios"),
    "loss_paths": ("library_path", "ms", "library_over_cross_entropy"),
    "adaptive_solve": ("nfe", "forward", "forward_backward"),
    "precision": ("losses", "final", "difference"),
    "determinism": ("default", "deterministic"),
    "compile": ("backend", "eager_ms", "compile_s", "compiled_ms"),
    "adjoint_head": ("head", "lengths", "torchdiffeq"),
    "packing": ("grid", "levels", "speedup"),
    "gpt2_small": ("size", "batch", "runs", "ratios"),
}
FAST = [phase.name for phase in PHASES if phase.name != "ddp_train"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The short mode of every phase but ``ddp_train``, into a folder."""
    out = tmp_path_factory.mktemp("gpu-check")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_check(out, short=True, phases=FAST)
    finally:
        torch.set_num_threads(threads)
    return out


def _record(out: Path, name: str) -> dict[str, Any]:
    index = [phase.name for phase in PHASES].index(name) + 1
    return json.loads((out / f"{index:02d}-{name}.json").read_text())


def _numbers(value: Any) -> list[float]:
    """Every number in a JSON value."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [number for item in value for number in _numbers(item)]
    return []


@pytest.mark.parametrize("name", FAST)
@pytest.mark.slow
def test_each_phase_writes_its_record_with_finite_numbers(short_run: Path, name: str) -> None:
    record = _record(short_run, name)
    assert record["status"] == "ok", record
    assert record["mode"] == "short" and record["device"] == "cpu"
    assert set(EXPECTED[name]) <= set(record), sorted(record)
    numbers = _numbers(record)
    assert numbers and all(math.isfinite(x) for x in numbers)
    assert record["seconds"] >= 0 and record["summary"]


@pytest.mark.slow
def test_the_measurements_are_numbers(short_run: Path) -> None:
    assert _record(short_run, "environment")["peak_tflops"]["fp32"] > 0
    runs = _record(short_run, "throughput")["runs"]
    assert set(runs) == {
        f"{m} {p}" for m in ("plain", "residual", "rk2", "rk4") for p in ("fp32", "bf16")
    }
    assert all(run["tokens_per_s"] > 0 and run["mfu"] > 0 for run in runs.values())
    ratios = _record(short_run, "throughput")["ratios"]
    assert ratios["residual/plain bf16"]["tokens_per_s"] > 0
    assert ratios["residual/plain bf16"]["peak_memory_mb"] is None  # the CPU: not measured
    losses = _record(short_run, "loss_paths")
    assert losses["library_path"] == "blocked" and losses["ms"]["cross_entropy_fp32"] > 0
    solve = _record(short_run, "adaptive_solve")
    assert (
        solve["forward"]["grid"]["nfe"]
        == solve["forward"]["dopri5"]["nfe"]
        == solve["nfe"]["dopri5"]
    )
    precision = _record(short_run, "precision")
    assert len(precision["losses"]["fp32"]) == len(precision["losses"]["bf16"]) == 30
    assert _record(short_run, "determinism")["default"]["identical"] is True


@pytest.mark.slow
def test_every_family_steps_and_generates_and_a_run_loads(short_run: Path) -> None:
    record = _record(short_run, "families")
    assert len(record["families"]) == 8
    for name, entry in record["families"].items():
        assert entry["fp32"]["finite"] is True, (name, entry)
        assert len(entry["generate"]["greedy"]) == 4 + 6, (name, entry)
        assert "finite" in entry["bf16"] or "error" in entry["bf16"]  # recorded either way
    load_run = record["load_run"]
    assert load_run["parameters_on"] == "cpu" and load_run["generate_greedy"]["text"]


@pytest.mark.slow
def test_the_summary_lists_the_phases_and_the_targets(short_run: Path) -> None:
    summary = json.loads((short_run / "summary.json").read_text())
    assert list(summary["phases"]) == FAST
    records = [bench.judge(record) for record in summary["targets"]]
    assert len(records) == 15 and all(r["value"] is None or r["value"] > 0 for r in records)
    assert all(r["target"] is None and r["met"] is None for r in records)  # the short mode
    assert {r["status"] for r in records} == {"not measured (CPU mode)"}
    results = {name: _record(short_run, name) for name in FAST}
    full = {r["metric"]: r for r in target_records(results)}
    assert all(r["target"] > 0 for r in full.values())
    unmeasured = [m for m, r in full.items() if r["value"] is None]
    assert unmeasured == [  # CUDA memory, and the packing's second level
        "residual/plain peak_memory bf16",
        "gpt2 residual/plain peak_memory",
        "adjoint peak memory max/min S 2-8 torchdiffeq",
        "adjoint peak memory max/min S 2-8 torchode",
        "packing runs/hour N=16 over N=1",  # one level in the short mode
    ]
    assert {full[m]["status"] for m in unmeasured} == {"not measured"}


def _context(tmp_path: Path, **missing: str) -> Context:
    return Context(torch.device("cpu"), SHORT, True, tmp_path, tmp_path, dict(missing))


def _sleepy(ctx: Context, record: dict[str, Any]) -> None:
    record["before"] = 1.0
    time.sleep(30)
    record["after"] = 2.0


def _failing(ctx: Context, record: dict[str, Any]) -> None:
    record["partial"] = 1.0
    raise ValueError("first line\nthe last line")


def test_a_phase_past_its_budget_keeps_what_it_measured(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    started = time.monotonic()
    record = run_phase(2, Phase("sleepy", _sleepy, 1.5), ctx, started, 60)
    assert time.monotonic() - started < 10
    assert record["status"] == "timed out" and record["before"] == 1.0 and "after" not in record
    assert json.loads((tmp_path / "02-sleepy.json").read_text())["status"] == "timed out"


def test_a_failing_or_unequipped_phase_is_recorded(tmp_path: Path) -> None:
    ctx = _context(tmp_path, torchdiffeq="ModuleNotFoundError: No module named 'torchdiffeq'")
    failed = run_phase(3, Phase("failing", _failing, 5), ctx, time.monotonic(), 60)
    assert failed["status"] == "error" and failed["partial"] == 1.0
    assert failed["error"] == "ValueError: first line\nthe last line"
    skipped = run_phase(4, Phase("needy", _failing, 5, ("torchdiffeq",)), ctx, time.monotonic(), 60)
    assert skipped["status"] == "skipped" and "torchdiffeq" in skipped["reason"]
    spent = run_phase(5, Phase("late", _failing, 5), ctx, time.monotonic() - 61, 60)
    assert spent["status"] == "timed out" and "total" in spent["reason"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["phases"]) == ["failing", "needy", "late"]


def test_without_cuda_the_full_mode_runs_only_the_environment(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    results = run_check(tmp_path, phases=["loss_paths"])
    assert results["environment"]["status"] == "ok"
    assert results["loss_paths"]["status"] == "skipped"
    assert "--short" in results["loss_paths"]["reason"]


def test_odelm_bench_hands_its_options_to_a_benchmark_that_takes_them(monkeypatch) -> None:
    seen: dict[str, Any] = {}

    def fake(out: str | None = None, short: bool = False) -> list[dict[str, Any]]:
        seen.update(out=out, short=short)
        return []

    monkeypatch.setattr(bench, "resolve", lambda name: fake)
    assert bench.run("gpu", {"out": "somewhere", "short": True}) == []
    assert seen == {"out": "somewhere", "short": True}

    def plain() -> list[dict[str, Any]]:
        return []

    monkeypatch.setattr(bench, "resolve", lambda name: plain)
    assert bench.run("other", {"out": "somewhere", "short": True}) == []
    assert "gpu" in bench.BENCHMARKS and "gpu" in bench.NOT_IN_ALL


@pytest.mark.slow
def test_odelm_train_with_ddp_runs_to_the_end_in_the_short_mode(tmp_path: Path) -> None:
    results = run_check(tmp_path, short=True, phases=["ddp_train"])
    record = results["ddp_train"]
    assert record["status"] == "ok" and record["rc"] == 0, record.get("tail")
    assert record["result_json_files"] == record["config_yaml_files"] == 1
    assert record["result"]["steps"] == 4 and math.isfinite(record["result"]["test_ppl"])
