"""Training harness: determinism, SIGKILL-and-resume, DDP, checkpoint averaging, bad input."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from experiments.cli.main import main
from experiments.data.tokenization import VocabularyMismatchError, WordTokenizer
from experiments.evaluation.trained import load_run
from experiments.models.build import build_model
from experiments.training.config import ConfigError, parse_config
from experiments.training.runfolder import RUN_MARKER, RunFilesChangedError
from experiments.training.task import NonFiniteLossError
from experiments.training.train import OutputDirError, train
from odelm.lightning import pl
from tests.support.runs import kill_at_first_checkpoint


@pytest.mark.slow
def test_same_seed_same_validation_perplexity(tmp_path, tiny_config):
    first = train(parse_config(tiny_config(tmp_path, "a")))
    second = train(parse_config(tiny_config(tmp_path, "b")))
    assert first["valid_ppl"] == pytest.approx(second["valid_ppl"], abs=1e-6)
    assert first["test_ppl"] == pytest.approx(second["test_ppl"], abs=1e-6)
    with (tmp_path / "a" / "logs" / "metrics.csv").open() as handle:
        logged = [row for row in csv.DictReader(handle) if row["grad_norm/block_0"]]
    assert [int(row["step"]) for row in logged] == [9, 19]  # every log_every=10 steps
    assert all(float(row["train/tokens_per_s"]) > 0 for row in logged)
    third = train(parse_config(tiny_config(tmp_path, "c", seed=4)))
    assert third["valid_ppl"] != pytest.approx(first["valid_ppl"], abs=1e-6)


# A stateful LSTM with the word_language_model recipe: SGD, the lr divided on a plateau,
# the hidden state carried across windows (and through the checkpoint).
STATEFUL_SGD = {
    "recipe": "lstm-sgd",
    "model": {"family": "neuralode_lm", "name": "lstm", "embed_dim": 16, "hidden_dim": 16},
    "data": {"batch_size": 64, "bptt": 16, "eval_batch_size": 4},
    "optim": {"lr": 40.0},
}


def _with_recipe(values: dict, recipe: dict) -> dict:
    """Config values with a recipe's sections merged in and its model (if any) swapped in."""
    merged = {**values, **{k: v for k, v in recipe.items() if not isinstance(v, dict)}}
    for key, section in recipe.items():
        if isinstance(section, dict):
            merged[key] = section if key == "model" else {**values.get(key, {}), **section}
    return merged


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "lrs"), [({}, set()), (STATEFUL_SGD, {40.0, 10.0})], ids=["adam", "stateful-sgd"]
)
def test_sigkill_mid_run_then_resume_matches_uninterrupted(tmp_path, tiny_config, recipe, lrs):
    def config(name: str) -> dict:
        return _with_recipe(tiny_config(tmp_path, name, trainer={"max_steps": 40}), recipe)

    reference = train(parse_config(config("reference")))
    with (tmp_path / "reference" / "logs" / "metrics.csv").open() as handle:
        logged = {float(row["val/lr"]) for row in csv.DictReader(handle) if row.get("val/lr")}
    assert logged == lrs  # the stateful run anneals (40 -> 10) on a validation plateau
    kill_at_first_checkpoint(config("killed"), tmp_path / "killed", 40)
    resumed = train(parse_config(config("killed")))
    assert resumed["steps"] == 40
    assert resumed["valid_ppl"] == pytest.approx(reference["valid_ppl"], abs=1e-6)
    assert resumed["test_ppl"] == pytest.approx(reference["test_ppl"], abs=1e-6)


class _SaveWeights(pl.Callback):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_train_end(self, trainer, task) -> None:
        torch.save(task.model.state_dict(), self.folder / f"rank{trainer.global_rank}.pt")


@pytest.mark.slow
def test_two_process_ddp_ends_with_identical_weights(tmp_path, tiny_config):
    config = parse_config(
        tiny_config(
            tmp_path, "ddp", trainer={"devices": 2, "strategy": "ddp_spawn", "max_steps": 6}
        )
    )
    train(config, callbacks=[_SaveWeights(tmp_path)])
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        torch.testing.assert_close(rank0[key], rank1[key], rtol=0, atol=0)
    # and training moved them: the seeded initial weights differ from the final ones
    pl.seed_everything(config.seed, verbose=False)
    initial = build_model(
        config.model, vocab_size=rank0["token_embedding.weight"].shape[0]
    ).state_dict()
    assert any(not torch.equal(initial[key], rank0[key]) for key in rank0)


@pytest.mark.slow
def test_checkpoint_averaging_averages_the_last_validations(tmp_path, tiny_config):
    from experiments.training.checkpoints import CheckpointAverager

    averager = CheckpointAverager(2)
    for value in (1.0, 2.0, 4.0):
        averager.snapshots.append({"w": torch.full((2,), value)})
    assert torch.equal(averager.average()["w"], torch.full((2,), 3.0))
    result = train(parse_config(tiny_config(tmp_path, "avg", trainer={"average_last": 2})))
    assert result["selected"] == "average of last 2 validations"


def test_unknown_key_and_wrong_type_are_named(tmp_path, tiny_config):
    with pytest.raises(ConfigError, match=r"unknown key config.trainer.max_step\b"):
        parse_config(tiny_config(tmp_path, trainer={"max_step": 3}))
    with pytest.raises(ConfigError, match=r"config.optim.lr must be float >=0, got 'fast'"):
        parse_config(tiny_config(tmp_path, optim={"lr": "fast"}))
    with pytest.raises(ConfigError, match="model.family"):
        train(parse_config(tiny_config(tmp_path, model={"family": "rnn"})))


def test_unwritable_output_dir_fails_before_training(tmp_path, tiny_config):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OutputDirError, match="cannot write to run directory"):
        train(parse_config(tiny_config(blocker)))


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, tiny_config):
    values = tiny_config(tmp_path, "nan", optim={"lr": 1e6, "grad_clip": None})
    values["trainer"].update(max_steps=200, checkpoint_every=1)
    with pytest.raises(NonFiniteLossError, match="last good checkpoint is kept"):
        train(parse_config(values))
    last = tmp_path / "nan" / "checkpoints" / "last.ckpt"
    assert last.is_file(), "the run diverged before its first checkpoint: nothing was checked"
    state = torch.load(last, weights_only=True)["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values())
    assert not (tmp_path / "nan" / "result.json").exists()


@pytest.mark.slow
def test_eval_and_generate_commands_and_vocabulary_check(tmp_path, capsys, tiny_config):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(tmp_path, "cli")))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    *_, result_line, last_line = capsys.readouterr().out.strip().splitlines()
    trained = json.loads(result_line)
    assert last_line == f"wrote {tmp_path / 'cli'}"
    assert main(["eval", str(tmp_path / "cli"), "--json", "--num-threads", "1"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["ppl"] == pytest.approx(trained["test_ppl"], rel=1e-6)
    # eval uses the run's eval.* settings (bleu_sentences 5) unless told otherwise
    assert evaluated["bleu_tf"] == pytest.approx(trained["test_bleu_tf"], abs=1e-12)
    assert main(["eval", str(tmp_path / "cli"), "--json", "--bleu-sentences", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["bleu_tf"] is None
    assert (
        main(["generate", str(tmp_path / "cli"), "--prompt", "a dog", "--max-new-tokens", "4"]) == 0
    )
    assert capsys.readouterr().out.startswith("a dog ")
    # the run's model beside another vocabulary: the mismatch is refused (by the fingerprint
    # once the recorded checksum, which catches it first, is forgotten)
    WordTokenizer(["<eos>", "a", "dog", "runs"]).save(tmp_path / "cli" / "tokenizer")
    with pytest.raises(RunFilesChangedError, match="tokenizer does not match"):
        load_run(tmp_path / "cli")
    (tmp_path / "cli" / RUN_MARKER).write_text("{}")
    with pytest.raises(VocabularyMismatchError, match="trained with tokenizer"):
        load_run(tmp_path / "cli")
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_bpe_run_reports_per_word_and_per_token_perplexity_consistently(tmp_path, tiny_config):
    values = tiny_config(tmp_path, "bpe", data={"tokenizer": "bpe", "bpe_vocab_size": 300})
    values["trainer"]["max_steps"] = 4
    result = train(parse_config(values))
    assert result["test_tokenizer"] == "bpe"
    assert result["test_tokens"] > result["test_words"]  # sub-words: more tokens than words
    # one total NLL, two denominators: log ppl_word * words == log ppl_token * tokens
    assert math.log(result["test_ppl_per_word"]) * result["test_words"] == pytest.approx(
        math.log(result["test_ppl"]) * result["test_tokens"], rel=1e-9
    )
