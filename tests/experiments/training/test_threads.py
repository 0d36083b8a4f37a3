"""The thread policy: free physical cores divided among the runs, never oversubscribed."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from experiments.cli.main import main
from experiments.training import threads
from experiments.training.threads import available_cores, default_threads, set_threads
from tests.support.paths import ROOT


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A fake machine: ``machine(usable, total, load, cores_of=None, quota=None)``."""

    def build(
        usable: int,
        total: int,
        load: float = 0.0,
        cores_of: list[int] | None = None,
        quota: str | None = None,
    ) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(usable)))
        monkeypatch.setattr(os, "cpu_count", lambda: total)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        sysfs = tmp_path / "cpu"
        for cpu in range(usable):
            topology = sysfs / f"cpu{cpu}" / "topology"
            topology.mkdir(parents=True, exist_ok=True)
            (topology / "physical_package_id").write_text("0\n")
            (topology / "core_id").write_text(f"{(cores_of or list(range(usable)))[cpu]}\n")
        monkeypatch.setattr(threads, "CPU_SYSFS", sysfs)
        cpu_max = tmp_path / "cpu.max"
        if quota is not None:
            cpu_max.write_text(quota + "\n")
        monkeypatch.setattr(threads, "CGROUP_CPU_MAX", cpu_max)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    return build


def test_an_idle_machine_divides_its_cores_among_the_runs(machine) -> None:
    machine(usable=4, total=4)
    assert available_cores() == 4
    assert [default_threads(runs) for runs in (1, 2, 3, 4, 8)] == [4, 2, 1, 1, 1]


def test_a_busy_machine_leaves_one_thread_per_run(machine) -> None:
    machine(usable=2, total=2, load=6.1)  # a 2-core machine under other work
    assert default_threads() == 1
    machine(usable=2, total=2, load=0.9)  # one other busy process: one core left
    assert default_threads() == 1
    machine(usable=2, total=2, load=0.3)
    assert default_threads() == 2


def test_load_counts_in_proportion_to_the_cpus_this_process_may_use(machine) -> None:
    machine(usable=2, total=64, load=10.0)  # 10 busy CPUs of 64: 0.31 of our 2
    assert default_threads() == 2
    machine(usable=2, total=64, load=40.0)  # 1.25 of our 2
    assert default_threads() == 1


def test_hyperthreads_count_once_and_a_cgroup_quota_caps(machine) -> None:
    machine(usable=8, total=8, cores_of=[0, 0, 1, 1, 2, 2, 3, 3])
    assert available_cores() == 4 and default_threads() == 4
    machine(usable=8, total=8, quota="150000 100000")  # 1.5 CPUs' worth
    assert available_cores() == 2 and default_threads() == 2
    machine(usable=8, total=8, quota="max 100000")
    assert available_cores() == 8


def test_omp_num_threads_caps_but_never_raises_the_default(machine, monkeypatch) -> None:
    machine(usable=4, total=4)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    assert default_threads() == 4


def test_set_threads_says_its_choice_once_and_obeys_an_explicit_count(machine, capsys) -> None:
    machine(usable=2, total=2)
    assert set_threads(None) == 2 and torch.get_num_threads() == 2
    captured = capsys.readouterr()
    assert captured.err == "threads: 2 (of 2 cores; --num-threads to change)\n"
    assert captured.out == ""
    assert set_threads(1) == 1 and torch.get_num_threads() == 1
    assert capsys.readouterr().err == ""


def test_train_and_compare_hand_the_policy_to_their_runs(
    machine, monkeypatch, capsys, tmp_path
) -> None:
    import experiments.comparison.compare
    import experiments.training.train

    machine(usable=2, total=2, load=5.0)
    seen = {}

    class Stop(Exception):
        pass

    def fit_run(config, data, callbacks):  # the threads are set before fit, and recorded
        seen["train"] = config  # by the run's RunFiles when fit sets up
        files = next(c for c in callbacks if isinstance(c, experiments.training.train.RunFiles))
        files.setup(SimpleNamespace(is_global_zero=True), None, "fit")
        raise Stop

    monkeypatch.setattr(experiments.training.train, "fit_run", fit_run)
    example = str(ROOT / "experiments" / "configs" / "example.yaml")
    with pytest.raises(Stop):
        main(["train", "--config", example, "--out_dir", str(tmp_path / "runs")])
    assert seen["train"].trainer.num_threads == 1
    recorded = yaml.safe_load((tmp_path / "runs" / "example" / "config.yaml").read_text())
    assert recorded["trainer"]["num_threads"] == 1

    def run_grid(grid, out, shared, num_seeds=None, launch=None):
        seen["compare"] = shared
        Path(out).mkdir(exist_ok=True)
        (Path(out) / "results.md").write_text("")
        return []

    monkeypatch.setattr(experiments.comparison.compare, "run_grid", run_grid)
    out = capsys.readouterr().err
    assert out.count("threads: 1 (of 2 cores; --num-threads to change)") == 1
    machine(usable=2, total=2, load=0.0)
    assert main(["compare", "--preset", "quick", "--out", str(tmp_path / "a")]) == 0
    assert seen["compare"]["trainer"]["num_threads"] == 2  # every run it starts gets 2
    assert capsys.readouterr().err.count("threads: 2 (of 2 cores") == 1
    argv = ["compare", "--preset", "quick", "--out", str(tmp_path / "b"), "--num-threads", "1"]
    assert main(argv) == 0
    assert seen["compare"]["trainer"]["num_threads"] == 1
    assert "threads:" not in capsys.readouterr().err
