"""Evaluation settings are one object: built from a run config in one place, overridden
with checks, and the same whether Python or ``odelm eval`` evaluates."""

from __future__ import annotations

import dataclasses

import pytest

import experiments
from experiments.config_errors import ConfigError
from experiments.training.config import DataConfig, EvalConfig, RunConfig, parse_config
from experiments.training.metrics import EvalSettings, perplexity
from experiments.training.train import train


def test_settings_come_from_the_data_and_eval_sections():
    data = DataConfig(batching="stream", eval_window=40, eval_batch_size=3)
    data = dataclasses.replace(data, padding_side="left", stateful=True)  # a stateful run
    bleu = EvalConfig(bleu_sentences=7, continuation_sentences=5, prompt_len=2, decode="beam")
    config = RunConfig(data=data, eval=bleu)
    assert EvalSettings.from_config(config) == EvalSettings(
        batching="stream",
        eval_window=40,
        eval_batch_size=3,
        padding_side="left",
        stateful=True,
        bleu_sentences=7,
        continuation_sentences=5,
        prompt_len=2,
        decode="beam",
    )
    batching = EvalSettings.from_config(config.data)  # a data section alone: BLEU's defaults
    assert (batching.eval_window, batching.bleu_sentences) == (40, EvalSettings().bleu_sentences)
    # evaluate()'s defaults are a default run's
    assert EvalSettings() == EvalSettings.from_config(RunConfig())
    assert EvalSettings.from_config(DataConfig()) == EvalSettings()


def test_settings_are_frozen_and_overrides_are_checked_like_the_config():
    settings = EvalSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.eval_window = 3  # type: ignore[misc]
    assert settings.with_overrides(prompt_len=5, decode=None).prompt_len == 5
    assert settings.with_overrides(decode=None) == settings  # None keeps the setting
    assert settings.with_overrides(eval_window=64, batching="sentences").batching == "sentences"
    with pytest.raises(ConfigError, match="^unknown evaluation setting prompt_length; valid: "):
        settings.with_overrides(prompt_length=5)
    with pytest.raises(ConfigError, match=r"^decode must be one of greedy, beam, got 'sample'$"):
        settings.with_overrides(decode="sample")
    with pytest.raises(ConfigError, match=r"^--padding-side must be one of left, right"):
        settings.with_overrides(flags=True, padding_side="top")
    with pytest.raises(ConfigError, match=r"^eval_window = 1 is out of range; it must be >= 2$"):
        settings.with_overrides(eval_window=1)
    with pytest.raises(ConfigError, match=r"^--prompt-len = 0 is out of range"):
        settings.with_overrides(flags=True, prompt_len=0)


def test_text_perplexity_of_a_stateful_run_is_its_test_perplexity(tmp_path):
    # The run's own batching (stateful streams, its eval batch size) scores new text, so
    # the test lines scored again give the run's test perplexity.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = ["the cat sat on the mat", "a dog sat on the cat", "the dog ran"]
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n")
    config = parse_config(
        {
            "name": "stateful",
            "out_dir": str(tmp_path / "runs"),
            "model": {"family": "neuralode_lm", "name": "lstm", "embed_dim": 8, "hidden_dim": 8},
            "data": {"corpus": "text", "data_dir": str(corpus), "batch_size": 2, "bptt": 4}
            | {"stateful": True, "eval_batch_size": 3, "eval_window": 4},
            "trainer": {"max_steps": 3, "val_every": 3, "progress_bar": False},
            "eval": {"bleu_sentences": 0},
        }
    )
    result = train(config)
    run = experiments.load_run(tmp_path / "runs" / "stateful")
    assert run.perplexity(lines) == pytest.approx(result["test_ppl_per_word"], rel=1e-9)
    stateless = dataclasses.replace(EvalSettings.from_config(config), stateful=False)
    data = run.data()
    scored = perplexity(run.model, data, "test", stateless)
    assert scored["ppl_per_word"] != pytest.approx(result["test_ppl_per_word"], rel=1e-6)
