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
