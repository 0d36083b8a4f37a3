"""Shared fixtures: the real data dir (``$ODELM_DATA_DIR``, or a ``shared/data`` folder beside
the repository), tiny corpora, and the tiny run config the training tests share."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """``$ODELM_DATA_DIR`` or ``../shared/data`` beside the repository, when it exists."""
    for candidate in (os.environ.get("ODELM_DATA_DIR"), REPO.parent / "shared" / "data"):
        if candidate and Path(candidate, "ptb").is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    found = shared_data_dir()
    if found is None:
        pytest.skip("real PTB / WikiText-2 files not found (set ODELM_DATA_DIR)")
    return found


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


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., dict[str, Any]]:
    """The factory :func:`make_tiny_config`."""
    return make_tiny_config


@pytest.fixture
def tiny_model() -> dict[str, Any]:
    """A fresh copy of :data:`TINY_MODEL`."""
    return dict(TINY_MODEL)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two
    threads can stall each op for milliseconds; restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def text_corpus_dir(tmp_path: Path) -> Path:
    """A tiny text corpus folder with train/valid/test files."""
    lines = {
        "train": "the cat sat\nthe dog ran\n\na cat ran <unk>\n",
        "valid": "the dog sat\na cat sat\n",
        "test": "the cat ran\n",
    }
    for split, text in lines.items():
        (tmp_path / f"{split}.txt").write_text(text)
    return tmp_path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny run (grammar corpus, 4 steps), one per test module."""
    import yaml

    from experiments.cli.main import main

    out = tmp_path_factory.mktemp("trained")
    config_file = out / "run.yaml"
    config_file.write_text(yaml.safe_dump(make_tiny_config(out, "run", trainer={"max_steps": 4})))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    return out / "run"
