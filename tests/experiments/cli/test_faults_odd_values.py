"""Odd option values: each is refused with ONE line naming the option, its valid
range and the value given (``odelm: error: ...``, exit 2, no traceback), one test per class:
sampling parameters under a floor, seeds outside 0..2**64-1, thread counts outside 1..the
machine's CPUs, more beams than memory holds, an ``--out`` that is a file. The command-line
values are refused while parsing (a run path that does not exist is never reached); the
Python API refuses the same values with the same ranges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from experiments.cli.main import main
from experiments.config_errors import ConfigError
from experiments.models.build import build_model
from experiments.training.config import parse_config
from experiments.training.threads import check_threads
from odelm import decoding
from odelm.decoding import DecodingError, generate
from tests.support.runs import TINY_MODEL, make_tiny_config

NO_RUN = "no/such/run"  # parse-time refusals never look at the run
CPUS = os.cpu_count() or 1
THREADS = f"it must be in [1, {CPUS}]"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step run of the tiny model."""
    from experiments.training.train import train

    out = tmp_path_factory.mktemp("runs")
    train(parse_config(make_tiny_config(out, trainer={"max_steps": 2, "val_every": 2})))
    return out / "run"


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], *parts: str) -> str:
    """Run ``odelm ARGV``: exit 2 and one stderr line holding every part."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("odelm: error: "), err
    assert "Traceback" not in err and all(part in err for part in parts), err
    return err


@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [
        ("--temperature", "1e-320", "a finite number >= 0.0001"),
        ("--temperature", "nan", "a finite number >= 0.0001"),
        ("--top-p", "1e-300", "in [1e-06, 1]"),
        ("--top-p", "1.5", "in [1e-06, 1]"),
    ],
)
def test_sampling_values_under_their_floor(option, value, valid, capsys):
    argv = ["generate", NO_RUN, "--prompt", "a", "--strategy", "sample", option, value]
    _one_line(capsys, argv, f"{option} = {value} is out of range; it must be {valid}")
    model = build_model(TINY_MODEL, 20)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    key = option.removeprefix("--").replace("-", "_")
    with pytest.raises(DecodingError, match=f"{key} = .* is out of range"):
        generate(model, prompt, 2, strategy="sample", **{key: float(value)})
    floor = {"temperature": decoding.MIN_TEMPERATURE, "top_p": decoding.MIN_TOP_P}[key]
    assert generate(model, prompt, 2, strategy="sample", **{key: floor}).shape == (1, 3)


@pytest.mark.parametrize("value", [str(2**70), "-1", str(2**64)])
@pytest.mark.slow
def test_sampling_seeds_outside_0_to_2_64(value, trained_run, capsys):
    _one_line(
        capsys,
        ["generate", NO_RUN, "--prompt", "a", "--seed", value],
        f"--seed = {value} is out of range; it must be an integer in [0, 2**64-1",
    )
    import experiments

    run = experiments.load_run(trained_run)
    with pytest.raises(DecodingError, match=f"seed = {value} is out of range"):
        run.generate("a", 2, strategy="sample", seed=int(value))
    assert run.generate("a", 2, strategy="sample", seed=2**64 - 1).startswith("a ")
    _one_line(capsys, ["data", "info", "--corpus", "grammar", "--seed", value], "--seed = ")


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", NO_RUN, "--prompt", "a", "--num-threads", "100000"],
        ["eval", NO_RUN, "--num-threads", "1000000"],
        ["discretize", NO_RUN, "--num-threads", "100000"],
        ["bench", "corpus-load", "--num-threads", "100000"],
        ["eval", NO_RUN, "--num-threads", "0"],
    ],
)
def test_thread_counts_outside_the_machine_s_cpus(argv, capsys):
    _one_line(capsys, argv, f"--num-threads = {argv[-1]} is out of range; {THREADS}")


def test_train_and_compare_threads_outside_the_machine_s_cpus(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(make_tiny_config(tmp_path / "runs")))
    train = ["train", "--config", str(config), "--quiet"]
    too_many = f"trainer.num_threads = {CPUS + 1} is out of range; {THREADS}"
    _one_line(capsys, [*train, "--num-threads", str(CPUS + 1)], too_many)
    _one_line(capsys, [*train, "--trainer.num_threads", str(CPUS + 1)], too_many)
    renamed = "unknown option --run.num_threads: the Lightning form of odelm train is gone; "
    _one_line(capsys, [*train, "--run.num_threads", "1"], renamed + "write --trainer.num_threads")
    out = tmp_path / "grid"
    compare = ["compare", "--preset", "quick", "--out", str(out), "--num-threads", "1000000"]
    _one_line(capsys, compare, "trainer.num_threads = 1000000 is out of range")
    assert not (tmp_path / "runs").exists() and not out.exists()  # nothing was written
    # a run trained on a larger machine still loads: the bound is checked where threads are set
    assert parse_config(make_tiny_config(tmp_path, trainer={"num_threads": CPUS + 1}))
    with pytest.raises(ConfigError, match="this machine's CPU count"):
        check_threads(CPUS + 1)


@pytest.mark.slow
def test_more_beams_than_memory_holds(trained_run, capsys, monkeypatch):
    err = _one_line(
        capsys,
        ["generate", str(trained_run), "--prompt", "a", "--strategy", "beam"]
        + ["--num-beams", "1000000000"],
        "--num-beams = 1000000000 is out of range; it must be in [1, ",
        "GiB (beams x 1 row(s) x (vocabulary ",
        "and the memory here is ",
    )
    fits = int(err.split("it must be in [1, ")[1].split("]")[0])
    assert 0 < fits < 10**9
    _one_line(capsys, ["generate", NO_RUN, "--prompt", "a", "--num-beams", "0"], ">= 1")
    # the library's bound: a memory of 1 MiB holds a few thousand beams of this model
    monkeypatch.setattr(decoding, "memory_bytes", lambda: 2**20)
    model, prompt = build_model(TINY_MODEL, 20), torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(DecodingError, match=r"num_beams = 100000 is out of range; it must be in"):
        generate(model, prompt, 3, strategy="beam", num_beams=100_000)
    assert generate(model, prompt, 3, strategy="beam", num_beams=4).shape == (1, 4)


def test_an_out_folder_that_is_a_file(tmp_path, capsys):
    file = tmp_path / "table.md"
    file.write_text("mine")
    _one_line(
        capsys,
        ["discretize", NO_RUN, "--out", str(file)],
        f"--out {file} is a file; it must be a folder",
    )
    assert file.read_text() == "mine"
