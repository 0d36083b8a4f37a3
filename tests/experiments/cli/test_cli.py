"""The command line as a newcomer reads it: a version, and a help line with a default for
every option of every subcommand; ``bench`` names the extra a missing backend needs."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from experiments.cli.bench import judge
from experiments.cli.main import build_parser, main
from experiments.cli.options import HelpFormatter
from odelm import __version__


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"odelm {__version__}"


def _parsers(parser: argparse.ArgumentParser, path: str = "odelm"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_has_a_help_line_that_states_its_default():
    formatter = HelpFormatter("odelm")
    undocumented = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            if isinstance(action, argparse._SubParsersAction):
                continue
            if action.help == "Path to a configuration file.":  # jsonargparse's --optim FILE
                continue
            if action.help == argparse.SUPPRESS:  # a hidden old spelling, not in --help
                continue
            name = f"{path} {'/'.join(action.option_strings) or action.dest}"
            help_line = formatter._get_help_string(action) or ""
            if not help_line.strip():
                undocumented.append(f"{name}: no help")
            elif action.option_strings and not action.required and "default" not in help_line:
                undocumented.append(f"{name}: no default in {help_line!r}")
    assert undocumented == []


def test_help_of_every_subcommand_renders(capsys):
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        assert text.startswith("usage: " + path), path


def test_bench_names_the_extra_of_a_missing_backend(monkeypatch):
    from benchmarks import ode_heads as benchmarks

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "torchdyn" else real_find_spec(name, *args),
    )
    skipped = {record["metric"]: judge(record) for record in benchmarks.skipped_backends()}
    record = skipped["facade_over_direct_torchdyn"]
    assert record["value"] is None and record["met"] is None  # --strict does not fail on it
    assert "not installed" in record["note"] and "odelm[torchdyn]" in record["note"]
    callers = benchmarks._direct_callers(None, None, None, 1e-3, 1e-4)
    assert "torchdyn" not in callers and "torchdiffeq" in callers


def test_detokenize_turns_each_eos_into_a_line_break():
    from experiments.data.tokenization import WordTokenizer
    from experiments.evaluation.trained import detokenize

    tokenizer = WordTokenizer(["<eos>", "the", "cat", "sat"])
    assert detokenize(tokenizer, [1, 2, 0, 3, 0, 1]) == "the cat\nsat\nthe"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> str:
    import yaml

    folder = tmp_path_factory.mktemp("generate")
    config = folder / "tiny.yaml"
    model = {"family": "ode_transformer", "preset": "small", "n_layers": 1, "d_model": 16}
    config.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "out_dir": str(folder),
                "model": {**model, "d_ff": 32},
                "trainer": {"max_steps": 2, "val_every": 2, "progress_bar": False},
            }
        )
    )
    assert main(["train", "--config", str(config)]) == 0
    return str(folder / "tiny")


@pytest.mark.slow
def test_generate_samples_reproducibly_from_its_seed(tiny_run, capsys):
    def generate(*options: str) -> str:
        argv = ["generate", tiny_run, "--prompt", "a dog", "--max-new-tokens", "30"]
        assert main([*argv, *options]) == 0
        return capsys.readouterr().out

    first = generate("--strategy", "sample", "--seed", "1")
    assert generate("--strategy", "sample", "--seed", "1") == first
    assert generate("--strategy", "sample", "--seed", "2") != first
    assert first.startswith("a dog") and "<eos>" not in first
    assert all(line == line.strip() for line in first.splitlines())
    # Sampling from the top 1 token is greedy decoding, whatever the seed and temperature.
    greedy = generate()
    top1 = generate("--strategy", "sample", "--top-k", "1", "--temperature", "3", "--seed", "5")
    assert top1 == greedy


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "odelm needs a subcommand, one of data, bench, models, train, eval, generate"),
        (["nope"], "argument command: invalid choice: 'nope'"),
        (["data"], "odelm data needs a subcommand, one of info, download; see odelm data --help"),
        (["data", "info"], "odelm data info needs --corpus; see odelm data info --help"),
        (["eval"], "odelm eval needs RUN; see odelm eval --help"),
        (["eval", "r", "--nope"], "unknown option --nope; odelm eval --help lists the options"),
        (["eval", "r", "--bleu-sentences", "x"], "--bleu-sentences must be int, got 'x'"),
        (["bench", "corpus-load", "--num-threads", "0"], "--num-threads = 0 is out of range"),
        (["compare", "--preset", "quick", "--seeds", "x"], "--seeds must be int, got 'x'"),
    ],
)
def test_every_command_line_error_is_one_line(capsys, argv, message):
    """One parser for every subcommand: a wrong command line is one line naming the
    option and the subcommand's help, never argparse's usage block."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"odelm: error: {message}"), captured.err


def test_one_parser_holds_every_subcommand_data_one_level_down():
    paths = [path for path, _ in _parsers(build_parser())]
    assert paths == [
        "odelm",
        *("odelm data", "odelm data info", "odelm data download"),
        *(f"odelm {name}" for name in ("bench", "models", "train", "eval", "generate")),
        *("odelm compare", "odelm verdicts", "odelm discretize"),
    ]


def test_model_keys_nest_at_any_depth_and_merge(tmp_path):
    from experiments.cli.options import train_parser

    config = tmp_path / "c.yaml"
    config.write_text("model: {family: ode_transformer, block: rk4}\n")

    def model(*argv: str) -> dict:
        return train_parser().parse_args(["--config", str(config), *argv]).model

    nested = model("--model.solver.rtol", "1e-6", "--model.solver.atol", "1e-7")
    assert nested == {"family": "ode_transformer", "block": "rk4"} | {
        "solver": {"rtol": 1e-6, "atol": 1e-7}
    }
    whole = model("--model", "{family: reference}", "--model.solver.options.step_size", "0.5")
    # --model '{...}' replaces the file's section instead of merging into it
    assert whole == {"family": "reference", "solver": {"options": {"step_size": 0.5}}}
