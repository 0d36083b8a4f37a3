"""The tiny run every training test shares: :data:`TINY_MODEL`, :func:`make_tiny_config`
(a run config as a plain dict), and :func:`kill_at_first_checkpoint`, the first half of every
kill-and-resume test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

TINY_MODEL = {
    "family": "ode_transformer",
    "preset": "small",
    "n_layers": 1,
    "d_model": 32,
    "d_ff": 64,
    "n_heads": 2,
    "block": "rk2",
}
"""A one-layer ODE Transformer small enough to train for a few steps in a test."""


def make_tiny_config(out_dir: Path, name: str = "run", **sections: Any) -> dict[str, Any]:
    """A run config (plain dict) of :data:`TINY_MODEL` on the grammar corpus; each keyword
    updates a section (or sets a top-level value)."""
    values: dict[str, Any] = {
        "name": name,
        "out_dir": str(out_dir),
        "seed": 3,
        "model": dict(TINY_MODEL),
        "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 64},
        "trainer": {
            "max_steps": 24,
            "val_every": 8,
            "checkpoint_every": 4,
            "val_batches": 2,
            "progress_bar": False,
            "num_threads": 1,  # bitwise reproducibility needs one thread count everywhere
        },
        "eval": {"bleu_sentences": 5},
    }
    for key, value in sections.items():
        values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
    return values


def kill_at_first_checkpoint(values: dict[str, Any], run_dir: Path, max_steps: int) -> None:
    """Train ``values`` (a run config) in a child ``odelm train``, SIGKILL it as soon as its
    first checkpoint is written, and check that it died mid-run (no result, a step between 0
    and ``max_steps``): the first half of every kill-and-resume test."""
    config_file = run_dir.parent / f"{run_dir.name}.yaml"
    config_file.write_text(yaml.safe_dump(values))
    command = [
        sys.executable,
        "-m",
        "experiments",
        "train",
        "--config",
        str(config_file),
        "--quiet",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = run_dir / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and not (checkpoints / "last.ckpt").exists():
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run_dir / "result.json").exists(), "the run finished before the kill"
    state = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert 0 < state["global_step"] < max_steps
