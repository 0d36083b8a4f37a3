"""One API across Python and the CLI: every ``odelm generate`` / ``odelm eval`` option is a
keyword of ``TrainedRun.generate`` / ``TrainedRun.evaluate`` with the same name and default,
both give the same output, and every model has Hugging Face's ``num_parameters()``."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import pytest
import torch

import experiments
from experiments.cli.main import build_parser, main
from experiments.evaluation.trained import TrainedRun
from experiments.models.build import count_parameters
from experiments.reference import BigramLM, WordLMTransformer
from experiments.training.train import train
from neuralode_lm.models import build_model as build_neural_ode
from ode_transformer import ODETransformerLM
from ode_transformer.encoder import ODETransformerEncoder
from ode_transformer.presets import config_from_preset
from odelm.pretrained import ARCHITECTURES

VOCAB = 30
TINY_GPT2 = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32}
SOLVER = {"method": "rk4", "step_size": 0.5}

CLI_ONLY = {
    "json": "print one JSON object: evaluate() returns that dict",
    "num_threads": "torch.set_num_threads(N) before the call",
    "run": "experiments.load_run(RUN) makes the TrainedRun",
    "device": "experiments.load_run(RUN, device=...) puts the model there",
}
"""Options that only the shell needs, with what a Python user does instead."""

PYTHON_METHOD = {"generate": TrainedRun.generate, "eval": TrainedRun.evaluate}


def subcommand(name: str) -> argparse.ArgumentParser:
    """The argparse parser of ``odelm NAME``."""
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError("odelm has no subcommands")


@pytest.mark.parametrize("command", list(PYTHON_METHOD))
def test_every_cli_option_is_a_python_keyword_with_the_same_default(command):
    parameters = inspect.signature(PYTHON_METHOD[command]).parameters
    checked = []
    for action in subcommand(command)._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in CLI_ONLY:
            continue
        assert action.dest in parameters, f"odelm {command} {action.option_strings} missing"
        default = parameters[action.dest].default
        if default is not inspect.Parameter.empty:  # a required CLI option may have one
            assert default == action.default, f"{action.dest}: {default!r} != {action.default!r}"
        checked.append(action.dest)
    assert len(checked) >= 7  # the walk found the options (not an empty parser)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("parity")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = ["the cat sat on the mat", "a dog sat on the cat", "the dog ran"]
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n")
    config = experiments.training.config.parse_config(
        {
            "name": "run",
            "out_dir": str(tmp_path / "runs"),
            "model": {"family": "ode_transformer", "preset": "small", "n_layers": 1}
            | {"d_model": 16, "d_ff": 32, "n_heads": 2, "block": "rk2"},
            "data": {"corpus": "text", "data_dir": str(corpus), "batch_size": 2, "bptt": 8},
            "trainer": {"max_steps": 3, "val_every": 3, "progress_bar": False},
            "eval": {"bleu_sentences": 2},
        }
    )
    train(config)
    return tmp_path / "runs" / "run"


def cli_output(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "options", [{}, {"strategy": "sample", "seed": 1}, {"strategy": "beam", "num_beams": 2}]
)
@pytest.mark.slow
def test_generate_in_python_equals_odelm_generate(run_dir, capsys, options):
    run = experiments.load_run(run_dir)
    argv = ["generate", str(run_dir), "--prompt", "the cat", "--max-new-tokens", "12"]
    for key, value in options.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    expected = run.generate("the cat", 12, **options)
    assert cli_output(capsys, argv) == expected + "\n"
    assert expected.startswith("the cat") and len(expected.split()) > 2


def test_sampling_seed_is_reproducible_and_matters(run_dir):
    run = experiments.load_run(run_dir)
    draws = {seed: run.generate("the", 30, strategy="sample", seed=seed) for seed in range(4)}
    assert run.generate("the", 30, strategy="sample", seed=1) == draws[1]
    assert len(set(draws.values())) > 1  # 30 draws from a near-uniform model: seeds differ
    own = torch.Generator().manual_seed(1)  # a generator of one's own replaces the seed
    assert run.generate("the", 30, strategy="sample", seed=3, generator=own) == draws[1]


def test_evaluate_in_python_equals_odelm_eval(run_dir, capsys):
    run = experiments.load_run(run_dir)
    argv = ["eval", str(run_dir), "--json", "--split", "valid", "--bleu-sentences", "1"]
    printed = json.loads(cli_output(capsys, argv))
    result = run.evaluate("valid", bleu_sentences=1)
    timings = {"seconds"}
    assert {k: v for k, v in result.items() if k not in timings} == {
        k: v for k, v in printed.items() if k not in timings
    }
    assert result["split"] == "valid"
    recorded = json.loads((run_dir / "result.json").read_text())
    assert run.perplexity(split="test") == pytest.approx(recorded["test_ppl_per_word"], rel=1e-9)
    with pytest.raises(experiments.config_errors.ConfigError, match="prompt_len = 0 is out"):
        run.evaluate(prompt_len=0)


def every_architecture() -> dict[str, torch.nn.Module]:
    small = {"embed_dim": 8, "hidden_dim": 8}
    ode_config = config_from_preset("small", vocab_size=VOCAB, block="rk2", d_model=16, d_ff=32)
    models = [
        build_neural_ode("lstm", VOCAB, **small),
        build_neural_ode("ode-lstm", VOCAB, **small, field_hidden=8, solver=SOLVER),
        build_neural_ode("gpt2", VOCAB, config=TINY_GPT2),
        build_neural_ode("ode-gpt2", VOCAB, config=TINY_GPT2, solver=SOLVER),
        build_neural_ode("aug-ode-gpt2", VOCAB, config=TINY_GPT2, solver=SOLVER),
        build_neural_ode(
            "node-transformer",
            VOCAB,
            d_model=16,
            n_heads=2,
            d_ff=32,
            solver={"method": "rk4"},
            steps=2,
        ),
        ODETransformerLM(ode_config),
        ODETransformerEncoder(ode_config),
        BigramLM(VOCAB),
        WordLMTransformer(VOCAB, d_model=16, d_ff=32, n_layers=1),
    ]
    return {f"{type(m).__module__}:{type(m).__qualname__}": m for m in models}


def test_every_architecture_counts_its_parameters_like_hugging_face():
    models = every_architecture()
    assert set(models) == ARCHITECTURES
    for name, model in models.items():
        total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert model.num_parameters() == total == count_parameters(model), name
        assert model.num_parameters(only_trainable=True) == total, name
        frozen = next(model.parameters())
        frozen.requires_grad_(False)
        assert model.num_parameters(only_trainable=True) == total - frozen.numel(), name
        assert model.num_parameters() == total, name


def test_tied_weights_are_counted_once():
    config = config_from_preset("small", vocab_size=VOCAB, block="rk2", d_model=16, d_ff=32)
    model = ODETransformerLM(config)  # its output projection is the embedding matrix
    weights = [p for _, p in model.named_parameters(remove_duplicate=False)]
    tied = [p for i, p in enumerate(weights) if any(q is p for q in weights[:i])]
    assert [tuple(p.shape) for p in tied] == [(VOCAB, 16)]
    assert model.num_parameters() == sum(p.numel() for p in weights) - VOCAB * 16
