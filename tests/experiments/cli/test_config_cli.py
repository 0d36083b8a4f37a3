"""Configuration on jsonargparse: dotted overrides, ``--print_config``, numbers, named errors.

``odelm train`` and ``odelm compare`` take every config key as ``--section.key VALUE``, one
form (the run form); the resolved config is what ``--print_config`` prints and what a run
trains with.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from experiments.cli.main import main
from experiments.cli.options import options_parser, train_parser
from experiments.models.build import build_model, model_keys, model_keys_markdown
from experiments.training.config import (
    ConfigError,
    RunConfig,
    add_run_arguments,
    load_config,
    parse_config,
)
from tests.support.paths import ROOT

EXAMPLE = ROOT / "experiments" / "configs" / "example.yaml"


def printed(capsys, *argv: str) -> list[dict]:
    """The YAML documents ``odelm ... --print_config`` prints."""
    capsys.readouterr()
    assert main([*argv, "--print_config"]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def test_dotted_overrides_reach_the_resolved_config(capsys):
    base = load_config(EXAMPLE)
    (resolved,) = printed(
        capsys,
        *("train", "--config", str(EXAMPLE)),
        *("--optim.lr", "3e-4", "--trainer.max_steps", "20", "--model.d_model", "32"),
        *("--data.stateful", "true", "--trainer.val_every", "epoch"),
        *("--optim.grad_clip", "null"),
    )
    assert resolved["optim"]["lr"] == 3e-4 and isinstance(resolved["optim"]["lr"], float)
    assert resolved["trainer"]["max_steps"] == 20
    assert resolved["trainer"]["val_every"] == "epoch"
    assert resolved["optim"]["grad_clip"] is None
    assert resolved["data"]["stateful"] is True
    # one model key replaced, the others kept from the file
    assert resolved["model"] == {**base.model, "d_model": 32}
    # everything not given is the file's value
    assert resolved["optim"]["schedule"] == base.optim.schedule == "inverse_sqrt"
    assert resolved["data"]["batch_size"] == base.data.batch_size
    # what is printed is a complete config: it loads back to the run config trained
    again = parse_config(resolved)
    assert again.trainer.val_every == "epoch" and again.trainer.max_steps == 20
    assert again.optim.lr == 3e-4 and again.model["d_model"] == 32


def test_print_config_prints_every_key(capsys):
    (resolved,) = printed(capsys, "train", "--config", str(EXAMPLE))
    assert parse_config(resolved) == load_config(EXAMPLE)
    assert set(resolved) == {f.name for f in dataclasses.fields(RunConfig)}
    assert set(resolved["trainer"]) >= {"max_steps", "max_time_s", "logger", "num_threads"}


def test_unquoted_exponent_numbers_are_floats(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {family: reference}\n"
        "optim: {lr: 1e-3, weight_decay: 1E-5, label_smoothing: 1e-1}\n"
        "trainer: {max_time_s: 3e2}\n"
    )
    loaded = load_config(config)
    assert loaded.optim.lr == 1e-3 and isinstance(loaded.optim.lr, float)
    assert loaded.optim.weight_decay == 1e-5
    assert loaded.optim.label_smoothing == 0.1
    assert loaded.trainer.max_time_s == 300.0


def test_aliases_mean_their_dotted_keys(capsys):
    argv = ("train", "--config", str(EXAMPLE))
    (short,) = printed(capsys, *argv, "--max-steps", "7", "--num-threads", "1", "--download")
    (dotted,) = printed(
        capsys, *argv, "--trainer.max_steps", "7", "--trainer.num_threads", "1",
        "--data.download", "true",
    )  # fmt: skip
    assert short == dotted
    assert short["trainer"]["max_steps"] == 7 and short["data"]["download"] is True


def test_the_command_line_lies_over_the_recipe_which_lies_under_the_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("recipe: lstm-sgd\nmodel: {family: reference}\noptim: {grad_clip: 0.5}\n")
    (resolved,) = printed(capsys, "train", "--config", str(config))
    assert resolved["optim"]["lr"] == 20.0  # the recipe's
    assert resolved["optim"]["grad_clip"] == 0.5  # the file's, over the recipe's 0.25
    (resolved,) = printed(capsys, "train", "--config", str(config), "--optim.lr", "5")
    assert resolved["optim"]["lr"] == 5.0 and resolved["optim"]["optimizer"] == "sgd"
    # --recipe layers the recipe's file where it is given, as --config would
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: {family: reference}\noptim: {grad_clip: 0.5}\n")
    (resolved,) = printed(capsys, "train", "--recipe", "adam", "--config", str(mine))
    assert resolved["optim"]["optimizer"] == "adam" and resolved["optim"]["grad_clip"] == 0.5
    assert resolved["recipe"] == "adam"
    (resolved,) = printed(capsys, "train", "--config", str(mine), "--recipe", "adam")
    assert resolved["optim"]["grad_clip"] == 1.0  # the recipe's, given after the file


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--optim.lr", "fast"], "odelm: error: --optim.lr must be float >=0, got 'fast'"),
        (
            ["--optim.lrr", "3"],
            "odelm: error: unknown option --optim.lrr; did you mean --optim.lr? odelm train --help",
        ),
        (["--out-dir", "x"], "odelm: error: unknown option --out-dir; did you mean --out_dir?"),
        (
            ["--optim.learning_rate", "3"],
            "odelm: error: unknown option --optim.learning_rate; odelm",
        ),
        (["--trainer.max_steps", "0"], "odelm: error: --trainer.max_steps = 0 is out of range"),
        (
            ["--trainer.max_steps", "2.5"],
            "odelm: error: --trainer.max_steps must be int >=1 or null, got",
        ),
        (["--recipe", "nope"], "odelm: error: recipe = 'nope' is not one of adam, lstm-sgd"),
        (["--data.bptt", "0"], "odelm: error: --data.bptt = 0 is out of range; it must be >= 1"),
    ],
)
def test_a_bad_option_is_one_named_line(capsys, options, message):
    assert main(["train", "--config", str(EXAMPLE), *options, "--print_config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message) and captured.err.count("\n") == 1


def test_a_bad_file_value_is_named_with_its_file_and_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {family: reference}\ntrainer: {logger: csv}\n")
    with pytest.raises(ConfigError, match=rf"{config}.trainer.logger must be list\[str\]"):
        load_config(config)
    config.write_text("model: {family: reference}\noptim: 3\n")
    with pytest.raises(ConfigError, match=rf"{config}.optim must be a mapping, got int"):
        load_config(config)
    config.write_text("model: {family: reference}\nnme: x\n")
    with pytest.raises(ConfigError, match=rf"unknown key {config}.nme; valid keys in {config}:"):
        load_config(config)


def test_train_needs_a_config_or_a_model_and_says_so(capsys):
    assert main(["train", "--optim.lr", "1e-3"]) == 2
    assert capsys.readouterr().err == (
        "odelm: error: odelm train needs --config FILE, or a model on the command line: "
        "--model.family ode_transformer (or neuralode_lm, reference; odelm models lists their "
        "keys)\n"
    )


def test_every_option_of_train_and_compare_has_a_help_line_and_a_type():
    """Help lines come from the config dataclasses' docstrings."""
    train = [a for a in train_parser()._actions if a.option_strings and a.dest != "help"]
    assert {"optim.lr", "trainer.val_every", "trainer.num_threads", "model"} <= {
        a.dest for a in train
    }
    for action in train:
        assert action.help, action.dest
    for grid in (False, True):
        parser = options_parser("odelm", "test")
        add_run_arguments(parser, grid=grid)
        options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
        keys = {a.dest for a in options}
        assert {"optim.lr", "trainer.max_steps", "data.corpus", "model", "eval.decode"} <= keys
        for action in options:
            if action.help == "Path to a configuration file.":  # jsonargparse's --optim FILE
                continue
            assert action.help and "(type:" not in action.help.split("(")[0], action.dest


@pytest.mark.slow
def test_train_with_dotted_overrides_trains_what_it_printed(tmp_path, capsys, tiny_config):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tmp_path, name="dotted")))
    argv = ["train", "--config", str(config), "--optim.lr", "1e-3", "--trainer.max_steps", "20"]
    (resolved,) = printed(capsys, *argv)
    assert main([*argv, "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"wrote {tmp_path / 'dotted'}"
    result = json.loads(lines[-2])
    assert result["steps"] == 20
    saved = load_config(tmp_path / "dotted" / "config.yaml")
    assert saved.to_dict() == parse_config(resolved).to_dict()


def test_compare_overrides_every_run_and_prints_each_config(tmp_path, capsys, tiny_model):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "shared": {"data": {"corpus": "grammar"}, "trainer": {"max_steps": 50}},
                "runs": [
                    {"name": "a", "model": tiny_model},
                    {"name": "b", "model": {**tiny_model, "block": "rk4"}},
                ],
            }
        )
    )
    argv = ("compare", "--grid", str(grid), "--out", str(tmp_path / "out"), "--seeds", "2")
    configs = printed(capsys, *argv, "--trainer.max_steps", "9", "--optim.lr", "2e-3")
    assert [c["name"] for c in configs] == ["a-seed0", "b-seed0", "a-seed1", "b-seed1"]
    assert {c["trainer"]["max_steps"] for c in configs} == {9}
    assert {c["optim"]["lr"] for c in configs} == {2e-3}
    assert [c["model"]["block"] for c in configs] == ["rk2", "rk4", "rk2", "rk4"]
    assert main([*argv, "--name", "x", "--print_config"]) == 2  # a grid names its runs
    assert "unknown option --name" in capsys.readouterr().err


def test_documented_model_keys_are_the_code_s():
    readme = (ROOT / "docs" / "usage.md").read_text()
    block = readme.split("<!-- model-keys")[1].split("-->", 1)[1].split("<!-- /model-keys -->")[0]
    assert block.strip() == model_keys_markdown().strip()


def test_every_listed_key_is_accepted_by_its_model():
    """Each family's listed keys, passed at their listed defaults, build a model (a key the
    constructor does not take would be refused)."""
    keys = model_keys()
    vocab = 11
    small = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "max_positions": 32}
    ode_transformer = {k: v for k, v in keys["ode_transformer"].items() if k != "preset"}
    assert build_model({"family": "ode_transformer", **ode_transformer, **small}, vocab)
    lstm = {**keys["neuralode_lm: ode-lstm"], "embed_dim": 8, "hidden_dim": 8, "field_hidden": 8}
    solver = keys["solver: {...} (ODE heads, node-transformer)"]
    spec = {"family": "neuralode_lm", "name": "ode-lstm", **lstm, "solver": solver}
    assert build_model(spec, vocab)
    node = {**keys["neuralode_lm: node-transformer"], **small, "solver": solver}
    assert build_model({"family": "neuralode_lm", "name": "node-transformer", **node}, vocab)
    reference = {**keys["reference: transformer"], **small}
    assert build_model({"family": "reference", "name": "transformer", **reference}, vocab)


def test_the_example_config_builds_its_model():
    config = load_config(EXAMPLE)
    model = build_model(config.model, vocab_size=50)
    assert model.config.block == "rk2" and model.config.d_model == 64


def test_nested_model_keys_override_one_at_a_time_and_read_exponents(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {family: neuralode_lm, name: ode-lstm, embed_dim: 8, hidden_dim: 8,\n"
        "        solver: {method: dopri5, rtol: 1e-3, atol: 1e-4}}\n"
    )
    assert load_config(config).model["solver"] == {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4}
    (resolved,) = printed(capsys, "train", "--config", str(config), "--model.solver.rtol", "1e-6")
    assert resolved["model"]["solver"] == {"method": "dopri5", "rtol": 1e-6, "atol": 1e-4}
    assert resolved["model"]["embed_dim"] == 8
