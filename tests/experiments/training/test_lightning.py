"""Lightning conventions: hyperparameters in checkpoints, validation under a default
``pl.Trainer``, learning rate and hyperparameters in the logs, the logger choice."""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml

from experiments.data.corpora import load_corpus
from experiments.data.tokenization import build_tokenizer, encode_corpus
from experiments.models.build import build_model
from experiments.training.config import ConfigError, DataConfig, OptimConfig, parse_config
from experiments.training.datamodule import LMDataModule
from experiments.training.loggers import build_loggers
from experiments.training.metrics import EvalSettings, perplexity
from experiments.training.task import LMTask
from experiments.training.train import train
from odelm.lightning import pl

TINY = {
    "family": "ode_transformer",
    "preset": "small",
    "n_layers": 1,
    "d_model": 16,
    "d_ff": 32,
    "n_heads": 2,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "relu_dropout": 0.0,
}


@pytest.fixture(scope="module")
def default_trainer_fit(tmp_path_factory):
    """One epoch of a tiny model under ``pl.Trainer`` with nothing but its defaults."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("default-trainer")
    corpus = load_corpus("grammar", None)
    data = encode_corpus(corpus, build_tokenizer(corpus, "word"))
    data_cfg = DataConfig(batch_size=64, bptt=32, eval_window=64)
    optim = OptimConfig(lr=3e-3, schedule="inverse_sqrt", warmup_steps=4)
    task = LMTask(build_model(TINY, data.tokenizer.vocab_size), optim)
    trainer = pl.Trainer(max_epochs=1, default_root_dir=folder, enable_progress_bar=False)
    datamodule = LMDataModule(data, data_cfg, seed=0, val_batches=None)
    trainer.fit(task, datamodule=datamodule)
    return trainer, task, data, data_cfg


@pytest.mark.slow
def test_validation_runs_under_a_default_trainer(default_trainer_fit):
    trainer, task, data, data_cfg = default_trainer_fit
    batches_per_epoch = len(LMDataModule(data, data_cfg, 0, None).train_batches())
    assert trainer.global_step == batches_per_epoch
    # The logged validation perplexity is the exact perplexity of the valid split.
    expected = perplexity(
        task.model.eval(), data, "valid", EvalSettings(eval_window=data_cfg.eval_window)
    )
    assert float(trainer.callback_metrics["val/ppl"]) == pytest.approx(expected["ppl"], rel=1e-5)
    assert math.isfinite(expected["ppl"]) and expected["ppl"] < data.tokenizer.vocab_size


@pytest.mark.slow
def test_load_from_checkpoint_rebuilds_model_and_optimizer_settings(default_trainer_fit):
    trainer, task, _, _ = default_trainer_fit
    (path,) = (Path(trainer.default_root_dir) / "lightning_logs").glob(
        "version_*/checkpoints/*.ckpt"
    )
    loaded = LMTask.load_from_checkpoint(path)
    assert loaded.optim == task.optim
    assert loaded.hparams["model"]["architecture"] == "ode_transformer.lm:ODETransformerLM"
    state, expected = loaded.model.state_dict(), task.model.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)
    assert loaded.model.head.weight is loaded.model.token_embedding.weight  # still tied


@pytest.mark.slow
def test_a_run_logs_learning_rate_and_hyperparameters(tmp_path):
    config = parse_config(
        {
            "name": "logged",
            "out_dir": str(tmp_path),
            "model": TINY,
            "data": {"batch_size": 8, "bptt": 16, "eval_window": 32},
            "optim": {"lr": 2e-3, "schedule": "inverse_sqrt", "warmup_steps": 4},
            "trainer": {"max_steps": 6, "val_every": 3, "val_batches": 1, "log_every": 1},
            "eval": {"bleu_sentences": 0},
        }
    )
    config.trainer.progress_bar = False
    train(config)
    with (tmp_path / "logged" / "logs" / "metrics.csv").open() as handle:
        rates = [float(row["lr-Adam"]) for row in csv.DictReader(handle) if row["lr-Adam"]]
    # inverse_sqrt warmup: lr * step / warmup for the first steps, then lr * sqrt(warmup / step)
    assert rates[:3] == pytest.approx([2e-3 * s / 4 for s in (1, 2, 3)], rel=1e-6)
    hparams = yaml.safe_load((tmp_path / "logged" / "tensorboard" / "hparams.yaml").read_text())
    assert hparams["optim"]["lr"] == 2e-3
    assert hparams["model"]["config"]["d_model"] == 16
    assert list((tmp_path / "logged" / "tensorboard").glob("events.out.tfevents.*"))


def test_logger_choice_is_checked_and_wandb_names_its_package(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="trainer.logger 'mlflow' is not one of"):
        parse_config({"model": TINY, "trainer": {"logger": ["mlflow"]}})
    assert [type(x).__name__ for x in build_loggers(["csv"], tmp_path, "r")] == ["HistoryCSVLogger"]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wandb" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match="pip install wandb"):
        build_loggers(["csv", "wandb"], tmp_path, "r")
