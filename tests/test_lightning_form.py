"""``odelm train`` is a LightningCLI (``experiments.cli.lightning_cli.OdelmCLI``) whose config
is the Lightning form; every published config, written in the run form, loads by
translation on read into the very ``RunConfig`` (and identity hash) it read as before
(``experiments.training.lightning_form``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from experiments.cli.lightning_cli import OdelmCLI, cli_parser, read_lightning
from experiments.cli.main import main
from experiments.comparison.compare import expand_grid
from experiments.config_errors import ConfigError
from experiments.training.config import (
    RECIPE_DIR,
    RECIPES,
    RunConfig,
    load_config,
    load_run_config,
    load_yaml,
    parse_config,
)
from experiments.training.lightning_form import from_lightning, odelm_model, to_lightning
from experiments.training.runs import config_sha256

ROOT = Path(__file__).resolve().parents[1]
GRIDS = sorted((ROOT / "experiments" / "configs" / "grids").glob("*.yaml")) + sorted(
    (ROOT / "docs" / "results").rglob("grid.yaml")
)
RUN_CONFIGS = [ROOT / "experiments" / "configs" / "example.yaml"]
"""Every published run config (a grid is read by ``odelm compare``, its runs below;
``experiments/configs/verdicts.yaml`` is the verdict table's list, not a config;
``experiments/configs/recipes`` are in the Lightning form already)."""


def test_every_file_under_experiments_configs_is_covered():
    covered = {*GRIDS, *RUN_CONFIGS, *RECIPE_DIR.glob("*.yaml")}
    files = set((ROOT / "experiments" / "configs").rglob("*.yaml"))
    assert files - covered == {ROOT / "experiments" / "configs" / "verdicts.yaml"}


def _plans(grid: Path) -> list:
    return expand_grid(load_yaml(grid), Path("OUT"), {}, None)


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_a_published_run_config_reads_as_before(path):
    old = load_config(path)
    (new,) = [OdelmCLI(args=["--config", str(path)]).run_config]
    assert new.to_dict() == old.to_dict() and config_sha256(new) == config_sha256(old)


SAMPLE = ("quick", "baselines-ptb-mini", "node-lm-table1-cpu")
"""Grids of every family, recipes and old (0.3) model spellings: the fast tier's sample (the
slow tier reads every run of every grid)."""


@pytest.mark.parametrize("name", SAMPLE)
def test_a_sample_of_grid_runs_reads_as_before(name):
    (grid,) = [path for path in GRIDS if path.stem == name]
    for plan in _plans(grid)[:1]:
        old, new = parse_config(plan.values), read_lightning(plan.values)
        assert new.to_dict() == old.to_dict() and config_sha256(new) == config_sha256(old)


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS, ids=lambda p: p.stem)
def test_every_run_of_every_grid_reads_as_before(grid):
    for plan in _plans(grid):
        old, new = parse_config(plan.values), read_lightning(plan.values)
        assert new.to_dict() == old.to_dict(), plan.values["name"]


def test_a_run_folder_s_config_yaml_reads_as_its_run_did(tmp_path):
    # odelm 0.3 wrote num_layers and no data.order: load_run_config's reading, and the hash
    config = parse_config(
        {"model": {"family": "neuralode_lm", "name": "lstm", "n_layers": 2}, "seed": 3}
    )
    saved = config.to_dict()
    saved["model"] = {"family": "neuralode_lm", "name": "lstm", "num_layers": 2}
    del saved["data"]["order"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    old = load_run_config(path)
    new = OdelmCLI(args=["--config", str(path)]).run_config
    assert old.data.order == new.data.order == 1 and new.model["n_layers"] == 2
    assert config_sha256(new) == config_sha256(old)


def test_the_two_forms_translate_both_ways():
    config = parse_config(
        {
            "model": {"family": "ode_transformer", "block": "rk4"},
            "seed": 7,
            "trainer": {"max_steps": None, "max_epochs": 3, "val_every": "epoch"}
            | {"max_time_s": 5400, "num_threads": 2, "val_batches": 4, "log_every": 5},
        }
    )
    lightning = to_lightning(config.to_dict())
    assert lightning["seed_everything"] == 7 and "seed" not in lightning
    assert lightning["trainer"]["max_steps"] == -1  # Lightning's "no step budget"
    assert lightning["trainer"]["max_time"] == "00:01:30:00"
    assert lightning["trainer"]["val_check_interval"] == 1.0  # once per epoch
    assert lightning["trainer"]["limit_val_batches"] == 4
    assert lightning["trainer"]["log_every_n_steps"] == 5
    assert lightning["run"]["num_threads"] == 2 and "num_threads" not in lightning["trainer"]
    assert parse_config(from_lightning(lightning)).to_dict() == config.to_dict()
    assert read_lightning(lightning).to_dict() == config.to_dict()


def test_a_key_given_in_both_spellings_must_agree():
    with pytest.raises(ConfigError, match="trainer.val_every = 5 and val_check_interval = 6"):
        to_lightning({"trainer": {"val_every": 5, "val_check_interval": 6}})
    both = to_lightning({"trainer": {"max_time": "00:05:00", "max_time_s": 300}})
    assert both["trainer"] == {"max_time": "00:05:00"}
    model = {"family": "reference"}
    for seconds in (1.5, 0.1234567, 86410.0):  # exact, fractions too
        config = parse_config({"model": model, "trainer": {"max_time_s": seconds}})
        assert read_lightning(to_lightning(config.to_dict())).trainer.max_time_s == seconds


def test_a_class_path_model_is_odelm_s_family_and_name():
    lstm = {"class_path": "neuralode_lm.models.LSTMLM", "init_args": {"embed_dim": 8}}
    assert odelm_model(lstm) == {"family": "neuralode_lm", "name": "lstm", "embed_dim": 8}
    short = {"class_path": "ODETransformerLM", "init_args": {"block": "rk2"}}
    assert odelm_model(short) == {"family": "ode_transformer", "block": "rk2"}
    with pytest.raises(ConfigError, match="model.class_path = 'torch.nn.Linear' is not"):
        odelm_model({"class_path": "torch.nn.Linear"})
    # LMTask's form (examples/lightning_cli.yaml): the corpus gives the vocabulary size
    example = yaml.safe_load((ROOT / "examples" / "lightning_cli.yaml").read_text())
    spec = odelm_model(example["model"]["model"])
    config = example["model"]["model"]["config"]
    assert spec == {"family": "ode_transformer"} | {
        k: v for k, v in config.items() if k != "vocab_size"
    }


def test_recipes_are_yaml_files_whose_values_lie_under_the_config(tmp_path):
    assert set(RECIPES) == {"adam", "lstm-sgd", "transformer-field", "transformer-sgd"}
    assert RECIPES["lstm-sgd"]["optim"]["lr"] == 20.0 and RECIPES["lstm-sgd"]["data"]["stateful"]
    path = tmp_path / "run.yaml"
    path.write_text("model: {family: ode_transformer}\nrecipe: lstm-sgd\noptim: {lr: 5}\n")
    config = OdelmCLI(args=["--config", str(path)]).run_config
    assert config.recipe == "lstm-sgd" and config.optim.lr == 5 and config.optim.optimizer == "sgd"
    assert config_sha256(config) == config_sha256(load_config(path))
    # --recipe layers the recipe's file where it is given: here under the config file
    layered = OdelmCLI(args=["--recipe", "adam", "--config", str(path)]).run_config
    assert layered.optim.schedule == "plateau" and layered.optim.lr == 5


def test_config_files_layer_each_over_the_ones_before(tmp_path):
    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    base.write_text("model: {family: ode_transformer}\noptim: {lr: 0.5, weight_decay: 0.1}\n")
    top.write_text("seed_everything: 4\noptim: {lr: 0.25}\ntrainer: {max_steps: 7}\n")
    config = OdelmCLI(args=["--config", str(base), "--config", str(top)]).run_config
    assert (config.optim.lr, config.optim.weight_decay, config.seed) == (0.25, 0.1, 4)
    assert config.trainer.max_steps == 7


def test_help_and_print_config_come_from_lightning_cli(capsys):
    assert main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: odelm train")
    for option in ("--seed_everything", "--trainer.val_check_interval", "--run.num_threads"):
        assert option in text
    assert "--trainer.val_every" not in text and "--trainer.gradient_clip_val" not in text
    assert main(["train", "--model.family", "ode_transformer", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["val_check_interval"] == 100 and printed["seed_everything"] == 0
    assert (
        read_lightning(printed).to_dict()
        == RunConfig(model={"family": "ode_transformer"}).to_dict()
    )
    assert cli_parser() is cli_parser()


def test_seed_everything_true_draws_a_seed_the_run_records(capsys):
    drawn = {OdelmCLI(args=["--model.family", "reference", "--seed", "true"]).run_config.seed}
    drawn.add(OdelmCLI(args=["--model.family", "reference", "--seed", "true"]).run_config.seed)
    assert len(drawn) == 2 and all(0 <= seed < 2**32 for seed in drawn)  # not Lightning's 0
    capsys.readouterr()
    assert main(["train", "--model.family", "reference", "--seed", "-1", "--print_config"]) == 2
    assert "odelm: error: --seed = -1 is out of range; it must be in [0, 4294967295]" in (
        capsys.readouterr().err
    )


def test_parse_config_train_and_compare_read_one_parser():
    """Issue 32: the run config's options are defined once (``run_parser``): ``odelm
    train``'s LightningCLI adds them, ``parse_config`` parses with them (each range a
    constrained type, its error naming the key as the values spell it), ``odelm compare``
    copies them."""
    from experiments.cli.commands import compare_parser
    from experiments.training.run_parser import run_parser

    def options(parser) -> dict[str, object]:
        return {
            a.option_strings[0]: getattr(a, "_typehint", None)
            for a in parser._actions
            if a.option_strings and a.dest not in ("help", "config")
        }

    shared = options(run_parser())
    train, compare = options(cli_parser()), options(compare_parser())
    assert {"--optim.lr", "--run.num_threads", "--trainer.val_check_interval"} <= shared.keys()
    assert shared.items() <= train.items()  # the same options with the same types
    helps = {flag for flag in shared if flag.endswith(".help")}  # jsonargparse's class help
    assert shared.keys() - {"--name", "--out_dir", *helps} <= compare.keys()
    assert compare["--optim.lr"] is shared["--optim.lr"]  # odelm's ranged types, as train's
    from experiments.cli.commands import given_options

    args = compare_parser().parse_args(
        ["--preset", "quick", "--num-threads", "1", "--optim.lr", "0.5"]
    )
    given = given_options(args)  # written into each run's config file: plain YAML numbers
    assert yaml.safe_load(yaml.safe_dump(given)) == given
    assert type(given["run"]["num_threads"]) is int and type(given["optim"]["lr"]) is float
    model = {"family": "reference"}
    with pytest.raises(ConfigError, match=r"^run\.num_threads = 0 is out of range; it must be"):
        parse_config({"model": model, "run": {"num_threads": 0}})
    with pytest.raises(ConfigError, match=r"^trainer\.num_threads = 0 is out of range"):
        parse_config({"model": model, "trainer": {"num_threads": 0}})
    with pytest.raises(ConfigError, match=r"^optim\.lr = -1\.0 is out of range; it must be >= 0$"):
        parse_config({"model": model, "optim": {"lr": -1.0}})
