"""One Lightning package, chosen when odelm is imported (``odelm.lightning``): ``lightning``
when installed, else ``pytorch_lightning``, ``ODELM_LIGHTNING`` forcing either; ``LMTask``
and ``LMDataModule`` train under its ``Trainer`` and stay of their own class; the other
package's Trainer is refused in one line naming the variable; a step budget's progress bar
counts steps."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

from experiments.training.config import OptimConfig
from experiments.training.datamodule import LMDataModule
from experiments.training.progress import step_description
from experiments.training.task import LMTask
from experiments.training.trainer import fit as odelm_fit
from ode_transformer import ODETransformerLM
from ode_transformer.presets import config_from_preset
from odelm import lightning as choice
from odelm.lightning import ENV, LightningChoiceError, check_trainer, choose, pl
from tests.support.paths import ROOT

OTHER = "pytorch_lightning" if choice.NAME == "lightning" else "lightning"


def tiny_task(data: LMDataModule) -> LMTask:
    torch.manual_seed(0)
    config = config_from_preset("small", vocab_size=data.vocab_size, d_model=16)
    return LMTask(ODETransformerLM(config), OptimConfig(lr=1e-3))


def tiny_fit(max_steps: int = 6, **options):
    """A tiny ODE Transformer trained on the grammar corpus by the chosen ``Trainer``."""
    data = LMDataModule.from_corpus("grammar", batch_size=4, bptt=8, val_batches=2)
    task = tiny_task(data)
    settings = {"logger": False, "enable_checkpointing": False, "enable_model_summary": False}
    trainer = pl.Trainer(
        max_steps=max_steps,
        val_check_interval=3,
        limit_val_batches=2,
        accelerator="cpu",
        **{"enable_progress_bar": False, **settings, **options},
    )
    trainer.fit(task, datamodule=data)
    return trainer, task, data


def test_lightning_is_chosen_when_installed():
    installed = importlib.util.find_spec("lightning") is not None
    assert choose({}) == ("lightning" if installed else "pytorch_lightning")
    assert choice.NAME == choose(os.environ)
    assert pl.__name__ == choice.MODULES[choice.NAME]
    assert LMTask.__bases__ == (pl.LightningModule,)
    assert LMDataModule.__bases__ == (pl.LightningDataModule,)


def test_the_environment_variable_forces_either_package():
    assert choose({ENV: "pytorch_lightning"}) == "pytorch_lightning"
    assert choose({ENV: "lightning"}) == "lightning"
    with pytest.raises(LightningChoiceError, match=f"{ENV}='lightnin' names no Lightning"):
        choose({ENV: "lightnin"})


@pytest.mark.slow
def test_a_fresh_process_takes_the_forced_package():
    """The choice is made when odelm is imported (a fresh process: about 10 s of imports)."""
    code = (
        "import pytorch_lightning, lightning.pytorch as L\n"
        "from odelm.lightning import NAME, pl\n"
        "assert NAME == 'pytorch_lightning' and pl is pytorch_lightning\n"
        "assert issubclass(pl.LightningModule, L.LightningModule) is False"
    )
    env = {**os.environ, ENV: "pytorch_lightning", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)


def test_a_fit_keeps_the_task_of_its_own_class():
    trainer, task, data = tiny_fit()
    assert trainer.global_step == 6 and float(trainer.callback_metrics["val/ppl"]) > 1
    assert type(task) is LMTask and type(data) is LMDataModule


def test_the_other_packages_trainer_is_one_clear_line():
    other = importlib.import_module(choice.MODULES[OTHER])
    trainer = other.Trainer(logger=False, enable_progress_bar=False)
    with pytest.raises(LightningChoiceError) as error:
        check_trainer(trainer)
    message = str(error.value)
    assert "\n" not in message and f"{ENV}={OTHER}" in message and f"a {OTHER} Trainer" in message
    data = LMDataModule.from_corpus("grammar", batch_size=4, bptt=8, val_batches=2)
    with pytest.raises(LightningChoiceError, match=ENV):  # odelm's fit checks first
        odelm_fit(trainer, tiny_task(data), data, None)


@pytest.mark.slow
def test_the_progress_bar_counts_steps_with_a_step_budget():
    bar = pl.callbacks.TQDMProgressBar()
    tiny_fit(max_steps=5, enable_progress_bar=True, callbacks=[bar])
    assert bar.train_progress_bar.desc.startswith("Epoch 0 · step 5/5")
    by_epochs = pl.Trainer(max_epochs=1, logger=False)
    assert step_description(by_epochs) == []  # an epoch budget keeps Lightning's bar
