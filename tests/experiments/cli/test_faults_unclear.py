"""Unclear faults, one table: each ends in ONE line naming what was wrong (the CLI
prints ``odelm: error: ...`` and exits 2; the library raises its ``OdelmError`` class), never a
traceback. Then one test per silently-wrong item it owns: a model too large for memory, a
fixed grid of a billion points, and ranges the command line shares with the config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from experiments.cli.main import main
from experiments.config_errors import ConfigError
from experiments.models.build import build_model, count_parameters, model_keys
from experiments.models.size import estimate_parameters
from experiments.training.config import parse_config
from neuralode_lm.models import build_model as build_neural_ode
from neuralode_lm.solvers import FieldOutputError, MaxStepsExceeded, fixed_grid, grid_steps, solve
from odelm.decoding import MAX_NEW_TOKENS, DecodingError, generate
from odelm.errors import OdelmError
from tests.support.runs import TINY_MODEL, make_tiny_config


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step run of the tiny model (for eval, generate and discretize)."""
    from experiments.training.train import train

    out = tmp_path_factory.mktemp("runs")
    values = make_tiny_config(out, trainer={"max_steps": 2, "val_every": 2})
    train(parse_config(values))
    return out / "run"


def _config_file(folder: Path, **sections: Any) -> str:
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(make_tiny_config(folder / "runs", **sections)))
    return str(path)


def _base_cycle(folder: Path) -> list[str]:
    (folder / "a.yaml").write_text("base: b.yaml\nname: a\n")
    (folder / "b.yaml").write_text("base: a.yaml\n")
    return ["train", "--config", str(folder / "a.yaml")]


def _train(**sections: Any) -> Callable[[Path], list[str]]:
    return lambda folder: ["train", "--config", _config_file(folder, **sections), "--quiet"]


def _one_line_mini(folder: Path) -> list[str]:
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text("the cat sat\n")
    data = {"corpus": "text", "data_dir": str(folder), "protocol": "mini"}
    return ["train", "--config", _config_file(folder, data=data), "--quiet"]


OTHER_FAMILY = {"family": "neuralode_lm", "name": "ode-lstm", "preset": "small", "hidden_dim": 8}
CLI_CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "base cycle": (_base_cycle, "base: files form a cycle"),
    "tableau under block": (
        _train(model={**TINY_MODEL, "block": [[0.5]]}),
        "block must be a block name (residual, rk2",
    ),
    "bpe vocabulary 5": (
        _train(data={"tokenizer": "bpe", "bpe_vocab_size": 5}),
        "data.bpe_vocab_size = 5 is out of range; it must be >= 258",
    ),
    "beta above 1": (
        _train(optim={"betas": [1.5, 0.9]}),
        "optim.betas[0] = 1.5 is out of range; it must be in [0, 1)",
    ),
    "beta of 1": (_train(optim={"betas": [0.9, 1.0]}), "optim.betas[1] = 1.0 is out of range"),
    "label smoothing 1.5": (
        _train(optim={"label_smoothing": 1.5}),
        "optim.label_smoothing = 1.5 is out of range; it must be in [0, 1)",
    ),
    "negative seed": (  # odelm train names the seed as the config file spells it
        _train(seed=-1),
        "seed = -1 is out of range; it must be in [0, 4294967295]",
    ),
    "seed over 2**32-1": (_train(seed=2**32), "seed = 4294967296 is out of range"),
    "data seed negative": (_train(data={"seed": -3}), "data.seed = -3 is out of range"),
    "key of another family": (
        _train(model=OTHER_FAMILY),
        "model.block, model.d_ff, model.d_model, model.n_heads, model.preset "
        + "are not keys of neuralode_lm ode-lstm; its keys: family, name, embed_dim",
    ),
    "mini with one line": (_one_line_mini, "is empty; protocol mini trains on the first 90%"),
    "lr 1000 with clipping": (
        _train(optim={"lr": 1000.0, "grad_clip": 1.0}),
        "training diverged (the perplexity overflows); lower optim.lr",
    ),
    "grad_clip -1": (
        _train(optim={"grad_clip": -1.0}),
        "optim.grad_clip = -1.0 is out of range; it must be > 0 or null",
    ),
}
RUN_CASES: dict[str, tuple[list[str], str]] = {
    "temperature nan": (
        ["generate", "{run}", "--prompt", "", "--strategy", "sample", "--temperature", "nan"],
        "--temperature = nan is out of range; it must be a finite number >= 0.0001",
    ),
    "max new tokens 1e9": (
        ["generate", "{run}", "--prompt", "", "--max-new-tokens", "1000000000"],
        f"max_new_tokens must be an integer in [0, {MAX_NEW_TOKENS}], got 1000000000",
    ),
    "bleu sentences -5": (
        ["eval", "{run}", "--bleu-sentences", "-5"],
        "--bleu-sentences = -5 is out of range; it must be >= 0",
    ),
    "prompt len 0": (["eval", "{run}", "--prompt-len", "0"], "--prompt-len = 0 is out of range"),
    "discretize max batches 0": (
        ["discretize", "{run}", "--max-batches", "0"],
        "--max-batches must be >= 1, got 0",
    ),
    "discretize steps 0": (["discretize", "{run}", "--steps", "2", "0"], "--steps must be >= 1"),
}


def _assert_one_line(code: int, err: str, message: str) -> None:
    assert code == 2
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("odelm: error: "), err
    assert message in err


@pytest.mark.parametrize("case", list(CLI_CASES))
@pytest.mark.slow
def test_cli_fault_is_one_line(case, tmp_path, capsys):
    make_argv, message = CLI_CASES[case]
    code = main(make_argv(tmp_path))
    _assert_one_line(code, capsys.readouterr().err, message)


@pytest.mark.parametrize("case", list(RUN_CASES))
@pytest.mark.slow
def test_cli_fault_on_a_finished_run_is_one_line(case, trained_run, capsys):
    argv, message = RUN_CASES[case]
    code = main([arg.format(run=trained_run) for arg in argv])
    _assert_one_line(code, capsys.readouterr().err, message)


def _lstm(name: str) -> torch.nn.Module:
    return build_neural_ode(name, 50, embed_dim=8, hidden_dim=8)


def _solve_backwards() -> None:
    solve(lambda s, z: -z, torch.ones(2, 3), [1.0, 0.0, 1.0])


def _wrong_shape_field() -> None:
    solve(lambda s, z: z[0], torch.ones(2, 3), 1.0)


LIBRARY_CASES: dict[str, tuple[Callable[[], Any], type[OdelmError], str]] = {
    "ode-lstm id out of range": (
        lambda: _lstm("ode-lstm")(torch.tensor([[1, 60]])),
        OdelmError,
        "token ids must lie in [0, 50), got range [1, 60]",
    ),
    "ode-lstm empty batch": (
        lambda: _lstm("ode-lstm")(torch.zeros(0, 5, dtype=torch.long)),
        OdelmError,
        "at least one sequence of at least one token, got shape (0, 5)",
    ),
    "ode-lstm empty sequence": (
        lambda: _lstm("ode-lstm")(torch.zeros(2, 0, dtype=torch.long)),
        OdelmError,
        "got shape (2, 0)",
    ),
    "lstm id negative": (
        lambda: _lstm("lstm")(torch.tensor([[-1, 2]])),
        OdelmError,
        "token ids must lie in [0, 50)",
    ),
    "solve t not increasing": (_solve_backwards, OdelmError, "t must be strictly increasing"),
    "field of the wrong shape": (
        _wrong_shape_field,
        FieldOutputError,
        "the vector field returned (3,) for a state of shape (2, 3)",
    ),
}


@pytest.mark.parametrize("case", list(LIBRARY_CASES))
def test_library_fault_is_one_line_of_its_error_class(case):
    call, error_class, message = LIBRARY_CASES[case]
    with pytest.raises(error_class) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_block_null_with_a_tableau_builds_the_custom_block():
    model = build_model({**TINY_MODEL, "block": None, "tableau": [[[0.0]], [1.0]]}, 20)
    assert model.config.block == "custom" and model.config.tableau == (((0.0,),), (1.0,))


# Silently wrong, item "n_layers: 1000000": estimated and refused before anything is built.


@pytest.mark.parametrize(
    "spec,vocab",
    [
        ({**TINY_MODEL, "n_layers": 1_000_000}, 100),
        ({**TINY_MODEL, "d_model": 1e9}, 100),
        ({**TINY_MODEL, "d_ff": 1e11}, 100),
        ({"family": "neuralode_lm", "name": "ode-lstm", "hidden_dim": 10**6}, 100),
        ({"family": "reference"}, 10**7),  # a bigram's table is vocabulary squared
        ({"family": "neuralode_lm", "name": "lstm"}, 10**9),  # a huge vocabulary
    ],
)
def test_a_model_too_large_for_memory_is_refused_before_it_is_built(spec, vocab, monkeypatch):
    def no_building(*args, **kwargs):
        raise AssertionError("the model was built")

    for module, name in [
        ("ode_transformer", "ODETransformerLM"),
        ("experiments.reference", "BigramLM"),
        ("neuralode_lm.models", "build_model"),
    ]:
        monkeypatch.setattr(f"{module}.{name}", no_building)
    with pytest.raises(ConfigError, match=r"asks for about [\d.e+]+ parameters") as info:
        build_model(spec, vocab)
    assert "GiB to train" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        TINY_MODEL,
        {**TINY_MODEL, "tie_embeddings": False, "stack": "macaron", "block": "residual"},
        {"family": "neuralode_lm", "name": "lstm", "embed_dim": 8, "hidden_dim": 12},
        {"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8, "n_layers": 2},
        {"family": "neuralode_lm", "name": "node-transformer", "d_model": 16, "n_heads": 2},
        {"family": "neuralode_lm", "name": "node-transformer", "d_model": 16, "n_heads": 2}
        | {"time_conditioning": "weights", "weight_basis": 4},
        {"family": "neuralode_lm", "name": "node-transformer", "d_model": 16, "n_heads": 2}
        | {"time_conditioning": "hypernetwork"},
        {"family": "reference", "name": "transformer", "d_model": 16, "d_ff": 24},
        {"family": "reference"},
    ],
)
def test_the_estimate_never_exceeds_the_real_count(spec):
    # A lower bound: a model that fits is never refused.
    estimate = estimate_parameters(spec, 37, model_keys())
    assert estimate is not None and 0.5 * count_parameters(build_model(spec, 37)) <= estimate
    assert estimate <= count_parameters(build_model(spec, 37))


# Silently wrong, item "step_size: 1e-9": the steps are counted, no grid is built.


def test_a_billion_point_grid_is_refused_before_it_is_built(monkeypatch):
    def no_grid(*args, **kwargs):
        raise AssertionError("a grid was built")

    monkeypatch.setattr(torch, "linspace", no_grid)
    with pytest.raises(MaxStepsExceeded, match="step_size=1e-09 needs 1000000000 steps"):
        solve(lambda s, z: -z, torch.ones(1, 2), 1.0, method="euler", step_size=1e-9)


@pytest.mark.parametrize("step_size", [0.3, 0.25, 1 / 3, 0.7, 2.0])
def test_counted_steps_equal_the_grid_s(step_size):
    t = torch.tensor([0.0, 0.5, 1.0, 2.2])
    assert grid_steps(t, step_size) == fixed_grid(t, step_size).numel() - 1


# Silently wrong, item "grad_clip -1, --bleu-sentences -5, --max-new-tokens 1e9": errors,
# the command line's range being the config's.


def test_grad_clip_must_be_positive_or_null(tmp_path):
    for clip in (-1.0, 0.0):
        with pytest.raises(ConfigError, match=r"optim.grad_clip = .* it must be > 0 or null"):
            parse_config(make_tiny_config(tmp_path, optim={"grad_clip": clip}))
    assert (
        parse_config(make_tiny_config(tmp_path, optim={"grad_clip": None})).optim.grad_clip is None
    )


@pytest.mark.parametrize("key", ["bleu_sentences", "continuation_sentences", "prompt_len"])
def test_eval_flags_share_the_config_s_range(key, tmp_path, trained_run, capsys):
    low = 1 if key == "prompt_len" else 0  # the config's lowest value
    with pytest.raises(ConfigError) as info:
        parse_config(make_tiny_config(tmp_path, eval={key: low - 1}))
    from_config = str(info.value).partition(" is out of range")[2]
    flag = "--" + key.replace("_", "-")
    assert main(["eval", str(trained_run), flag, str(low - 1)]) == 2
    err = capsys.readouterr().err
    assert err == f"odelm: error: {flag} = {low - 1} is out of range{from_config}\n"


def test_generation_is_capped_and_the_cap_is_documented():
    prompt = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(DecodingError, match=f"in \\[0, {MAX_NEW_TOKENS}\\]"):
        generate(_lstm("lstm"), prompt, MAX_NEW_TOKENS + 1)
    assert generate(_lstm("lstm"), prompt, 3).shape == (1, 4)
    assert f"at most {MAX_NEW_TOKENS}" in _generate_help()


def _generate_help() -> str:
    from experiments.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    return sub.choices["generate"].format_help()
