"""``odelm train`` from options alone: no ``--config`` needed, the schema's defaults
(what ``odelm train --print_config`` shows) under the options given; and a wall-clock
budget spelled HH:MM:SS, ``trainer.max_time``, beside
``trainer.max_time_s``, wherever the step and epoch budgets are accepted."""

from __future__ import annotations

import json

import pytest
import yaml

from experiments.cli.main import main
from experiments.training.config import ConfigError, RunConfig, parse_config
from experiments.training.runs import config_sha256
from tests.support.runs import TINY_MODEL, make_tiny_config

TINY_FLAGS = [
    f"--model.{key}={value}" for key, value in TINY_MODEL.items() if key not in ("block",)
]


def printed(capsys, *argv: str) -> list[dict]:
    """The YAML documents ``odelm ... --print_config`` prints."""
    capsys.readouterr()
    assert main([*argv, "--print_config"]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def test_print_config_without_a_config_shows_the_schema_s_defaults(capsys):
    (defaults,) = printed(capsys, "train")
    assert defaults["model"] == {} and defaults["trainer"]["max_steps"] == 1000
    model = {"family": "ode_transformer"}
    assert parse_config({**defaults, "model": model}) == RunConfig(model=model)
    (resolved,) = printed(capsys, "train", "--model.family", "ode_transformer", "--seed", "4")
    assert resolved["seed"] == 4 and resolved["model"] == model
    assert parse_config(resolved) == RunConfig(seed=4, model=model)
    # a random seed: drawn when the config is read, then printed and kept
    drawn = {printed(capsys, "train", "--seed", "random")[0]["seed"] for _ in range(3)}
    assert len(drawn) > 1 and all(0 <= seed < 2**32 for seed in drawn)


def test_without_a_config_train_needs_a_model_and_says_how(capsys):
    assert main(["train", "--corpus", "grammar"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model.family ode_transformer" in err and "--config" in err


@pytest.mark.slow
def test_train_from_options_alone_trains_and_writes_a_run(tmp_path, capsys):
    argv = [
        *("train", "--model.block", "rk4", *TINY_FLAGS, "--corpus", "grammar"),
        *(
            "--trainer.max_time",
            "00:05:00",
            "--max-steps",
            "4",
            "--trainer.val_every",
            "4",
        ),
        *("--data.batch_size", "8", "--data.bptt", "16", "--eval.bleu_sentences", "0"),
        *("--out_dir", str(tmp_path), "--name", "flags", "--num-threads", "1", "--quiet"),
    ]
    (resolved,) = printed(capsys, *argv)
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"wrote {tmp_path / 'flags'}"
    result = json.loads(out[-2])
    assert result["steps"] == 4 and result["test_ppl"] > 1
    saved = yaml.safe_load((tmp_path / "flags" / "config.yaml").read_text())
    assert saved["trainer"]["max_time_s"] == 300.0 and saved["trainer"]["max_time"] is None
    # it trained with the config --print_config showed (--quiet drops only the progress bar)
    assert config_sha256(parse_config(saved)) == config_sha256(parse_config(resolved))
    assert result["config_sha256"] == config_sha256(parse_config(resolved))


@pytest.mark.parametrize(
    ("spelled", "seconds"),
    [("00:05:00", 300.0), ("1:30:00", 5400.0), (5400, 5400.0), ("01:00:00:10", 86410.0)],
)
def test_max_time_is_the_hh_mm_ss_spelling_of_max_time_s(tmp_path, spelled, seconds):
    # 5400: YAML reads an unquoted 1:30:00 as a base-60 integer, seconds already
    config = parse_config(make_tiny_config(tmp_path, trainer={"max_time": spelled}))
    assert config.trainer.max_time_s == seconds and config.trainer.max_time is None
    same = parse_config(make_tiny_config(tmp_path, trainer={"max_time_s": seconds}))
    assert config_sha256(config) == config_sha256(same)  # one budget, however spelled
    both = {"max_time": spelled, "max_time_s": seconds}
    assert parse_config(make_tiny_config(tmp_path, trainer=both)).trainer.max_time_s == seconds


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"max_time": "5 min"}, "trainer.max_time = '5 min' is not a time; it must be HH:MM:SS"),
        ({"max_time": "00:00:00"}, "trainer.max_time = '00:00:00' is out of range"),
        ({"max_time": "00:05:00", "max_time_s": 60}, "(300 s) and trainer.max_time_s = 60"),
    ],
)
def test_a_max_time_that_is_not_a_budget_is_one_line(tmp_path, capsys, trainer, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(make_tiny_config(tmp_path, trainer=trainer))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(make_tiny_config(tmp_path, trainer=trainer)))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_compare_takes_max_time_for_every_run(capsys, tmp_path):
    runs = printed(capsys, "compare", "--preset", "quick", "--trainer.max_time", "00:02:00")
    assert runs and all(run["trainer"]["max_time_s"] == 120.0 for run in runs)
