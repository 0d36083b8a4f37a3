"""The GPU and SLURM recipes of docs/usage.md agree with the code: every
``--trainer.KEY`` they pass is a trainer key, each sbatch script asks for one task per GPU
and hands Lightning the job's shape (``devices`` = tasks per node, ``num_nodes`` = nodes),
``srun`` ends the job when a rank fails, and the default accelerator they describe is the
config's."""

from __future__ import annotations

import dataclasses
import re

from experiments.training.config import TrainerConfig
from tests.support.paths import ROOT

USAGE = ROOT / "docs" / "usage.md"


def _blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", USAGE.read_text(), flags=re.DOTALL)


def _sbatch(block: str) -> dict[str, str]:
    return dict(re.findall(r"#SBATCH --([\w-]+)=(\S+)", block))


def _trainer_flags(block: str) -> dict[str, str]:
    command = block.replace("\\\n", " ")
    return dict(re.findall(r"--trainer\.(\w+) (\S+)", command))


def test_every_trainer_flag_of_the_gpu_recipes_is_a_trainer_key() -> None:
    keys = {field.name for field in dataclasses.fields(TrainerConfig)}
    recipes = [block for block in _blocks() if "torchrun" in block or "#SBATCH" in block]
    assert len(recipes) == 3
    for block in recipes:
        assert set(_trainer_flags(block)) <= keys, block


def test_each_sbatch_script_gives_lightning_the_jobs_shape() -> None:
    scripts = [block for block in _blocks() if "#SBATCH" in block]
    assert len(scripts) == 2
    for block in scripts:
        job, flags = _sbatch(block), _trainer_flags(block)
        tasks = int(job["ntasks-per-node"])
        assert job["gres"] == f"gpu:{tasks}"
        assert int(flags.get("devices", 1)) == tasks
        assert int(flags.get("num_nodes", 1)) == int(job["nodes"])
        assert (flags.get("strategy") == "ddp") is (tasks * int(job["nodes"]) > 1)
        assert "srun --kill-on-bad-exit=1 odelm train" in block


def test_the_documented_default_accelerator_is_the_configs() -> None:
    assert TrainerConfig().accelerator == "auto"
    assert "`trainer.accelerator` is `auto` by default" in USAGE.read_text()
