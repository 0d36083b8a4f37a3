"""Fetch a named corpus's published archive into a cache dir, verified and atomically.

The transfer is ``pooch``'s: the archive is streamed to a temporary file, hash-checked
against the archive's SHA-256 (the published one or ``--sha256``, when one exists) before
anything is extracted, and only then moved into place. The downloader below adds what a
stalling mirror needs: connect/read timeouts, a minimum rate (a server that trickles bytes
ends in ``DownloadStallError``, never an endless wait) and a progress bar on a terminal.
Only ``http://`` and ``https://`` addresses are fetched.

The split files are then extracted (``experiments.data.extract``: sizes bounded before
anything is written, all transient files in one staging folder that the next download
cleans), checked against their published hashes (``CorpusSpec.file_sha256``, only when the
archive is the canonical one), and renamed into place; their hashes go to the folder's
manifest, so a cached file that was truncated or altered later is never taken as valid (it
is fetched again).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tarfile
import time
import urllib.parse
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pooch

from experiments.data.checksums import ChecksumError, read_manifest, verify_file, write_manifest
from experiments.data.extract import extract_splits, staging_folder
from experiments.data.registry import SPLITS, CorpusSpec, DownloadError, corpus_spec
from odelm import __version__, files

__all__ = ["DownloadError", "DownloadStallError", "StallGuardDownloader", "download_corpus"]

_CHUNK = 1 << 20


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

    ``url`` overrides the archive's location (a mirror, http or https only); ``sha256``
    overrides its expected checksum, and then the published per-file hashes of the canonical
    archive do not apply (the files are recorded from the archive the caller vouched for).
    Only the files of ``splits`` are extracted. No network access happens when they are
    present and verified.
    """
    spec = corpus_spec(name)
    url = url or spec.archive.url
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise DownloadError(
            f"--url {url!r}: only http:// and https:// addresses are downloaded; for files "
            "you already have, put them in a folder and point --data-dir at it"
        )
    archive_sha = (sha256 or spec.archive.sha256 or "").lower() or None
    names = [spec.files[split] for split in splits]
    dest = _cache_folder(Path(cache_dir), spec)
    problem = _cache_problem(names, _expected_hashes(spec, archive_sha, dest), dest)
    if problem is None:
        return dest
    hint = _manual_hint(spec, url, dest, names)
    with staging_folder(dest, spec) as staging:
        problem = _cache_problem(names, _expected_hashes(spec, archive_sha, dest), dest)
        if problem is None:  # another process fetched them while this one waited
            return dest
        archive = staging / f"archive-{Path(urllib.parse.urlsplit(url).path).name}"
        print(f"downloading {url} to {dest}", file=sys.stderr)
        _retrieve(url, archive, archive_sha, downloader or StallGuardDownloader(), problem, hint)
        # the published per-file hashes are those of the canonical archive's files
        expected = dict(spec.file_sha256) if archive_sha == spec.archive.sha256 else {}
        try:
            digests = extract_splits(spec, names, archive, url, expected, dest)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as error:
            raise DownloadError(f"archive from {url} is corrupt ({error}). " + hint) from error
        recorded_archive, recorded = read_manifest(dest)
        kept = recorded if recorded_archive == archive_sha else {}
        write_manifest(dest, archive_sha, {**kept, **digests})
    return dest


def _cache_folder(cache_dir: Path, spec: CorpusSpec) -> Path:
    """``cache_dir/<corpus dir>``, created; a cache dir that is a file is one clear error."""
    dest = cache_dir / spec.cache_subdir
    for folder in (cache_dir, dest):
        if folder.exists() and not folder.is_dir():
            raise DownloadError(f"the cache folder {folder} is a file; give --cache-dir a folder")
    try:
        files.make_dir(dest, root=dest)  # the cache folder a user names (a link there is theirs)
    except OSError as error:
        raise DownloadError(
            f"cannot create the cache folder {dest} ({error.strerror}); give --cache-dir a "
            "writable folder"
        ) from None
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
