"""``atomic_write``: the one way odelm writes a file that must never be seen half-written."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], suffix: str = ".partial") -> Iterator[Path]:
    """Yield ``PATH + suffix`` to write; when the block ends it is renamed onto ``path``
    (a crash leaves the old ``path`` whole), and when the block raises it is removed."""
    path = Path(path)
    partial = path.with_name(path.name + suffix)
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def write_all(texts: dict[Path, str]) -> None:
    """Write every file of ``texts`` or none: each is written whole beside its target
    first, and only when all of them are written are they renamed into place (a failed
    write leaves every target as it was)."""
    partials: list[tuple[Path, Path]] = []
    try:
        for path, text in texts.items():
            partial = path.with_name(path.name + ".partial")
            partials.append((partial, path))
            partial.write_text(text, encoding="utf-8")
    except BaseException:
        for partial, _ in partials:
            partial.unlink(missing_ok=True)
        raise
    for partial, path in partials:
        os.replace(partial, path)
