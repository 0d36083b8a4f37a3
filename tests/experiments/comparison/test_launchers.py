"""odelm compare's launchers: a local process pool (--jobs), submitit (its local
executor here) and Ray give the sequential run's results, resume the same way, and report a
failed run with its log while the others finish."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml

from experiments.cli.main import main
from experiments.comparison import launchers
from experiments.comparison.launchers import (
    Job,
    Launch,
    LauncherError,
    launch_settings,
    run_jobs,
)
from experiments.comparison.slurm import slurm_parameters, time_minutes
from experiments.training.progress import ProgressBoard
from tests.support.paths import ROOT

QUICK = ROOT / "experiments" / "configs" / "grids" / "quick.yaml"
TINY = ["--max-steps", "20", "--trainer.val_every", "10", "--num-threads", "1"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """The quick preset with two of its runs (a Transformer and an LSTM), short BLEU."""
    values = yaml.safe_load(QUICK.read_text())
    values["runs"] = [run for run in values["runs"] if run["name"] in ("residual", "lstm")]
    values["shared"]["eval"] = {"bleu_sentences": 5, "continuation_sentences": 3}
    path = tmp_path_factory.mktemp("grid") / "quick2.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def results(out: Path) -> dict[str, tuple[float, float, str]]:
    """Each run's test and valid perplexity and config hash, as results.csv and result.json say."""
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return {
        row["run"]: (
            float(row["test_ppl"]),
            float(row["valid_ppl"]),
            json.loads((out / "runs" / row["run"] / "result.json").read_text())["config_sha256"],
        )
        for row in rows
    }


@pytest.fixture(scope="module")
def sequential(grid, tmp_path_factory) -> dict[str, tuple[float, float, str]]:
    out = tmp_path_factory.mktemp("sequential") / "out"
    assert main(["compare", "--grid", str(grid), "--out", str(out), "--jobs", "1", *TINY]) == 0
    found = results(out)
    assert set(found) == {"residual", "lstm"} and all(ppl > 1 for ppl, _, _ in found.values())
    return found


@pytest.mark.slow
def test_two_jobs_give_the_sequential_results_and_resume_the_same_way(
    grid, sequential, tmp_path, capsys
):
    out = tmp_path / "out"
    assert main(["compare", "--grid", str(grid), "--out", str(out), "--jobs", "2", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "(local, up to 2 at once)" in printed and "2 trained, 0 kept, 0 failed" in printed
    assert results(out) == sequential  # identical to the last digit, identity unchanged
    kept = out / "runs" / "residual" / "result.json"
    stamp = kept.stat().st_mtime_ns
    (out / "runs" / "lstm" / "result.json").unlink()  # a half-finished grid
    assert main(["compare", "--grid", str(grid), "--out", str(out), "--jobs", "2", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "[1/2] residual seed 0: skipped (finished)" in printed
    assert "[2/2] lstm seed 0: trained and tested in" in printed
    assert "1 trained, 1 kept, 0 failed of 2 runs" in printed
    assert kept.stat().st_mtime_ns == stamp
    assert results(out) == sequential


@pytest.mark.slow
def test_submitit_local_executor_gives_the_sequential_results(grid, sequential, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["compare", "--grid", str(grid), "--out", str(out), "--launcher", "submitit", *TINY]
    assert main(argv) == 0
    assert "(submitit, up to 2 at once)" in capsys.readouterr().out
    assert results(out) == sequential
    assert list((out / "submitit").glob("*/*_submitted.pkl"))  # submitit's own job files
    assert main(argv) == 0  # resumed: both runs kept, nothing submitted
    assert "0 trained, 2 kept, 0 failed" in capsys.readouterr().out


@pytest.mark.slow
def test_ray_with_two_cpus_gives_the_sequential_results(grid, sequential, tmp_path, capsys):
    import ray  # the test extra installs it

    seen = {}
    init = ray.init

    def counting_init(*args, **kwargs):
        seen.update(kwargs)
        return init(*args, **kwargs)

    out = tmp_path / "out"
    argv = ["compare", "--grid", str(grid), "--out", str(out), "--launcher", "ray", "--jobs", "2"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "init", counting_init)
        assert main([*argv, *TINY]) == 0
    assert seen["num_cpus"] == 2 and not ray.is_initialized()  # 2 runs x 1 thread; shut down
    assert "(ray, up to 2 at once)" in capsys.readouterr().out
    assert results(out) == sequential


def fake_job(tmp_path: Path, name: str, code: str, threads: int = 1) -> Job:
    """A job running ``python -c CODE`` in place of ``odelm train``."""
    return Job(
        run=name,
        label=f"[{name}]",
        start_text="training",
        command=[sys.executable, "-c", code],
        log=tmp_path / "logs" / f"{name}.log",
        progress=tmp_path / "runs" / name / "logs" / "progress.json",
        threads=threads,
        cwd=str(tmp_path),
    )


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", "submitit"])
def test_a_failed_job_is_reported_and_the_others_finish(launcher, tmp_path, capsys):
    jobs = [
        fake_job(tmp_path, "bad", "import sys; print('loss is nan at step 3'); sys.exit(3)"),
        fake_job(tmp_path, "good", "import time; time.sleep(1.5); print('done')"),
    ]
    ended = {}
    run_jobs(
        jobs,
        Launch(launcher, jobs=2),
        tmp_path / "submitit",
        lambda job, status, detail, seconds: ended.update({job.run: (status, detail)}),
        ProgressBoard(every=3600),
    )
    assert ended["bad"][0] == 3 and ended["bad"][1].startswith("exit 3")
    assert ended["good"][0] == 0
    assert "loss is nan at step 3" in (tmp_path / "logs" / "bad.log").read_text()
    assert (tmp_path / "logs" / "good.log").read_text() == "done\n"
    assert capsys.readouterr().out.splitlines()[:2] == ["[bad]: training", "[good]: training"]


@pytest.mark.slow
def test_jobs_bound_how_many_run_at_once(tmp_path):
    code = (
        "import os, pathlib, time; p = pathlib.Path('running'); p.mkdir(exist_ok=True);"
        "me = p / str(os.getpid()); me.touch(); n = len(list(p.iterdir())); time.sleep(0.5);"
        "me.unlink(); print(n)"
    )
    jobs = [fake_job(tmp_path, f"r{i}", code) for i in range(3)]
    run_jobs(jobs, Launch("local", jobs=1), tmp_path, lambda *done: None, ProgressBoard(every=3600))
    assert [(tmp_path / "logs" / f"r{i}.log").read_text() for i in range(3)] == ["1\n"] * 3


def test_slurm_options_pass_through_under_submitits_names():
    given = {"slurm_partition": "gpu", "timeout_min": "1-02:30:00", "cpus_per_task": 4}
    given |= {"gpus_per_node": 1, "mem_gb": 16, "slurm_qos": "high", "nodes": 1}
    assert slurm_parameters(given, threads=2) == {
        "cpus_per_task": 4,
        "slurm_partition": "gpu",
        "timeout_min": 1590,  # H:MM:SS is also taken, as minutes
        "gpus_per_node": 1,
        "mem_gb": 16,
        "slurm_qos": "high",
        "nodes": 1,
    }
    assert slurm_parameters({}, threads=2) == {"cpus_per_task": 2}  # the run's threads
    assert [time_minutes(v) for v in (90, "90", "4:00:00", "0:30", "0:00:30")] == [
        90,
        90,
        240,
        30,
        1,
    ]
    renamed = r"^slurm option 'partition' is submitit's 'slurm_partition' now: write --slurm"
    with pytest.raises(LauncherError, match=renamed):
        slurm_parameters({"partition": "gpu"}, threads=1)
    with pytest.raises(LauncherError, match="^slurm option 'mem' is submitit's 'mem_gb' now"):
        slurm_parameters({"mem": 16}, threads=1)
    unknown = r"^unknown slurm option 'queue': submitit takes cpus_per_task, gpus_per_node"
    with pytest.raises(LauncherError, match=unknown):
        slurm_parameters({"queue": "gpu"}, threads=1)
    with pytest.raises(LauncherError, match="unknown slurm option 'slurm_queue'"):
        slurm_parameters({"slurm_queue": "gpu"}, threads=1)
    with pytest.raises(LauncherError, match="^slurm option 'name' is not yours to set"):
        slurm_parameters({"name": "x"}, threads=1)
    with pytest.raises(LauncherError, match="slurm timeout_min must be minutes or H:MM:SS"):
        time_minutes("4 hours")
    with pytest.raises(LauncherError, match="^slurm mem_gb must be a number >= 0, got '16G'$"):
        slurm_parameters({"mem_gb": "16G"}, threads=1)
    with pytest.raises(LauncherError, match="^slurm nodes must be a whole number >= 0"):
        slurm_parameters({"nodes": 1.5}, threads=1)


def test_launch_settings_defaults_and_errors(monkeypatch):
    monkeypatch.setattr(launchers, "available_cores", lambda: 8)
    monkeypatch.setattr(launchers, "busy_cores", lambda cores: 2.0)
    assert launch_settings({}, runs=7, threads=None, grid_slurm={}).jobs == 1  # all free cores
    assert launch_settings({}, runs=7, threads=2, grid_slurm={}).jobs == 3  # 6 free / 2
    assert launch_settings({}, runs=2, threads=1, grid_slurm={}).jobs == 2  # at most the runs
    ray = launch_settings({"launcher": "ray"}, runs=7, threads=1, grid_slurm={})
    assert ray.jobs == 7  # Ray's scheduler queues them
    merged = launch_settings(
        {"launcher": "submitit", "slurm": {"timeout_min": "1:00:00"}},
        runs=2,
        threads=1,
        grid_slurm={"slurm_partition": "cpu", "timeout_min": 30},
    )
    expected = {"slurm_partition": "cpu", "timeout_min": "1:00:00"}
    assert merged.slurm == expected  # the command line wins
    with pytest.raises(LauncherError, match="--ray-address needs --launcher ray"):
        launch_settings({"ray_address": "ray://head:10001"}, runs=1, threads=1, grid_slurm={})
    with pytest.raises(LauncherError, match="--slurm.slurm_partition needs --launcher submitit"):
        launch_settings({"slurm": {"slurm_partition": "gpu"}}, runs=1, threads=1, grid_slurm={})
    with pytest.raises(LauncherError, match="--jobs must be at least 1"):
        launch_settings({"jobs": 0}, runs=1, threads=1, grid_slurm={})


@pytest.mark.slow
def test_cli_launch_errors_are_one_line(tmp_path, capsys):
    out = str(tmp_path / "out")
    argv = ["compare", "--preset", "quick", "--out", out, "--slurm.slurm_partition", "gpu"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "odelm: error: --slurm.slurm_partition needs --launcher submitit\n"
    )
    grid = tmp_path / "grid.yaml"
    values = yaml.safe_load(QUICK.read_text())
    grid.write_text(yaml.safe_dump({**values, "launcher": {"slurm": {"queue": "gpu"}}}))
    argv = ["compare", "--grid", str(grid), "--out", out, "--launcher", "submitit"]
    assert main(argv) == 2
    assert "unknown slurm option 'queue'" in capsys.readouterr().err
    grid.write_text(yaml.safe_dump({**values, "launcher": {"slurm_partition": "gpu"}}))
    assert main(argv) == 2
    assert "launcher section takes only slurm:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written before the errors


def test_a_missing_engine_is_one_line_naming_its_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(LauncherError, match=r"needs Ray: pip install ray"):
        launchers.make_launcher(Launch("ray"), tmp_path, threads=1)
    with pytest.raises(LauncherError, match=r"needs submitit: pip install submitit"):
        launchers.make_launcher(Launch("submitit"), tmp_path, threads=1)
