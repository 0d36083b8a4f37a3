"""Fetch the canonical PTB and WikiText-2 archives into a cache dir, verified and atomically.

Which checks apply (every hash below is a published one; none is computed here and trusted):

- ``ptb`` (Mikolov's ``simple-examples.tgz``): no published SHA-256 of the archive was found,
  so the archive is not checked; all three extracted split files are, against the SHA-256s
  that Hugging Face ``datasets`` (``ptb_text_only/dataset_infos.json``) publishes for
  Zaremba et al.'s copies of the same files (valid and test also match ``../shared/data``).
- ``wikitext2`` (``wikitext-2-v1.zip``): the archive SHA-256 published by Hugging Face
  ``datasets`` (``wikitext/dataset_infos.json``), plus the valid and test files.
- ``wikitext2-raw`` (``wikitext-2-raw-v1.zip``): the archive SHA-256 from the same source.

A file without a published hash is checked on later runs against the hash recorded in a
manifest (``.verified.json``) written only after its archive passed its own check; a file that
matches neither is never taken as valid and is fetched again.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from odelm.errors import OdelmError

MANIFEST = ".verified.json"
_CHUNK = 1 << 20
_USER_AGENT = "odelm-downloader/0.1 (+https://pypi.org/project/odelm)"


class DownloadError(OdelmError, RuntimeError):
    """An archive could not be fetched (offline, HTTP error, truncated transfer)."""


class ChecksumError(OdelmError, ValueError):
    """A file's SHA-256 differs from the expected one."""


@dataclass(frozen=True)
class ArchiveSpec:
    """One canonical archive: where it lives and what it must contain."""

    name: str
    url: str
    sha256: str | None
    members: dict[str, str]  # archive member -> file name in the corpus directory
    file_sha256: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    dirname: str = ""  # directory under the cache dir; defaults to ``name``

    @property
    def directory(self) -> str:
        return self.dirname or self.name


KNOWN_FILE_SHA256: dict[str, str] = {
    "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
    # WikiText-2 v1 (tokenized); WikiText-103 uses the same file names with other contents.
    "wiki.valid.tokens": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
    "wiki.test.tokens": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
}


def _members(prefix: str, pattern: str) -> dict[str, str]:
    files = [pattern.format(split) for split in ("train", "valid", "test")]
    return {prefix + name: name for name in files}


def _known(members: dict[str, str]) -> dict[str, str]:
    return {n: KNOWN_FILE_SHA256[n] for n in members.values() if n in KNOWN_FILE_SHA256}


_PTB = _members("./simple-examples/data/", "ptb.{}.txt")
_WT2 = _members("wikitext-2/", "wiki.{}.tokens")
_WT2_RAW = _members("wikitext-2-raw/", "wiki.{}.raw")
# The original research.metamind.io S3 bucket is gone; wikitext.smerity.com is the WikiText
# author's mirror of the same zips.
ARCHIVES: dict[str, ArchiveSpec] = {
    "ptb": ArchiveSpec(
        "ptb",
        "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
        None,
        _PTB,
        _known(_PTB),
    ),
    "wikitext2": ArchiveSpec(
        "wikitext2",
        "https://wikitext.smerity.com/wikitext-2-v1.zip",
        "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
        _WT2,
        _known(_WT2),
        dirname="wikitext-2",
    ),
    "wikitext2-raw": ArchiveSpec(
        "wikitext2-raw",
        "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
        "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
        _WT2_RAW,
        dirname="wikitext-2-raw",
    ),
}


def sha256_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: str | os.PathLike[str], expected: str) -> None:
    """Raise ``ChecksumError`` unless ``path`` has SHA-256 ``expected``."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumError(
            f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}; the file "
            "is corrupt or a different version; delete it and download again"
        )


def _manual_hint(spec: ArchiveSpec, url: str, dest: Path) -> str:
    names = ", ".join(spec.members.values())
    return (
        f"To provide the files by hand: download {url} yourself on a machine with a network, "
        f"extract it, and put {names} in {dest} (or point --data-dir at a directory holding them)."
    )


@contextmanager
def _temp_path(directory: Path, prefix: str) -> Iterator[Path]:
    """A fresh temporary file in ``directory``, removed on exit unless renamed away."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".part")
    os.close(fd)
    path = Path(name)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _fetch(url: str, out: IO[bytes], timeout: float) -> str:
    """Stream ``url`` into ``out``; return its SHA-256; raise on any short or failed transfer."""
    digest, received = hashlib.sha256(), 0
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        length = response.headers.get("Content-Length")
        for chunk in iter(lambda: response.read(_CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
            received += len(chunk)
    if length is not None and received < int(length):
        raise DownloadError(f"truncated transfer: got {received} of {length} bytes")
    out.flush()
    return digest.hexdigest()


def _open_members(archive: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """Yield ``(member name without leading './', readable stream)`` for every regular file."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    with zf.open(info) as stream:
                        yield info.filename.removeprefix("./"), stream
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            for member in tf:
                stream = tf.extractfile(member) if member.isfile() else None
                if stream is not None:
                    with stream:
                        yield member.name.removeprefix("./"), stream
    else:
        raise DownloadError(f"{archive} is neither a zip nor a tar archive")


def _expected_hashes(spec: ArchiveSpec, archive_sha: str | None, dest: Path) -> dict[str, str]:
    """Hashes the files in ``dest`` must have: published ones, then the manifest's."""
    expected = dict(spec.file_sha256) if archive_sha == spec.sha256 else {}
    manifest = dest / MANIFEST
    if manifest.is_file():
        try:
            record = json.loads(manifest.read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("archive_sha256") == archive_sha and archive_sha is not None:
            for name, digest in record.get("files", {}).items():
                expected.setdefault(name, digest)
    return expected


def _cache_problem(spec: ArchiveSpec, expected: dict[str, str], dest: Path) -> str | None:
    """Why the cached files cannot be used as they are, or None when all are verified."""
    for name in spec.members.values():
        path = dest / name
        if not path.is_file():
            return f"{path} is missing"
        if name not in expected:
            return f"{path} has no known checksum to verify it against"
        try:
            verify_file(path, expected[name])
        except ChecksumError as error:
            return str(error)
    return None


def _extract(
    spec: ArchiveSpec, archive: Path, url: str, archive_sha: str | None, dest: Path
) -> None:
    """Extract the members to temporary files, verify them, then rename them into place."""
    wanted = {member.removeprefix("./"): name for member, name in spec.members.items()}
    expected = dict(spec.file_sha256) if archive_sha == spec.sha256 else {}
    staged: dict[str, Path] = {}
    digests: dict[str, str] = {}
    try:
        for member, stream in _open_members(archive):
            if member not in wanted:
                continue
            name = wanted[member]
            fd, staged_name = tempfile.mkstemp(dir=dest, prefix=f".{name}.", suffix=".part")
            staged[name] = Path(staged_name)
            with os.fdopen(fd, "wb") as handle:
                shutil.copyfileobj(stream, handle, _CHUNK)
            os.chmod(staged[name], 0o644)
            digests[name] = sha256_file(staged[name])
            if name in expected and digests[name] != expected[name]:
                raise ChecksumError(
                    f"checksum mismatch for {name} (member {member} of {url}): expected sha256 "
                    f"{expected[name]}, got {digests[name]}; the archive is not the canonical one"
                )
        missing = sorted(set(wanted.values()) - set(staged))
        if missing:
            raise DownloadError(f"archive {url} lacks {missing}; is it the right archive?")
        (dest / MANIFEST).unlink(missing_ok=True)
        for name, path in staged.items():
            os.replace(path, dest / name)
        staged.clear()
        record = {"archive_sha256": archive_sha, "files": digests}
        with _temp_path(dest, f"{MANIFEST}.") as path:
            path.write_text(json.dumps(record, indent=1, sort_keys=True))
            os.replace(path, dest / MANIFEST)
    finally:
        for path in staged.values():
            path.unlink(missing_ok=True)


def download_corpus(
    name: str,
    cache_dir: str | os.PathLike[str],
    *,
    url: str | None = None,
    sha256: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Return ``cache_dir/<corpus dir>`` holding the verified split files, fetching if needed.

    ``url`` overrides the archive's location (a mirror); ``sha256`` overrides its expected
    checksum, and then the published per-file hashes of the canonical archive do not apply
    (the files are recorded from the archive the caller vouched for). No network access
    happens when every file is present and verified.
    """
    if name not in ARCHIVES:
        raise KeyError(f"unknown corpus {name!r}; valid: {', '.join(sorted(ARCHIVES))}")
    spec = ARCHIVES[name]
    url = url or spec.url
    archive_sha = (sha256 or spec.sha256 or "").lower() or None
    dest = Path(cache_dir) / spec.directory
    dest.mkdir(parents=True, exist_ok=True)
    problem = _cache_problem(spec, _expected_hashes(spec, archive_sha, dest), dest)
    if problem is None:
        return dest
    hint = _manual_hint(spec, url, dest)
    with _temp_path(dest, ".archive.") as path:
        try:
            with open(path, "wb") as handle:
                actual = _fetch(url, handle, timeout)
        except (DownloadError, OSError, http.client.HTTPException) as error:
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            raise DownloadError(
                f"could not download {url}: {reason} (cached copy unusable: {problem}). " + hint
            ) from error
        if archive_sha is not None and actual != archive_sha:
            raise ChecksumError(
                f"checksum mismatch for {url} (downloaded to {path}): expected sha256 "
                f"{archive_sha}, got {actual}; the transfer was corrupted or the archive changed. "
                + hint
            )
        try:
            _extract(spec, path, url, archive_sha, dest)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as error:
            raise DownloadError(f"archive from {url} is corrupt ({error}). " + hint) from error
    return dest
