"""The corpus registry: every named corpus's files, archive and published checksums, in one
place. The loader (``corpora``), the downloader (``download``) and the command line read it;
a new corpus is one ``CorpusSpec`` entry here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from odelm.errors import OdelmError

EOS = "<eos>"
SPLITS = ("train", "valid", "test")
PROTOCOLS = ("full", "mini")
DATA_DIR_ENV = "ODELM_DATA_DIR"
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "odelm"


class CorpusError(OdelmError, ValueError):
    """A corpus cannot be read: unknown name, missing split, empty or undecodable file."""


class DownloadError(OdelmError, RuntimeError):
    """An archive could not be fetched (offline, HTTP error, truncated transfer) or used."""


@dataclass(frozen=True)
class Archive:
    """Where a named corpus is published: one archive and the folder of its split files."""

    url: str
    sha256: str | None  # the archive's published SHA-256, when one exists
    member_dir: str  # folder of the split files inside the archive


@dataclass(frozen=True)
class CorpusSpec:
    """Everything about one named corpus: its files, where to look, and where it is published.

    ``file_sha256`` holds published checksums of the split files (by file name); a file
    with one is verified before use. ``subdirs[1]`` is the corpus's folder in the cache.
    """

    files: dict[str, str]
    subdirs: tuple[str, ...]
    label: str
    archive: Archive
    file_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def cache_subdir(self) -> str:
        return self.subdirs[1]


# The one registry of named corpora: the CLI, the loader and the downloader read it.
# Checksums are published ones, none computed here and trusted: PTB's split files as Hugging
# Face ``datasets`` publishes them for Zaremba et al.'s copies (Mikolov's archive has no
# published checksum); WikiText-2's archives and tokenized valid/test files as published by
# Hugging Face ``datasets``. wikitext.smerity.com is the WikiText author's mirror of the
# zips (the original S3 bucket is gone).
SPECS: dict[str, CorpusSpec] = {
    "ptb": CorpusSpec(
        {split: f"ptb.{split}.txt" for split in SPLITS},
        ("", "ptb", "penn", "simple-examples/data"),
        "PTB",
        Archive(
            "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
            None,
            "./simple-examples/data/",
        ),
        {
            "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
            "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
            "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
        },
    ),
    "wikitext2": CorpusSpec(
        {split: f"wiki.{split}.tokens" for split in SPLITS},
        ("", "wikitext-2", "wikitext2"),
        "WT2",
        Archive(
            "https://wikitext.smerity.com/wikitext-2-v1.zip",
            "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
            "wikitext-2/",
        ),
        {
            "wiki.valid.tokens": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
            "wiki.test.tokens": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
        },
    ),
    "wikitext2-raw": CorpusSpec(
        {split: f"wiki.{split}.raw" for split in SPLITS},
        ("", "wikitext-2-raw", "wikitext2-raw"),
        "WT2-raw",
        Archive(
            "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
            "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
            "wikitext-2-raw/",
        ),
    ),
}
TEXT_SPLIT_NAMES = {
    "train": ("train",),
    "valid": ("valid", "validation", "val", "dev"),
    "test": ("test",),
}
CORPUS_NAMES = (*SPECS, "text", "grammar")


def corpus_spec(name: str) -> CorpusSpec:
    """The registry entry of a named (file-based, downloadable) corpus."""
    if name not in SPECS:
        raise CorpusError(f"unknown corpus {name!r}; valid: {', '.join(SPECS)}")
    return SPECS[name]
