"""Training recipes: SGD with plateau annealing, epoch budgets, weight tying, stateful TBPTT."""

from __future__ import annotations

import itertools

import pytest
import torch

from experiments.data.corpora import load_corpus
from experiments.data.tokenization import WordTokenizer, encode_corpus
from experiments.models.build import build_model, count_parameters
from experiments.reference import BigramLM
from experiments.training.config import (
    ConfigError,
    DataConfig,
    OptimConfig,
    TrainerConfig,
    parse_config,
)
from experiments.training.datamodule import LMDataModule
from experiments.training.metrics import EvalSettings, perplexity
from experiments.training.optimizers import (
    PlateauAnnealer,
    build_optimizer,
    training_budget,
    world_size,
)
from experiments.training.task import LMTask
from neuralode_lm import LSTMLM, ODELSTM
from odelm.contract import StatelessModelError


def test_plateau_annealing_divides_the_lr_after_patience_bad_validations() -> None:
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = build_optimizer([weight], OptimConfig(optimizer="sgd", lr=20.0, momentum=0.9))
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0.9
    annealer = PlateauAnnealer(optimizer, factor=4.0, patience=2)
    lrs = []
    for ppl in [10.0, 9.0, 9.5, 9.2, 8.0, 8.5, 8.5, 8.5, 8.5]:
        annealer.step(ppl)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == [20.0, 20.0, 20.0, 5.0, 5.0, 5.0, 1.25, 1.25, 0.3125]
    restored = PlateauAnnealer(optimizer, factor=4.0, patience=2)
    restored.load_state_dict(annealer.state_dict())
    restored.step(8.5)  # one bad validation after the last division: not yet
    assert optimizer.param_groups[0]["lr"] == 0.3125
    every = PlateauAnnealer(optimizer, factor=4.0, patience=1)  # the word_language_model rule
    for ppl in [3.0, 4.0, 2.0, 2.0]:
        every.step(ppl)
    assert optimizer.param_groups[0]["lr"] == 0.3125 / 16


def test_recipes_lie_under_the_config_and_epochs_convert_exactly() -> None:
    model = {"family": "neuralode_lm", "name": "lstm"}
    config = parse_config({"recipe": "lstm-sgd", "model": model, "optim": {"lr": 10.0}})
    assert (config.optim.optimizer, config.optim.lr, config.optim.grad_clip) == ("sgd", 10.0, 0.25)
    assert config.optim.schedule == "plateau" and config.data.stateful
    assert not parse_config({"recipe": "transformer-sgd", "model": model}).data.stateful
    with pytest.raises(ConfigError, match="recipe = 'nope' is not one of adam, lstm-sgd"):
        parse_config({"recipe": "nope", "model": model})
    with pytest.raises(ConfigError, match="data.stateful needs data.batching: stream"):
        parse_config({"model": model, "data": {"stateful": True, "batching": "sentences"}})
    budget = TrainerConfig(max_steps=None, max_epochs=3, val_every="epoch")
    assert training_budget(budget, 94) == (282, 94)
    assert training_budget(TrainerConfig(max_steps=50, max_epochs=3), 94) == (50, 100)
    assert training_budget(TrainerConfig(max_epochs=3, devices=2, val_every="epoch"), 9) == (15, 5)


def test_epoch_budgets_count_the_processes_of_the_run(monkeypatch) -> None:
    """An epoch is shared out over every process: 2 epochs on 2 processes are half the
    steps of 1, whether the world comes from the launcher, ``devices: auto`` on CUDA or a
    list of devices; one process keeps its numbers."""
    epochs = TrainerConfig(max_steps=None, max_epochs=2, val_every="epoch")
    assert training_budget(epochs, 94, 1) == training_budget(epochs, 94) == (188, 94)
    assert training_budget(epochs, 94, 2) == (94, 47)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for devices in ("auto", -1, "-1", "0,1", "[0, 1]"):
        config = TrainerConfig(max_steps=None, max_epochs=2, devices=devices)
        assert world_size(config, {}) == 2 and training_budget(config, 94)[0] == 94
    assert world_size(TrainerConfig(devices="auto", accelerator="cpu"), {}) == 1
    assert world_size(TrainerConfig(devices=2, num_nodes=2), {}) == 4
    assert world_size(TrainerConfig(), {"WORLD_SIZE": "3"}) == 3


def test_weight_tying_shares_one_parameter() -> None:
    tied = LSTMLM(50, embed_dim=16, hidden_dim=16, tie_embeddings=True, init_range=0.1)
    assert tied.head.weight is tied.encoder.embedding.weight
    assert tied.head.weight.abs().max() <= 0.1 and torch.all(tied.head.bias == 0)
    untied = LSTMLM(50, embed_dim=16, hidden_dim=16)
    assert count_parameters(untied) - count_parameters(tied) == 50 * 16
    ode = ODELSTM(50, embed_dim=20, hidden_dim=12, augment_dim=8, tie_embeddings=True)
    assert ode.head.proj.weight is ode.encoder.embedding.weight
    with pytest.raises(ValueError, match=r"input width \(12\) to equal embed_dim \(16\)"):
        LSTMLM(50, embed_dim=16, hidden_dim=12, tie_embeddings=True)


@pytest.fixture
def grammar_data():
    corpus = load_corpus("grammar")
    return encode_corpus(corpus, WordTokenizer.from_corpus(corpus))


def test_stateful_batching_carries_detached_state_along_contiguous_streams(grammar_data):
    config = DataConfig(batch_size=3, bptt=5, stateful=True)
    module = LMDataModule(grammar_data, config, seed=0, val_batches=None)
    windows = module.train_batches()
    assert [w.starts_epoch for w in windows[:3]] == [True, False, False]
    for before, after in itertools.pairwise(windows):
        assert torch.equal(after.tokens[:, 0], before.tokens[:, -1])  # the streams continue
    ids = grammar_data.split("train").ids
    streams = torch.cat([windows[0].tokens] + [w.tokens[:, 1:] for w in windows[1:]], dim=1)
    assert torch.equal(streams, ids[: ids.numel() // 3 * 3].view(3, -1))  # batchify's rows

    model = LSTMLM(grammar_data.tokenizer.vocab_size, embed_dim=8, hidden_dim=8, dropout=0.0)
    task = LMTask(model, OptimConfig(), stateful=True)
    for window in windows[:3]:
        task._loss(window)
    state = task.train_state
    assert all(s.grad_fn is None and not s.requires_grad for s in state)
    rows = torch.cat([windows[0].tokens] + [w.tokens[:, 1:] for w in windows[1:3]], dim=1)
    _, whole = model.encoder.lstm(model.encoder.embedding(rows[:, :-1]))
    for carried, direct in zip(state, whole):
        torch.testing.assert_close(carried, direct, rtol=1e-5, atol=1e-6)
    task._loss(windows[0])  # a new epoch starts the streams afresh
    _, fresh = model.encoder.lstm(model.encoder.embedding(windows[0].tokens[:, :-1]))
    torch.testing.assert_close(task.train_state[0], fresh[0])

    with pytest.raises(StatelessModelError, match="set data.stateful: false"):
        LMTask(BigramLM(grammar_data.tokenizer.vocab_size), OptimConfig(), stateful=True)


@pytest.mark.slow
def test_stateful_evaluation_scores_every_token_once_whatever_the_window(grammar_data):
    model = LSTMLM(grammar_data.tokenizer.vocab_size, embed_dim=8, hidden_dim=8).eval()
    short = perplexity(
        model, grammar_data, "test", EvalSettings(eval_window=7, eval_batch_size=3, stateful=True)
    )
    long = perplexity(
        model, grammar_data, "test", EvalSettings(eval_window=500, eval_batch_size=3, stateful=True)
    )
    assert short["tokens"] == long["tokens"] == grammar_data.split("test").ids.numel()
    assert short["nll"] == pytest.approx(long["nll"], rel=1e-5)
    with pytest.raises(StatelessModelError, match="BigramLM"):
        perplexity(BigramLM(5), grammar_data, "test", EvalSettings(stateful=True))


def test_word_lm_transformer_is_causal_and_built_from_the_config() -> None:
    spec = {"family": "reference", "name": "transformer", "d_model": 16, "n_heads": 2}
    model = build_model({**spec, "d_ff": 32}, 30).eval()
    tokens = torch.randint(0, 30, (2, 9))
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 30
    before, after = model(tokens)[0], model(changed)[0]
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])
    with pytest.raises(ConfigError, match="valid: bigram, transformer"):
        build_model({"family": "reference", "name": "gru"}, 30)
