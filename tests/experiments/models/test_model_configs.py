"""One typed configuration per model: the ``model:`` section is checked at parse time, the
layer count is ``n_layers`` everywhere, and a model saved under the old spellings loads."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest
import torch
import yaml

from experiments.cli.main import main
from experiments.cli.options import train_parser as cli_parser
from experiments.models.schema import model_keys_help, schemas
from neuralode_lm import (
    LSTMLM,
    ModelConfigError,
    NODETransformerConfig,
    NODETransformerLM,
    ODEGPT2Config,
    ODEHeadConfig,
    ODELSTMConfig,
    build_model,
)
from odelm.errors import ConfigError
from odelm.pretrained import load_pretrained
from tests.support.paths import ROOT

EXAMPLE = ROOT / "experiments" / "configs" / "example.yaml"


def error_line(capsys, *argv: str) -> str:
    """The one stderr line of a refused ``odelm train ... --print_config`` (nothing built)."""
    capsys.readouterr()
    assert main(["train", "--config", str(EXAMPLE), *argv, "--print_config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    return captured.err


def test_an_unknown_model_key_is_refused_at_parse_time_naming_the_models_keys(capsys):
    err = error_line(capsys, "--model.d_modle", "32")
    assert err.startswith("odelm: error: model.d_modle is not a key of ode_transformer; ")
    assert "its keys: family, preset, d_model, n_heads, d_ff, n_layers" in err
    lstm = "{family: neuralode_lm, name: lstm, embed_dim: 8, block: rk2}"
    err = error_line(capsys, "--model", lstm)
    assert "model.block is not a key of neuralode_lm lstm; its keys: family, name, embed_dim" in err


@pytest.mark.parametrize(
    "option,value,valid",
    [
        (
            "block",
            "rk9",
            (
                "residual, rk2, rk2_gamma1, rk3, rk4, rk4_38, midpoint, euler, rk2_learnable, "
                "rk2_gate, custom"
            ),
        ),
        ("stack", "tower", "plain, leapfrog, multistep, dlcl, polynet, macaron"),
        ("positions", "rotary", "learned, sinusoidal"),
    ],
)
def test_a_bad_choice_names_the_valid_values(capsys, option, value, valid):
    err = error_line(capsys, f"--model.{option}", value)
    assert f"model.{option} must be one of {valid}, got {value!r}" in err


def test_choices_of_the_other_models_are_literal_types(capsys):
    node = "{family: neuralode_lm, name: node-transformer, time_conditioning: clock}"
    err = error_line(capsys, "--model", node)
    valid = "none, concat, film, weights, hypernetwork"
    assert f"model.time_conditioning must be one of {valid}, got 'clock'" in err
    ode_lstm = "{family: neuralode_lm, name: ode-lstm, augment_init: ones}"
    assert "must be one of zeros, first, got 'ones'" in error_line(capsys, "--model", ode_lstm)
    for label, schema in schemas().items():
        hints = typing.get_type_hints(schema)
        for name in ("block", "stack", "field", "augment_init", "causal_mode", "positions"):
            if name in hints:
                assert typing.get_origin(hints[name]) is typing.Literal, (label, name)


@pytest.mark.parametrize(
    "model,old",
    [
        ("{family: neuralode_lm, name: lstm, num_layers: 2}", "num_layers"),
        ("{family: neuralode_lm, name: node-transformer, n_blocks: 2}", "n_blocks"),
    ],
)
def test_old_layer_count_spellings_are_refused_with_the_new_key(capsys, model, old):
    err = error_line(capsys, "--model", model)
    assert f"model.{old} was renamed n_layers" in err and "write n_layers: 2" in err


def test_constructors_refuse_old_spellings_with_a_hint():
    with pytest.raises(
        ModelConfigError, match="num_layers was renamed n_layers .*; write n_layers: 2"
    ):
        build_model("ode-lstm", 20, num_layers=2)
    with pytest.raises(ModelConfigError, match="n_blocks was renamed n_layers"):
        NODETransformerLM(20, n_blocks=2)
    with pytest.raises(ModelConfigError, match="unknown ODELSTMConfig key preset; valid: "):
        build_model("ode-lstm", 20, preset="small")
    assert build_model("lstm", 20, n_layers=3).encoder.lstm.num_layers == 3
    assert len(NODETransformerLM(20, d_model=8, n_heads=2, d_ff=8, n_layers=3).fields) == 3


@pytest.mark.parametrize(
    "config_class, options, message",
    [
        (ODEHeadConfig, {"integration_time": 0.0}, "integration_time S must be positive"),
        (ODELSTMConfig, {"augment_init": "last"}, "unknown augment_init 'last'; valid: zeros"),
        (ODELSTMConfig, {"kinetic_weight": -1.0}, "kinetic_weight must be >= 0, got -1.0"),
        (ODELSTMConfig, {"dropout": 1.5}, "dropout must be in [0, 1), got 1.5"),  # LSTMConfig's
        (ODELSTMConfig, {"reconstruction": True, "exact_causal_eval": True}, "reconstruction"),
        (ODEGPT2Config, {"exact_causal_eval": True, "solver": {"method": "bosh3"}}, "'bosh3'"),
        (NODETransformerConfig, {"n_layers": 0}, "n_layers must be a positive integer, got 0"),
        (NODETransformerConfig, {"d_model": 30, "n_heads": 4}, "d_model=30 is not divisible"),
        (NODETransformerConfig, {"time_conditioning": "sine"}, "time_conditioning 'sine'"),
        (NODETransformerConfig, {"weight_basis": 4}, "weight_basis applies to time_conditioning"),
    ],
)
def test_a_bad_option_is_refused_by_its_config_class(config_class, options, message):
    """The config class refuses it on construction, before any module exists."""
    with pytest.raises(ConfigError) as refused:
        config_class(**options)
    assert message in str(refused.value)


def test_model_configs_are_frozen():
    for schema in schemas().values():
        assert schema.__dataclass_params__.frozen, schema.__name__  # type: ignore[attr-defined]
    config = dataclasses.replace(schemas()["neuralode_lm ode-lstm"](), embed_dim=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.embed_dim = 9  # type: ignore[misc]
    assert config.lstm().embed_dim == 8 and config.head().field_hidden == 100


@pytest.mark.parametrize(
    "make,old",
    [
        (lambda: LSTMLM(30, embed_dim=8, hidden_dim=8, n_layers=2), "num_layers"),
        (
            lambda: NODETransformerLM(
                30, d_model=8, n_heads=2, d_ff=8, n_layers=2, steps=1, solver={"method": "rk4"}
            ),
            "n_blocks",
        ),
    ],
)
def test_a_model_saved_with_the_old_spelling_loads(tmp_path, make, old):
    torch.manual_seed(0)
    model = make().eval()
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    assert saved["config"]["n_layers"] == 2
    saved["config"] = {old if k == "n_layers" else k: v for k, v in saved["config"].items()}
    path.write_text(json.dumps(saved))  # as odelm 0.3 wrote it
    loaded = load_pretrained(tmp_path)
    tokens = torch.randint(0, 30, (2, 5))
    torch.testing.assert_close(loaded(tokens)[0], model(tokens)[0], rtol=0, atol=0)


def test_train_help_lists_the_typed_keys_of_every_model():
    text = " ".join(cli_parser().format_help().split())
    assert " ".join(model_keys_help().split()) in text
    for label in (
        "family: ode_transformer",
        "family: neuralode_lm, name: ode-lstm",
        "family: reference, name: transformer",
    ):
        assert label in text
    assert "n_layers: int = 1" in text and "field: {mlp,time-concat} = 'mlp'" in text


def test_print_config_shows_the_models_typed_keys_as_comments(capsys):
    capsys.readouterr()
    node = "{family: neuralode_lm, name: node-transformer, n_layers: 3}"
    assert main(["train", "--config", str(EXAMPLE), "--model", node, "--print_config"]) == 0
    out = capsys.readouterr().out
    assert "# model: every key of neuralode_lm node-transformer, defaults filled in:" in out
    assert "#   n_layers: 3\n" in out and "#   time_conditioning: none\n" in out
    assert yaml.safe_load(out)["model"] == {**yaml.safe_load(node)}  # the section as given


def test_config_json_is_the_typed_config(tmp_path):
    model = build_model("ode-lstm", 20, embed_dim=8, hidden_dim=8, field_hidden=4)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["config"]
    expected = {
        k: v
        for k, v in dataclasses.asdict(model.config.library_config).items()
        if k != "embeddings"
    }
    assert saved == {"vocab_size": 20, **expected} and saved["field_hidden"] == 4
    # config.json's family is the run config's model.family
    from experiments.reference import BigramLM

    assert BigramLM(5).model_spec()["family"] == "reference"
    assert model.model_spec()["family"] == "neuralode_lm"


@pytest.mark.slow
def test_a_run_folder_of_an_old_version_loads_and_resumes(tmp_path, tiny_config, capsys):
    """An LSTM run whose config.yaml and model config.json say num_layers (as odelm 0.3
    wrote them) loads, evaluates to the same number, and is the same run for resuming."""
    from experiments.evaluation.trained import load_run
    from experiments.training.runfolder import record_run_files
    from experiments.training.runs import config_changes, config_sha256

    lstm = {"family": "neuralode_lm", "name": "lstm", "embed_dim": 8, "hidden_dim": 8}
    values = tiny_config(tmp_path, "run", trainer={"max_steps": 2})
    values["model"] = {**lstm, "n_layers": 2}
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    run_dir = tmp_path / "run"
    new_run = load_run(run_dir)
    before = new_run.evaluate("valid")["ppl"]
    for name in ("config.yaml", "model/config.json"):
        path = run_dir / name
        path.write_text(path.read_text().replace("n_layers", "num_layers"))
    record_run_files(run_dir, ["config.yaml", "tokenizer", "model"])  # as 0.3 recorded them
    assert "num_layers: 2" in (run_dir / "config.yaml").read_text()
    old_run = load_run(run_dir)
    assert old_run.config.model["n_layers"] == 2
    assert old_run.evaluate("valid")["ppl"] == before
    assert config_changes(run_dir, new_run.config) == []
    assert config_sha256(old_run.config) == config_sha256(new_run.config)
