"""``LMTask`` and ``LMDataModule`` train under both spellings of Lightning (``import
lightning as L`` and ``import pytorch_lightning as pl``) with identical numbers, and the
progress bar counts steps when the budget is in steps."""

from __future__ import annotations

import pickle

import lightning as L
import pytest
import pytorch_lightning as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden as lightning_overrides
from pytorch_lightning.utilities.model_helpers import is_overridden as pl_overrides

from experiments.training.config import OptimConfig
from experiments.training.datamodule import LMDataModule
from experiments.training.spellings import StepCounting, step_progress_bar
from experiments.training.task import LMTask
from ode_transformer import ODETransformerLM
from ode_transformer.presets import config_from_preset

SPELLINGS = {"lightning": L, "pytorch_lightning": pl}


def tiny_model(vocab_size: int) -> ODETransformerLM:
    """A one-layer ODE Transformer, seeded."""
    torch.manual_seed(0)
    return ODETransformerLM(config_from_preset("small", vocab_size=vocab_size, d_model=16))


def fit(package, max_steps: int = 6, **options):
    """A tiny ODE Transformer trained on the grammar corpus by ``package.Trainer``."""
    data = LMDataModule.from_corpus("grammar", batch_size=4, bptt=8, val_batches=2)
    task = LMTask(tiny_model(data.vocab_size), OptimConfig(lr=1e-3))
    settings = {"logger": False, "enable_checkpointing": False, "enable_model_summary": False}
    trainer = package.Trainer(
        max_steps=max_steps,
        val_check_interval=3,
        limit_val_batches=2,
        accelerator="cpu",
        **{"enable_progress_bar": False, **settings, **options},
    )
    trainer.fit(task, datamodule=data)
    return trainer, task, data


@pytest.fixture(scope="module")
def trained():
    return {name: fit(package) for name, package in SPELLINGS.items()}


@pytest.mark.slow
def test_both_spellings_train_the_same_model(trained):
    (l_trainer, l_task, _), (p_trainer, p_task, _) = (
        trained["lightning"],
        trained["pytorch_lightning"],
    )
    assert l_trainer.global_step == p_trainer.global_step == 6
    assert float(l_trainer.callback_metrics["val/ppl"]) == float(
        p_trainer.callback_metrics["val/ppl"]
    )
    for (name, a), (_, b) in zip(l_task.state_dict().items(), p_task.state_dict().items()):
        assert torch.equal(a, b), name
    initial = tiny_model(trained["lightning"][2].vocab_size)  # training moved its weights
    moved = [
        not torch.equal(a, b)
        for a, b in zip(initial.state_dict().values(), l_task.model.state_dict().values())
    ]
    assert any(moved)


@pytest.mark.parametrize("name", list(SPELLINGS))
@pytest.mark.slow
def test_each_trainer_sees_its_own_hooks(trained, name):
    _, task, data = trained[name]
    assert isinstance(task, LMTask) and isinstance(data, LMDataModule)
    assert isinstance(task, L.LightningModule) and isinstance(task, pl.LightningModule)
    assert type(task).__name__ == "LMTask"
    overrides = lightning_overrides if name == "lightning" else pl_overrides
    assert overrides("training_step", task) and overrides("train_dataloader", data)
    assert not overrides("configure_sharded_model", task)  # its own base's: not overridden
    assert not overrides("transfer_batch_to_device", data)


@pytest.mark.slow
def test_a_task_moves_between_trainers(trained):
    _, task, data = trained["lightning"]
    assert type(task) is not LMTask  # the twin with lightning's hooks first
    copied = pickle.loads(pickle.dumps(task))  # a twin pickles as its own class
    assert type(copied) is LMTask and type(pickle.loads(pickle.dumps(data))) is LMDataModule
    assert all(torch.equal(a, b) for a, b in zip(copied.parameters(), task.parameters()))
    settings = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    pl.Trainer(max_steps=1, **settings).fit(task, datamodule=data)
    assert type(task) is LMTask and type(data) is LMDataModule


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPELLINGS))
def test_the_progress_bar_counts_steps_with_a_step_budget(name):
    package = SPELLINGS[name]
    trainer, _, _ = fit(package, max_steps=7, enable_progress_bar=True)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, StepCounting)
    assert bar._get_train_description(0) == "Epoch 0 · step 7/7"  # not "Epoch 0/-2"
    tqdm = getattr(package, "pytorch", package).callbacks.TQDMProgressBar()
    trainer, _, _ = fit(package, max_steps=5, enable_progress_bar=True, callbacks=[tqdm])
    assert trainer.progress_bar_callback.train_progress_bar.desc.startswith("Epoch 0 · step 5/5")
    by_epochs = package.Trainer(max_epochs=1, logger=False)
    assert step_progress_bar(by_epochs) == []  # an epoch budget keeps Lightning's bar
