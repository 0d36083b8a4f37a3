"""One failing rank stops all: an error on one rank of a DDP run must not leave
the others waiting in an all-reduce until the process group's timeout (30 minutes). Under
``torchrun`` the agent stops the other ranks as soon as one exits with an error; the job
ends promptly, non-zero, with the failing rank's one-line ``odelm: error:``. (Under
``srun`` the same takes ``--kill-on-bad-exit=1``, as the sbatch recipe in docs/usage.md
sets.) The failure is injected into rank 1 alone through a ``sitecustomize`` module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT

INJECT = """
import os
if os.environ.get("RANK") == "1":
    from experiments.training.task import LMTask, NonFiniteLossError
    real = LMTask.training_step
    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise NonFiniteLossError("training loss is nan at step 3 (injected on rank 1)")
        return real(self, batch, batch_idx)
    LMTask.training_step = training_step
"""


@pytest.mark.slow
def test_an_error_on_rank_1_ends_the_torchrun_job_promptly(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(INJECT)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "-m", "experiments", "train", "--config", "experiments/configs/example.yaml",
        "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_steps", "20",
        "--trainer.val_every", "10", "--trainer.val_batches", "2",
        "--trainer.num_threads", "1",
        "--out_dir", str(tmp_path / "runs"), "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "SLURM_PROCID"):
        env.pop(key, None)
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    elapsed = time.monotonic() - started
    printed = done.stdout + done.stderr
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("odelm: error:")]
    expected = "odelm: error: training loss is nan at step 3 (injected on rank 1)"
    assert errors == [expected], printed[-4000:]
    assert "rank      : 1" in done.stderr  # torchrun names the rank that failed first
    assert elapsed < 300  # far below the 30-minute process-group timeout rank 0 would wait
    assert not list((tmp_path / "runs").rglob("result.json"))
