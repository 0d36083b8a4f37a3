"""``LightningCLI`` over ``LMTask`` and ``LMDataModule``: a run from one YAML file.

    python examples/lightning_cli.py fit --config examples/lightning_cli.yaml
    python examples/lightning_cli.py fit --config examples/lightning_cli.yaml --trainer.max_steps 50
    python examples/lightning_cli.py fit --print_config   # every key, with its default

With ``ODELM_LIGHTNING=pytorch_lightning`` (``odelm.lightning``), use
``pytorch_lightning.cli.LightningCLI`` instead.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from experiments.training.datamodule import LMDataModule
from experiments.training.task import LMTask

if __name__ == "__main__":
    LightningCLI(LMTask, LMDataModule)
