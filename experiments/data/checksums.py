"""SHA-256 checks of corpus files and of a run's recorded files: the one hash helper, and
the hashes a file must have.

A split file's expected hash is the one recorded in its folder's manifest
(``.verified.json``, written by the downloader only after the file passed its archive's
check) or else the corpus's published one (``CorpusSpec.file_sha256``). A file with neither
is "unknown": it is used as it is, since nothing says what it should be.

A finished run's marker (``RUN_MARKER``) records the SHA-256 of the files the run is loaded
from and of its splits' tokens (``run_record``); every load checks them
(``verify_recorded_files``), here so that the data layer's loaders (``hf_tokenizer``) can.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pooch

from odelm.errors import OdelmError
from odelm.files import atomic_write

if TYPE_CHECKING:
    from experiments.data.registry import CorpusSpec

MANIFEST = ".verified.json"
RUN_MARKER = ".odelm-run"


class ChecksumError(OdelmError, ValueError):
    """A file's SHA-256 differs from the expected one."""


class RunFilesChangedError(OdelmError, ValueError):
    """A file of a finished run differs from the one odelm wrote (damaged or tampered)."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 hex digest of a file (pooch's streaming hash)."""
    return pooch.file_hash(str(path), alg="sha256")


def verify_file(path: str | os.PathLike[str], expected: str) -> None:
    """Raise ``ChecksumError`` unless ``path`` has SHA-256 ``expected``."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumError(
            f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}; the file "
            "is corrupt or a different version; delete it and download again"
        )


def read_manifest(folder: Path) -> tuple[str | None, dict[str, str]]:
    """The archive hash and per-file hashes recorded in ``folder``'s manifest, if any."""
    try:
        record = json.loads((folder / MANIFEST).read_text())
        return record.get("archive_sha256"), dict(record.get("files", {}))
    except (OSError, ValueError, AttributeError):
        return None, {}


def write_manifest(folder: Path, archive_sha256: str | None, files: dict[str, str]) -> None:
    """Record verified file hashes atomically (write a temporary file, then rename)."""
    with atomic_write(folder / MANIFEST, suffix=".part") as staged:
        staged.write_text(json.dumps({"archive_sha256": archive_sha256, "files": files}, indent=1))


def expected_sha256(spec: CorpusSpec, path: Path) -> str | None:
    """The hash ``path`` (a split file of ``spec``) must have: manifest first, then published."""
    recorded = read_manifest(path.parent)[1].get(path.name)
    return recorded or spec.file_sha256.get(path.name)


def checksum_status(spec: CorpusSpec, path: Path) -> tuple[str, str]:
    """``(actual sha256, "ok" | "MISMATCH" | "unknown")`` of one split file."""
    actual, expected = sha256_file(path), expected_sha256(spec, path)
    if expected is None:
        return actual, "unknown"
    return actual, "ok" if actual == expected else "MISMATCH"


def run_record(run_dir: Path) -> dict[str, Any]:
    """The run marker's record ({} where there is none, or a user created it empty to adopt
    an old run); a marker that is not a JSON object is refused: it promised a record."""
    path = run_dir / RUN_MARKER
    try:
        text = path.read_text() if path.is_file() else ""
        record = json.loads(text) if text.strip() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if not isinstance(record, dict):
        raise RunFilesChangedError(
            f"{path} is damaged (not a JSON object), so the run's files cannot be checked; "
            "restore the run from a copy, or retrain it"
        )
    return record


def verify_recorded_files(run_dir: Path, names: Iterable[str] | None = None) -> None:
    """Refuse a run whose recorded files changed: all of them, or those under ``names``
    (files or folders); a run with no record is not checked."""
    recorded = run_record(run_dir).get("files") or {}
    if not isinstance(recorded, dict):
        raise RunFilesChangedError(
            f"{run_dir / RUN_MARKER} is damaged (its file list is not a mapping); restore the "
            "run from a copy, or retrain it"
        )
    wanted = None if names is None else tuple(names)
    for name, expected in sorted(recorded.items()):
        path = run_dir / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise RunFilesChangedError(
                f"{run_dir / RUN_MARKER} lists {name!r}, a file outside the run; the marker "
                "was tampered with: restore the run from a copy, or retrain it"
            )
        if wanted is not None and not any(name == w or name.startswith(f"{w}/") for w in wanted):
            continue
        if not path.is_file() or sha256_file(path) != expected:
            state = "is missing" if not path.is_file() else "does not match its recorded SHA-256"
            raise RunFilesChangedError(
                f"{path} {state} (changed or damaged since odelm wrote it); restore the run "
                "from a copy, or retrain it"
            )
