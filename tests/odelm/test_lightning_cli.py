"""``LightningCLI(LMTask, LMDataModule)`` of the Lightning package odelm chose
(``odelm.lightning``) runs ``fit --config FILE``, from the example YAML in examples/ shrunk
to tiny size."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import yaml

from experiments.training.datamodule import LMDataModule
from experiments.training.task import LMTask
from odelm.lightning import NAME, pl
from tests.support.paths import ROOT

EXAMPLE = ROOT / "examples" / "lightning_cli.yaml"
TINY = [
    "--trainer.max_steps=4",
    "--trainer.val_check_interval=2",
    "--trainer.limit_val_batches=2",
    "--trainer.accelerator=cpu",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--data.val_batches=2",
]


def tiny_config(path: Path) -> Path:
    """The example YAML with a one-layer, 16-wide model and 4 x 8 token batches."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["model"]["model"]["config"].update(d_model=16, d_ff=32, n_layers=1)
    config["data"]["config"].update(batch_size=4, bptt=8)
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The LightningCLI after ``fit --config examples/lightning_cli.yaml``."""
    root = tmp_path_factory.mktemp(NAME)
    config = tiny_config(root / "fit.yaml")
    args = ["fit", "--config", str(config), f"--trainer.default_root_dir={root}", *TINY]
    cli = importlib.import_module(f"{pl.__name__}.cli")  # not imported by the package
    return cli.LightningCLI(LMTask, LMDataModule, args=args), root


@pytest.mark.slow
def test_fit_config_trains_the_yaml_model(fitted):
    cli, root = fitted
    assert type(cli.model) is LMTask
    assert isinstance(cli.model, LMTask) and isinstance(cli.datamodule, LMDataModule)
    assert cli.trainer.global_step == 4
    assert cli.datamodule.config.corpus == "grammar" and cli.datamodule.config.bptt == 8
    assert cli.model.model.config.block == "rk4" and cli.model.model.config.d_model == 16
    assert cli.model.model.config.vocab_size == cli.datamodule.vocab_size
    ppl = float(cli.trainer.callback_metrics["val/ppl"])
    assert math.isfinite(ppl) and 1.0 < ppl < 2 * cli.datamodule.vocab_size
    saved = (root / "config.yaml").read_text()  # LightningCLI's record of the run's config
    assert "architecture: ode_transformer.lm:ODETransformerLM" in saved
