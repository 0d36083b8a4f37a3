"""GPUs for ``odelm compare``'s runs: each local job of ``--jobs N`` gets its own
GPUs where several are visible, Ray tasks ask for ``num_gpus``, and the submitit launcher
starts one task per GPU of a multi-GPU run. Unit tests: no GPU, no Ray, no SLURM needed."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from experiments.comparison import launchers
from experiments.comparison.gpus import free_slot, job_env, run_gpus, visible_gpus
from experiments.comparison.launchers import Job, LocalLauncher, RayLauncher
from experiments.comparison.slurm import slurm_parameters


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_run_uses_gpus_by_its_accelerator_and_devices(monkeypatch) -> None:
    _gpus(monkeypatch, 0)
    assert run_gpus("cpu", 4) == 0 and run_gpus("auto", 1) == 0  # auto without CUDA: the CPU
    assert run_gpus("gpu", 1) == 1 and run_gpus("cuda", 2) == 2 and run_gpus("gpu", [0, 3]) == 2
    assert run_gpus("gpu", "auto") == 1 and run_gpus("gpu", -1) == 1 and run_gpus("gpu", "2") == 2
    _gpus(monkeypatch, 4)
    assert run_gpus("auto", 2) == 2


def test_each_local_job_gets_its_own_gpu_round_robin(monkeypatch) -> None:
    _gpus(monkeypatch, 4)
    env = {"PATH": "/bin"}
    assert [job_env(1, slot, env)["CUDA_VISIBLE_DEVICES"] for slot in range(5)] == [
        *("0", "1", "2", "3", "0"),
    ]
    assert job_env(2, 1, env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert job_env(0, 1, env) is None  # a CPU run inherits the environment
    # A launcher confined to some GPUs hands out those.
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "5,7"}) == ["5", "7"]
    assert job_env(1, 1, {"CUDA_VISIBLE_DEVICES": "5,7"})["CUDA_VISIBLE_DEVICES"] == "7"
    _gpus(monkeypatch, 1)
    assert job_env(1, 3, env) is None  # one GPU: nothing to hand out
    assert free_slot(set()) == 0 and free_slot({0, 2}) == 1 and free_slot({0, 1}) == 2


def _job(tmp_path: Path, name: str, gpus: int, code: str = "") -> Job:
    return Job(
        run=name,
        label=name,
        start_text="training",
        command=[
            sys.executable,
            "-c",
            code or "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
        ],
        log=tmp_path / f"{name}.log",
        progress=tmp_path / name / "progress.json",
        threads=1,
        cwd=str(tmp_path),
        gpus=gpus,
    )


def test_local_launcher_starts_jobs_on_separate_gpus(monkeypatch, tmp_path) -> None:
    _gpus(monkeypatch, 2)
    launcher = LocalLauncher()
    try:
        sleepy = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(3)"
        first = launcher.start(_job(tmp_path, "a", 1, sleepy))
        second = launcher.start(_job(tmp_path, "b", 1))
        second.wait(60)
        third = launcher.start(_job(tmp_path, "c", 1))  # b's slot is free again
        third.wait(60)
        first.wait(60)
    finally:
        launcher.close()
    for _ in range(50):
        if (tmp_path / "a.log").read_text():
            break
        time.sleep(0.1)
    logs = [(tmp_path / f"{name}.log").read_text().strip() for name in "abc"]
    assert logs == ["0", "1", "1"]


def test_submitit_gets_one_task_per_gpu_of_a_multi_gpu_run() -> None:
    assert slurm_parameters({}, threads=2, gpus=4) == {
        "cpus_per_task": 2,
        "gpus_per_node": 4,
        "tasks_per_node": 4,
    }
    assert slurm_parameters({}, threads=2, gpus=1) == {"cpus_per_task": 2, "gpus_per_node": 1}
    assert slurm_parameters({"gpus_per_node": 8}, threads=1, gpus=2)["gpus_per_node"] == 8
    assert slurm_parameters({}, threads=2) == {"cpus_per_task": 2}  # a CPU run: as before


def test_ray_tasks_ask_for_the_runs_gpus(tmp_path) -> None:
    asked: list[dict] = []

    class Task:
        def options(self, **kwargs):
            asked.append(kwargs)
            return SimpleNamespace(remote=lambda *args: "ref")

    ray = RayLauncher.__new__(RayLauncher)
    ray.task, ray.refs = Task(), []
    ray.start(_job(tmp_path, "gpu", 2))
    ray.start(_job(tmp_path, "cpu", 0))
    assert asked == [{"num_cpus": 1, "num_gpus": 2}, {"num_cpus": 1}]


def test_compare_jobs_record_the_runs_gpus() -> None:
    assert "gpus" in launchers.Job.__dataclass_fields__
