"""Ranks under the launchers researchers use: torchrun and ``srun`` set the global
rank (``RANK``, ``SLURM_PROCID``) and may leave ``LOCAL_RANK`` unset; only global rank 0
locks, clears and writes the run folder."""

from __future__ import annotations

import pytest
import yaml

from experiments.cli.main import main
from experiments.training import runfolder
from experiments.training.runfolder import (
    LOCK_FILE,
    RUN_MARKER,
    RankVariableError,
    RunInUseError,
    claimed_run,
    run_lock,
)
from experiments.training.train import OutputDirError, check_writable


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in runfolder.RANK_VARIABLES:
        monkeypatch.delenv(key, raising=False)


def _srun_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    """What ``srun`` (with Lightning's SLURM environment) or multi-node torchrun sets."""
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("RANK", str(rank))


def test_under_srun_only_global_rank_0_takes_the_run_lock(tmp_path, monkeypatch) -> None:
    with run_lock(tmp_path):  # global rank 0 holds it
        _srun_rank(monkeypatch, 1)
        with run_lock(tmp_path):  # rank 1 must not try to take it (it would be refused)
            pass
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("SLURM_PROCID", "0")
        with pytest.raises(RunInUseError), run_lock(tmp_path):
            pass  # a second rank-0 process is still refused


@pytest.mark.parametrize("variable", ["RANK", "SLURM_PROCID"])
def test_a_global_rank_alone_makes_a_worker(monkeypatch, variable) -> None:
    monkeypatch.setenv(variable, "3")
    assert runfolder.process_rank() == 3 and runfolder.is_worker_process()


def test_other_ranks_neither_clear_nor_probe_the_run_folder(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    with claimed_run(run):
        (run / "config.yaml").write_text("kept")
    _srun_rank(monkeypatch, 2)
    with claimed_run(run, overwrite=True):  # --overwrite: rank 0 alone clears
        assert (run / "config.yaml").read_text() == "kept"
    (run / ".write-test").mkdir()  # a probe rank 0 would fail on; the other ranks skip it
    check_writable(run)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SLURM_PROCID", "0")
    with pytest.raises(OutputDirError):
        check_writable(run)


def test_a_rank_variable_that_is_not_an_integer_is_one_line(
    tmp_path, tiny_config, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "abc")
    with pytest.raises(RankVariableError, match="LOCAL_RANK='abc' is not an integer rank"):
        runfolder.is_worker_process()
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, "run")))
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "LOCAL_RANK='abc' is not an integer rank" in err


def test_a_lock_file_that_is_a_directory_is_one_line(tmp_path, tiny_config, capsys) -> None:
    run = tmp_path / "run"
    (run / LOCK_FILE).mkdir(parents=True)
    (run / RUN_MARKER).write_text("{}")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, "run")))
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert f"cannot take the run lock {run / LOCK_FILE} (is a directory" in err
