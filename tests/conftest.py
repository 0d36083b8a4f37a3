"""Shared fixtures: the real data dir (../shared/data when present) and tiny corpora."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """``$ODELM_DATA_DIR`` or ``../shared/data`` beside the repository, when it exists."""
    for candidate in (os.environ.get("ODELM_DATA_DIR"), REPO.parent / "shared" / "data"):
        if candidate and Path(candidate, "ptb").is_dir():
            return Path(candidate)
    return None


@pytest.fixture
def data_dir() -> Path:
    found = shared_data_dir()
    if found is None:
        pytest.skip("real PTB / WikiText-2 files not found (set ODELM_DATA_DIR)")
    return found


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
