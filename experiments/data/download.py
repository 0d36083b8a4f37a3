"""Fetch a named corpus's published archive into a cache dir, verified and atomically.

The transfer is ``pooch``'s: the archive is streamed to a temporary file beside its
destination, hash-checked against the archive's published SHA-256 (when one exists), and
only then moved into place; a failed or interrupted transfer leaves nothing behind. The
downloader below adds what a stalling mirror needs: connect/read timeouts, a minimum rate
(a server that trickles bytes ends in ``DownloadStallError``, never an endless wait) and a
progress bar on a terminal.

The split files are then extracted to temporary files, checked against their published
hashes (``CorpusSpec.file_sha256``, only when the archive is the canonical one), and renamed
into place; their hashes go to the folder's manifest, so a cached file that was truncated or
altered later is never taken as valid (it is fetched again).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pooch

from experiments.data.checksums import (
    ChecksumError,
    read_manifest,
    sha256_file,
    verify_file,
    write_manifest,
)
from experiments.data.registry import SPLITS, CorpusSpec, corpus_spec
from odelm import __version__
from odelm.errors import OdelmError

_CHUNK = 1 << 20


class DownloadError(OdelmError, RuntimeError):
    """An archive could not be fetched (offline, HTTP error, truncated transfer)."""


class DownloadStallError(DownloadError):
    """A server sent data too slowly (or not at all) for too long."""


@dataclass(frozen=True)
class StallGuardDownloader:
    """A ``pooch`` downloader: HTTP(S) with timeouts, a minimum rate and a progress bar.

    ``timeout`` bounds the connection and each wait for data; a transfer that delivers
    less than ``min_bytes_per_s`` on average over any ``stall_seconds`` raises
    ``DownloadStallError``, so even a server that sends one byte at a time ends.
    """

    timeout: float = 30.0
    stall_seconds: float = 60.0
    min_bytes_per_s: float = 1024.0
    progressbar: bool = True

    def __call__(self, url: str, output_file: str, _pooch: Any = None) -> None:
        import requests
        from tqdm import tqdm

        headers = {"User-Agent": f"odelm/{__version__}"}
        with requests.get(url, stream=True, timeout=self.timeout, headers=headers) as response:
            response.raise_for_status()
            total = int(response.headers.get("Content-Length") or 0) or None
            bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                desc=Path(url).name,
                leave=False,
                disable=None if self.progressbar else True,  # None: only on a terminal
            )
            with bar, open(output_file, "wb") as out:
                for chunk in self._chunks(response.raw):
                    out.write(chunk)
                    bar.update(len(chunk))

    def _chunks(self, raw: Any) -> Iterator[bytes]:
        """Chunks as they arrive (``read1``: one receive each), checking the rate as they do."""
        window_start, window_bytes = time.monotonic(), 0
        while chunk := raw.read1(_CHUNK, decode_content=True):
            yield chunk
            window_bytes += len(chunk)
            elapsed = time.monotonic() - window_start
            if elapsed >= self.stall_seconds:
                if window_bytes < self.min_bytes_per_s * elapsed:
                    raise DownloadStallError(
                        f"the server stalled: {window_bytes} bytes in {elapsed:.0f} s "
                        f"(below {self.min_bytes_per_s:.0f} bytes/s)"
                    )
                window_start, window_bytes = time.monotonic(), 0


def _manual_hint(spec: CorpusSpec, url: str, dest: Path, names: Iterable[str]) -> str:
    return (
        f"To provide the files by hand: download {url} yourself on a machine with a network, "
        f"extract it, and put {', '.join(names)} in {dest} (or point --data-dir at a "
        "directory holding them)."
    )


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


def _expected_hashes(spec: CorpusSpec, archive_sha: str | None, dest: Path) -> dict[str, str]:
    """Hashes the files in ``dest`` must have: published ones, then the manifest's."""
    expected = dict(spec.file_sha256) if archive_sha == spec.archive.sha256 else {}
    recorded_archive, recorded_files = read_manifest(dest)
    if archive_sha is not None and recorded_archive == archive_sha:
        for name, digest in recorded_files.items():
            expected.setdefault(name, digest)
    return expected


def _cache_problem(names: list[str], expected: dict[str, str], dest: Path) -> str | None:
    """Why the cached files cannot be used as they are, or None when all are verified."""
    for name in names:
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
    spec: CorpusSpec, names: list[str], archive: Path, url: str, archive_sha: str | None
) -> dict[str, str]:
    """Extract ``names`` beside ``archive``, verify them, rename them into place; their hashes."""
    dest = archive.parent
    prefix = spec.archive.member_dir.removeprefix("./")
    wanted = {prefix + name: name for name in names}
    expected = dict(spec.file_sha256) if archive_sha == spec.archive.sha256 else {}
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
        for name, path in staged.items():
            os.replace(path, dest / name)
        staged.clear()
    finally:
        for path in staged.values():
            path.unlink(missing_ok=True)
    return digests


def download_corpus(
    name: str,
    cache_dir: str | os.PathLike[str],
    *,
    url: str | None = None,
    sha256: str | None = None,
    splits: Iterable[str] = SPLITS,
    downloader: StallGuardDownloader | None = None,
) -> Path:
    """Return ``cache_dir/<corpus dir>`` holding the verified ``splits``, fetching if needed.

    ``url`` overrides the archive's location (a mirror); ``sha256`` overrides its expected
    checksum, and then the published per-file hashes of the canonical archive do not apply
    (the files are recorded from the archive the caller vouched for). Only the files of
    ``splits`` are extracted. No network access happens when they are present and verified.
    """
    spec = corpus_spec(name)
    url = url or spec.archive.url
    archive_sha = (sha256 or spec.archive.sha256 or "").lower() or None
    names = [spec.files[split] for split in splits]
    dest = Path(cache_dir) / spec.cache_subdir
    dest.mkdir(parents=True, exist_ok=True)
    problem = _cache_problem(names, _expected_hashes(spec, archive_sha, dest), dest)
    if problem is None:
        return dest
    hint = _manual_hint(spec, url, dest, names)
    archive = dest / f".archive-{Path(url).name}"
    try:
        _retrieve(url, archive, archive_sha, downloader or StallGuardDownloader(), problem, hint)
        try:
            digests = _extract(spec, names, archive, url, archive_sha)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as error:
            raise DownloadError(f"archive from {url} is corrupt ({error}). " + hint) from error
    finally:
        archive.unlink(missing_ok=True)
    recorded_archive, recorded = read_manifest(dest)
    kept = recorded if recorded_archive == archive_sha else {}
    write_manifest(dest, archive_sha, {**kept, **digests})
    return dest


def _retrieve(
    url: str,
    archive: Path,
    archive_sha: str | None,
    downloader: StallGuardDownloader,
    problem: str,
    hint: str,
) -> None:
    """Download ``url`` to ``archive`` through pooch, turning its failures into ours."""
    print(f"downloading {url} to {archive.parent}", file=sys.stderr)
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)  # pooch's INFO lines advise on pooch's own API
    try:
        pooch.retrieve(
            url,
            known_hash=archive_sha,
            fname=archive.name,
            path=archive.parent,
            downloader=downloader,
        )
    except ValueError as error:  # pooch: the downloaded file's hash does not match
        raise ChecksumError(
            f"checksum mismatch for {url} (expected sha256 {archive_sha}): {error} "
            + hint.replace("To provide", "Or, to provide")
        ) from None
    except DownloadError as error:
        raise type(error)(
            f"could not download {url}: {error} (cached copy unusable: {problem}). " + hint
        ) from error
    except Exception as error:
        if not _is_transfer_error(error):
            raise
        if _is_timeout(error):
            raise DownloadStallError(
                f"could not download {url}: the server sent no data for {downloader.timeout:g} s "
                f"(timeout; cached copy unusable: {problem}). " + hint
            ) from error
        raise DownloadError(
            f"could not download {url}: {_reason(error)} (cached copy unusable: {problem}). " + hint
        ) from error
    finally:
        logger.setLevel(level)


def _is_transfer_error(error: Exception) -> bool:
    """Whether ``error`` comes from the network transfer (not a programming bug)."""
    import requests
    import urllib3

    return isinstance(error, (requests.RequestException, urllib3.exceptions.HTTPError, OSError))


def _is_timeout(error: Exception) -> bool:
    import requests
    import urllib3

    return isinstance(error, (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError))


def _reason(error: Exception) -> str:
    """The operating system's reason inside a wrapped network error ("[Errno 111] Connection
    refused"), else the error's own text."""
    match = re.search(r"\[Errno -?\d+\] [^'\")]+", str(error))
    return match.group(0) if match else str(error)
