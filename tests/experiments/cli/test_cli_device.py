"""``--device`` of ``odelm eval``, ``generate`` and ``discretize``: ``cpu`` by
default, ``auto`` = CUDA when a GPU is visible else the CPU, a bad or missing device refused
in one line (exit 2) before the run loads; the model and its batches go to the device."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.cli.main import main, parse
from experiments.evaluation.devices import DeviceError, resolve_device
from experiments.evaluation.trained import load_run

COMMANDS = [
    ["eval", "RUN"],
    ["generate", "RUN", "--prompt", "a dog"],
    ["discretize", "RUN"],
]


@pytest.mark.parametrize("argv", COMMANDS)
@pytest.mark.slow
def test_device_option_parses_with_cpu_as_default(argv) -> None:
    assert parse(argv)[1].device == "cpu"
    assert parse([*argv, "--device", "cpu"])[1].device == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert parse([*argv, "--device", "auto"])[1].device == expected


@pytest.mark.parametrize("argv", COMMANDS)
@pytest.mark.parametrize(
    ("device", "message"), [("gpu", "is not a device"), ("cuda:7", "is not available")]
)
def test_a_bad_device_is_one_line_and_exit_2(capsys, monkeypatch, argv, device, message) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*argv, "--device", device]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"odelm: error: --device {device!r} {message}")


def test_resolve_device(monkeypatch) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("meta")) == torch.device("meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(DeviceError, match="has 2 CUDA devices"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="no CUDA device"):
        resolve_device("cuda")


@pytest.mark.slow
def test_device_cpu_end_to_end(trained, capsys, tmp_path) -> None:
    run = str(trained)
    assert main(["eval", run, "--device", "cpu", "--json", "--bleu-sentences", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["ppl"] > 1
    argv = ["generate", run, "--prompt", "a dog", "--max-new-tokens", "3", "--device", "cpu"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("a dog")
    argv = ["discretize", run, "--device", "cpu", "--json", "--max-batches", "1"]
    assert main([*argv, "--eval-batch-size", "2", "--steps", "1", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and all(row["method"] for row in rows)
    assert next(load_run(trained, device="auto").model.parameters()).device.type in (
        "cpu",
        "cuda",
    )
