"""Extract a corpus's split files from a downloaded archive: bounded, staged and cleaned.

Every transient file of a download (pooch's temporary file, the archive, the extracted
splits before their check) lives in one hidden staging folder inside the corpus folder,
used under an exclusive lock on that folder. A download that was killed leaves its files
there; the next download removes them before it starts, so no stale partial file stays.

Extraction is bounded before it writes: a split file larger than ``MAX_MEMBER_BYTES`` or
splits larger than ``MAX_TOTAL_BYTES`` together are refused from the sizes the archive
declares (``zipfile`` and ``tarfile`` never yield more than a member's declared size), so
a small archive that expands to gigabytes writes nothing. The largest real split (the
WikiText-2 train file) is about 11 MB.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from experiments.data.checksums import ChecksumError, sha256_file
from experiments.data.registry import CorpusSpec, DownloadError
from odelm import files

MAX_MEMBER_BYTES = 64 << 20
"""The most one extracted split file may hold (64 MiB)."""
MAX_TOTAL_BYTES = 128 << 20
"""The most the extracted split files may hold together (128 MiB)."""
STAGING = ".odelm-download"
"""The hidden folder (inside the corpus folder) that holds a download's transient files."""
_CHUNK = 1 << 20


@contextlib.contextmanager
def staging_folder(dest: Path, spec: CorpusSpec) -> Iterator[Path]:
    """Lock ``dest`` for this process, remove stale partial files, yield an empty staging
    folder, and remove it (and whatever is left in it) afterwards."""
    import fcntl

    descriptor = os.open(dest, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # a second download waits, then finds the files
        folder = dest / STAGING
        remove_stale_files(dest, spec)
        files.make_dir(folder, root=dest)
        try:
            yield folder
        finally:
            remove_stale_files(dest, spec)
    finally:
        os.close(descriptor)  # releases the lock


def remove_stale_files(dest: Path, spec: CorpusSpec) -> None:
    """Remove the staging folder's files and the partial files earlier versions left in
    ``dest`` (``.archive-*``, ``.<split file>.*.part``); nothing else is touched."""
    files.remove(dest / STAGING, root=dest)  # a link there is removed, never followed
    patterns = [".archive-*", *(f".{name}.*.part" for name in spec.files.values())]
    for pattern in patterns:
        for path in dest.glob(pattern):
            if path.is_file():
                files.remove(path, root=dest)


def archive_kind_error(archive: Path, url: str) -> DownloadError:
    """The one-line error for a download that is neither a zip nor a tar archive."""
    with open(archive, "rb") as handle:
        head = handle.read(512)
    if b"<html" in head.lower() or head.lstrip().lower().startswith(b"<!doctype html"):
        return DownloadError(
            f"{url} served a web page (HTML), not a zip or tar archive; the URL is wrong or "
            "the mirror answered with an error page: check --url"
        )
    return DownloadError(
        f"{url} served a file that is not a readable zip or tar archive (corrupt, or another "
        f"kind of file: it starts with {head[:8]!r}); check --url"
    )


def _members(archive: Path, url: str) -> Iterator[tuple[str, int, Callable[[], IO[bytes]]]]:
    """``(member name without leading './', declared size, opener)`` of every regular file."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    yield (
                        info.filename.removeprefix("./"),
                        info.file_size,
                        lambda i=info: zf.open(i),
                    )
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            for member in tf:
                if member.isfile():
                    opener = lambda m=member: tf.extractfile(m)
                    yield member.name.removeprefix("./"), member.size, opener
    else:
        raise archive_kind_error(archive, url)


def extract_splits(
    spec: CorpusSpec,
    names: list[str],
    archive: Path,
    url: str,
    expected: dict[str, str],
    dest: Path,
) -> dict[str, str]:
    """Extract ``names`` from ``archive`` into the staging folder beside it, check their
    sizes (before writing) and their ``expected`` hashes, then rename them into ``dest``.
    Returns their SHA-256 hashes."""
    staging = archive.parent
    prefix = spec.archive.member_dir.removeprefix("./")
    wanted = {prefix + name: name for name in names}
    digests: dict[str, str] = {}
    total = 0
    for member, size, opener in _members(archive, url):
        if member not in wanted:
            continue
        name = wanted[member]
        if name in digests:
            raise DownloadError(f"archive {url} holds {member} twice; is it the right archive?")
        total += size
        if size > MAX_MEMBER_BYTES or total > MAX_TOTAL_BYTES:
            raise DownloadError(
                f"archive {url}: {member} would expand to {size} bytes ({total} in all), over "
                f"the limit of {MAX_MEMBER_BYTES} bytes per split file and {MAX_TOTAL_BYTES} in "
                "all; refused before extracting (not this corpus's archive)"
            )
        with (
            opener() as stream,
            files.atomic_write(staging / name, suffix=".part") as part,
            part.open("wb") as handle,
        ):
            shutil.copyfileobj(stream, handle, _CHUNK)
        digests[name] = sha256_file(staging / name)
        if name in expected and digests[name] != expected[name]:
            raise ChecksumError(
                f"checksum mismatch for {name} (member {member} of {url}): expected sha256 "
                f"{expected[name]}, got {digests[name]}; the archive is not the canonical one"
            )
    missing = sorted(set(wanted.values()) - set(digests))
    if missing:
        raise DownloadError(f"archive {url} lacks {missing}; is it the right archive?")
    for name in digests:
        files.move_file(staging / name, dest / name)
    return digests
