"""SHA-256 checks of corpus files: the one hash helper, and the hashes a file must have.

A split file's expected hash is the one recorded in its folder's manifest
(``.verified.json``, written by the downloader only after the file passed its archive's
check) or else the corpus's published one (``CorpusSpec.file_sha256``). A file with neither
is "unknown": it is used as it is, since nothing says what it should be.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pooch

from odelm.errors import OdelmError
from odelm.files import atomic_write

if TYPE_CHECKING:
    from experiments.data.registry import CorpusSpec

MANIFEST = ".verified.json"


class ChecksumError(OdelmError, ValueError):
    """A file's SHA-256 differs from the expected one."""


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
