"""Corpora: Penn Treebank, WikiText-2 (tokenized and raw), any folder of text files, and the
embedded grammar corpus; each read as lines of words with ``<eos>`` appended to every line,
exactly as the standard PTB / WikiText-2 loaders do (empty lines included).

Two protocols: ``full`` uses the train/valid/test files as they are; ``mini`` (PTB-mini,
WT2-mini) trains on the first 90% of the valid file's lines, selects on its last 10%, and
tests on the test file, for machines without the train split. The protocol travels with
the corpus into every result it affects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.data.checksums import ChecksumError, checksum_status
from experiments.data.registry import (  # re-exported: the loader's public names
    CORPUS_NAMES,
    DATA_DIR_ENV,
    DEFAULT_CACHE_DIR,
    EOS,
    PROTOCOLS,
    SPECS,
    SPLITS,
    TEXT_SPLIT_NAMES,
    CorpusError,
)

if TYPE_CHECKING:
    from experiments.data.grammar_family import GrammarStream


@dataclass
class Corpus:
    """Lines of words per split (each line ends with ``<eos>``) and where they came from.

    A generated corpus knows more: ``reference_nll``, the true grammar's exact total NLL
    (nats) of each split, and for the grammar family ``stream``, its training data drawn
    on the fly (there is then no ``train`` split of lines)."""

    name: str
    protocol: str
    lines: dict[str, list[list[str]]]
    files: dict[str, str] = field(default_factory=dict)
    reference_nll: dict[str, float] = field(default_factory=dict)
    stream: GrammarStream | None = None

    def split(self, split: str) -> list[list[str]]:
        if split not in self.lines:
            raise CorpusError(
                f"corpus {self.name!r} ({self.protocol}) has no {split!r} split; "
                f"it has {', '.join(self.lines)}"
            )
        return self.lines[split]


def read_lines(path: Path) -> list[list[str]]:
    """Read a pre-tokenized text file: whitespace-split words plus ``<eos>`` per line."""
    data = path.read_bytes()
    if not data.strip():
        raise CorpusError(f"{path} is empty; expected one sentence per line of text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorpusError(
            f"{path} is not UTF-8: byte offset {error.start} ({data[error.start : error.start + 1]!r}) "
            "cannot be decoded; re-encode the file as UTF-8"
        ) from None
    return [line.split() + [EOS] for line in text.splitlines()]


def default_data_dirs(data_dir: str | Path | None) -> list[Path]:
    """The data directories searched, in order: the argument, $ODELM_DATA_DIR, the cache."""
    dirs = [Path(data_dir)] if data_dir else []
    env = env_data_dir()
    dirs += [env] if env is not None else []
    dirs.append(DEFAULT_CACHE_DIR)
    return dirs


def env_data_dir() -> Path | None:
    """``$ODELM_DATA_DIR`` (None when unset); one line when it names a file, a folder that
    cannot be read, or a path the system refuses (too long)."""
    value = os.environ.get(DATA_DIR_ENV, "")
    if not value:
        return None
    shown = f"{DATA_DIR_ENV}={value[:200]!r}{'...' if len(value) > 200 else ''}"
    path = Path(value)
    try:
        is_dir = path.is_dir()
        exists = is_dir or path.exists()
    except OSError as error:
        raise CorpusError(
            f"{shown} cannot be used ({error.strerror}); point it at the folder holding your "
            "corpora, or unset it"
        ) from None
    if exists and not is_dir:
        raise CorpusError(
            f"{shown} is a file, not a folder; point it at the folder holding your corpora, "
            "or unset it"
        )
    if is_dir and not os.access(path, os.R_OK | os.X_OK):
        raise CorpusError(f"{shown} is a folder odelm cannot read; check its permissions")
    return path


def find_split_files(name: str, data_dir: str | Path | None) -> dict[str, Path]:
    """Locate the split files of a named corpus; returns only the splits found."""
    spec = SPECS[name]
    for base in default_data_dirs(data_dir):
        for sub in spec.subdirs:
            folder = base / sub
            found = {s: folder / f for s, f in spec.files.items() if (folder / f).is_file()}
            if found:
                return found
    return {}


def find_text_files(folder: Path) -> dict[str, Path]:
    """Train/valid/test files of a plain text folder, matched by name (e.g. ``valid.txt``)."""
    if not folder.is_dir():
        raise CorpusError(f"text corpus folder {folder} does not exist")
    found: dict[str, Path] = {}
    for split, names in TEXT_SPLIT_NAMES.items():
        matches = [
            path
            for path in sorted(folder.iterdir())
            if path.is_file() and any(part in names for part in path.name.lower().split("."))
        ]
        if len(matches) > 1:
            raise CorpusError(
                f"{folder} has several {split} files ({', '.join(p.name for p in matches)}); keep one"
            )
        if matches:
            found[split] = matches[0]
    return found


def missing_files_error(name: str, data_dir: str | Path | None, missing: list[str]) -> CorpusError:
    searched = [
        str(base / sub) for base in default_data_dirs(data_dir) for sub in SPECS[name].subdirs
    ]
    files = ", ".join(SPECS[name].files[s] for s in missing)
    return CorpusError(
        f"corpus {name!r}: missing {files}. Searched: {'; '.join(searched)}. "
        f"Provide them with --data-dir DIR (or ${DATA_DIR_ENV}), fetch them with "
        f"`odelm data download --corpus {name}`, or, without a train split, use "
        "--protocol mini (train on the valid split, the PTB-mini protocol)."
    )


def apply_protocol(
    label: str, lines: dict[str, list[list[str]]], protocol: str
) -> tuple[dict[str, list[list[str]]], str]:
    """Arrange splits by protocol; returns the splits and the protocol's label."""
    if protocol == "full":
        return lines, label
    valid = lines["valid"]
    cut = int(len(valid) * 0.9)
    mini = {"train": valid[:cut], "valid": valid[cut:], "test": lines["test"]}
    return mini, f"{label}-mini (train=valid[:90%], valid=valid[90%:], test=test)"


def protocol_splits(protocol: str) -> tuple[str, ...]:
    """The split files a protocol reads: all three, or valid and test for ``mini``."""
    return ("valid", "test") if protocol == "mini" else SPLITS


def split_files(name: str, data_dir: str | Path | None) -> dict[str, Path]:
    """The split files of a file-based corpus that exist (``text`` reads ``data_dir``)."""
    if name not in CORPUS_NAMES:
        raise CorpusError(f"unknown corpus {name!r}; valid: {', '.join(CORPUS_NAMES)}")
    if name == "grammar":
        raise CorpusError("the grammar corpus is generated, not read from files")
    if name == "text":
        if data_dir is None:
            raise CorpusError(
                "corpus 'text' needs --data-dir FOLDER holding train/valid/test files"
            )
        return find_text_files(Path(data_dir))
    return find_split_files(name, data_dir)


def check_split_file(name: str, path: Path) -> None:
    """Refuse a split file whose known checksum does not match (truncated or corrupt)."""
    actual, status = checksum_status(SPECS[name], path)
    if status == "MISMATCH":
        raise ChecksumError(
            f"{path} does not match its known checksum (sha256 {actual}): the file is truncated "
            f"or corrupt. Delete it and fetch it again (`odelm data download --corpus {name}`, "
            "or train with --download), or set data.verify_checksums: false to use it anyway"
        )


def load_corpus(
    name: str,
    data_dir: str | Path | None = None,
    *,
    protocol: str = "full",
    seed: int = 0,
    download: bool = False,
    verify_checksums: bool = True,
    grammar_depth: int | None = None,
) -> Corpus:
    """Load a corpus by name: ``ptb``, ``wikitext2``, ``wikitext2-raw``, ``text`` or ``grammar``.

    ``text`` reads the folder ``data_dir``; ``grammar`` generates the embedded corpus from
    ``seed`` and needs no files (with ``grammar_depth``, the family of that depth:
    streamed training, fixed valid and test samples). ``protocol="mini"`` trains on the valid split. With
    ``download=True`` a named corpus whose files for the protocol are missing is fetched
    into the cache (only those files). A named corpus's file whose known checksum does not
    match raises ``ChecksumError`` unless ``verify_checksums=False``.
    """
    if name not in CORPUS_NAMES:
        raise CorpusError(f"unknown corpus {name!r}; valid: {', '.join(CORPUS_NAMES)}")
    if protocol not in PROTOCOLS:
        raise CorpusError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if grammar_depth is not None and name != "grammar":
        raise CorpusError(f"data.grammar_depth is for the grammar corpus, not {name!r}")
    if name == "grammar":
        return _grammar_corpus(seed, protocol, grammar_depth)
    paths = split_files(name, data_dir)
    needed = protocol_splits(protocol)
    missing = [split for split in needed if split not in paths]
    if download and name in SPECS and missing:
        from experiments.data.download import download_corpus

        download_corpus(name, DEFAULT_CACHE_DIR, splits=needed)
        paths = find_split_files(name, DEFAULT_CACHE_DIR)
        missing = [split for split in needed if split not in paths]
    if missing:
        if name == "text":
            raise CorpusError(
                f"text corpus {data_dir} lacks {', '.join(missing)} file(s); name them e.g. "
                "train.txt, valid.txt, test.txt"
                + (" or use --protocol mini" if missing == ["train"] else "")
            )
        raise missing_files_error(name, data_dir, missing)
    if verify_checksums and name in SPECS:
        for split in needed:
            check_split_file(name, paths[split])
    label = f"text:{Path(data_dir).name}" if name == "text" else SPECS[name].label
    lines, label = apply_protocol(
        label, {split: read_lines(paths[split]) for split in needed}, protocol
    )
    return Corpus(name, label, lines, files={s: str(p) for s, p in paths.items()})


def _grammar_corpus(seed: int, protocol: str, depth: int | None) -> Corpus:
    """The embedded grammar corpus, or the depth family's (``depth`` 1-4)."""
    if depth is None:
        from experiments.data.grammar import sample_splits

        drawn = sample_splits(seed, None)
        lines = {s: [words + [EOS] for words, _ in ws] for s, ws in drawn.items()}
        nll = {s: -sum(log_p for _, log_p in ws) for s, ws in drawn.items()}
        lines, label = apply_protocol(f"grammar (embedded, seed {seed})", lines, protocol)
        reference = nll if protocol == "full" else {"test": nll["test"]}  # mini moves valid
        return Corpus("grammar", label, lines, reference_nll=reference)
    from experiments.data.grammar_family import GRAMMAR_DEPTHS, GrammarStream, family_split

    if depth not in GRAMMAR_DEPTHS:
        raise CorpusError(
            f"data.grammar_depth must be one of {', '.join(map(str, GRAMMAR_DEPTHS))}, got {depth}"
        )
    if protocol != "full":
        raise CorpusError("the grammar family streams its training data: use protocol full")
    splits = {split: family_split(depth, seed, split) for split in ("valid", "test")}
    return Corpus(
        "grammar",
        f"grammar-depth {depth} (streamed train, seed {seed})",
        {split: words for split, (words, _) in splits.items()},
        reference_nll={split: -log_p for split, (_, log_p) in splits.items()},
        stream=GrammarStream(depth, seed),
    )
