"""One option vocabulary: the same short aliases on ``odelm train``, ``compare`` and
``eval`` (the ones a command lacks listed with the reason), ``--data.corpus`` naming every
corpus of the registry, and ``--model '{...}'`` replacing the config file's model section
while ``--model.KEY VALUE`` edits one key. ``odelm train`` and ``compare`` spell every key
one way (the run form); the removed Lightning spellings are refused naming the run form's."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from experiments.cli.main import build_parser, main, parse
from experiments.cli.options import compare_parser, given_options, train_parser
from experiments.data.registry import CORPUS_NAMES
from experiments.models.build import build_model
from experiments.training.config import SHORT_FLAGS, RunConfig, parse_config
from neuralode_lm.models import LSTMLM

SHORT = {*SHORT_FLAGS, "--seed", "--download"}
"""The short options of the run settings a user changes most from the shell."""

LACKING = {
    "train": {},
    "compare": {},
    "eval": {
        "--corpus": "a run is scored on its own corpus (its config's data.corpus)",
        "--protocol": "a run is scored on the splits of the protocol it was trained under",
        "--max-steps": "eval trains nothing",
        "--max-time-s": "eval trains nothing",
        "--seed": "evaluation is deterministic (greedy or beam decoding)",
        "--download": "a run is scored on the files it recorded (--data-dir when they moved)",
    },
}
"""The short options each command lacks, with the reason."""

ONLY_TRAIN = {
    "--config": "train reads run configs; compare reads a grid (--grid, --preset)",
    "-c": "the short --config",
    "--overwrite": "compare resumes its grid and retrains runs whose config changed",
    "--quiet": "compare's runs train in their own processes, logging to files",
    "--verbose": "compare's runs train in their own processes, logging to files",
    "--name": "a grid names its runs",
    "--out_dir": "compare writes its runs into --out",
}
ONLY_COMPARE = {
    "--grid": "the grid file",
    "--preset": "a shipped grid",
    "--out": "the comparison folder",
    "--seeds": "several seeds of every run",
    "--jobs": "runs in flight at once",
    "--launcher": "where the runs train (local, submitit, ray)",
    "--ray-address": "the Ray cluster of --launcher ray",
    "--slurm": "the SLURM options of --launcher submitit (--slurm.KEY, submitit's names)",
}


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def subcommand(name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


def test_train_compare_and_eval_share_the_short_options():
    options = {
        "train": option_strings(train_parser()),
        "compare": option_strings(compare_parser()),
        "eval": option_strings(subcommand("eval")),
    }
    for command, lacking in LACKING.items():
        assert SHORT - options[command] == set(lacking), command
    assert options["train"] - options["compare"] == set(ONLY_TRAIN)
    assert options["compare"] - options["train"] == set(ONLY_COMPARE)


@pytest.mark.parametrize(
    ("lightning", "run_form"),
    [
        ("--trainer.val_check_interval", "--trainer.val_every"),
        ("--trainer.limit_val_batches", "--trainer.val_batches"),
        ("--run.checkpoint_every", "--trainer.checkpoint_every"),
        ("--seed_everything", "--seed"),
    ],
)
@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_lightning_spelling_is_one_line_naming_the_run_form(
    capsys, tmp_path, command, lightning, run_form
):
    grid = tmp_path / "grid.yaml"
    grid.write_text("runs:\n- {name: a, model: {family: reference}}\n")
    given = ["--grid", str(grid)] if command == "compare" else ["--model.family", "reference"]
    assert main([command, *given, lightning, "3", "--print_config"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"odelm: error: unknown option {lightning}: the Lightning form of odelm train is gone; "
        f"write {run_form}\n"
    )
    assert main([command, *given, run_form, "3", "--print_config"]) == 0


@pytest.mark.slow
def test_a_short_option_means_its_dotted_option():
    def given(command: str, *argv: str) -> dict:
        config = ["--config", "c.yaml"] if command == "train" else []
        found = given_options(parse([command, *config, *argv])[1])
        found.pop("config", None)
        return found

    for command in ("compare",):
        for flag, key in SHORT_FLAGS.items():
            value = "text" if flag == "--corpus" else "mini" if flag == "--protocol" else "3"
            section, name = key.split(".")
            dotted = given(command, f"--{key}", value)
            assert given(command, flag, value) == dotted == {section: {name: dotted[section][name]}}
        assert given(command, "--corpus", "text") == {"data": {"corpus": "text"}}


def test_data_corpus_help_lists_every_corpus_of_the_registry(capsys):
    assert set(CORPUS_NAMES) == {"grammar", "ptb", "wikitext2", "wikitext2-raw", "text"}
    for parser in (train_parser(), compare_parser()):
        (action,) = [a for a in parser._actions if a.option_strings == ["--data.corpus"]]
        assert all(name in action.help for name in CORPUS_NAMES), action.help
        (short,) = [a for a in parser._actions if a.option_strings == ["--corpus"]]
        assert tuple(short.choices) == CORPUS_NAMES


def _config(tmp_path):
    path = tmp_path / "c.yaml"
    model = {"family": "ode_transformer", "preset": "small", "block": "rk2"}
    path.write_text(yaml.safe_dump({"name": "c", "out_dir": str(tmp_path), "model": model}))
    return path


def _resolved(path, *argv: str) -> RunConfig:
    values = given_options(parse(["train", "--config", str(path), *argv])[1])
    values.pop("config", None)
    return parse_config(values)


def test_model_option_replaces_the_files_model_section(tmp_path, capsys):
    path = _config(tmp_path)
    lstm = "{family: neuralode_lm, name: lstm, embed_dim: 32, hidden_dim: 32}"
    config = _resolved(path, "--model", lstm)
    assert config.model == {
        "family": "neuralode_lm",
        "name": "lstm",
        "embed_dim": 32,
        "hidden_dim": 32,
    }
    assert isinstance(build_model(config.model, 50), LSTMLM)  # no "unexpected ... 'preset'"
    assert _resolved(path, f"--model={lstm}", "--model.hidden_dim", "48").model["hidden_dim"] == 48
    assert main(["train", "--config", str(path), "--model", lstm, "--print_config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"] == config.model


def test_model_key_option_edits_one_key(tmp_path):
    config = _resolved(_config(tmp_path), "--model.block", "rk4", "--model.d_model", "32")
    assert config.model == {
        "family": "ode_transformer",
        "preset": "small",
        "block": "rk4",
        "d_model": 32,
    }


def test_the_model_help_documents_both_forms_and_its_example_builds(capsys):
    (action,) = [a for a in train_parser()._actions if a.option_strings == ["--model"]]
    assert "replaces the model section" in action.help
    assert "--model.KEY VALUE edits one key" in action.help
    (example,) = re.findall(r"--model '(\{.*?\})'", " ".join(action.help.split()))
    spec = yaml.safe_load(example)
    assert spec["family"] == "neuralode_lm" and spec["name"] == "lstm"
    assert isinstance(build_model(spec, 50), LSTMLM)
