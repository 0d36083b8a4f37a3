"""The one way odelm writes and deletes files: atomically, and never through a link that
leads out of the folder odelm owns there.

Every write or delete names its ``root``, the folder odelm owns for it (a run folder, a
comparison folder, an export or output folder; by default the file's own folder). One rule
holds for all of them:

- a symbolic link *on the way* (a folder between ``root`` and the file) whose target leaves
  ``root`` is refused with [`LinkEscapeError`][odelm.files.LinkEscapeError], before anything
  is written;
- a link *at* the written name is replaced like any old file (the rename or unlink acts on
  the link itself, never on its target); a folder odelm writes into (``make_dir``) that is a
  link leaving ``root`` is refused.

So nothing outside ``root`` is ever written, truncated, renamed into or deleted. A library
that writes its own files (Lightning's loggers, a tokenizer's ``save``) gets either a
partial file from ``atomic_write`` or a folder from ``writer_dir``, which holds no link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from odelm.errors import OdelmError

StrPath = str | os.PathLike[str]


class LinkEscapeError(OdelmError, OSError):
    """A path odelm would write or delete leads, through a symbolic link, out of the folder
    odelm owns there."""


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _refuse(link: Path, root: Path) -> LinkEscapeError:
    return LinkEscapeError(
        f"{link} is a symbolic link to {os.readlink(link)}, outside {root}; odelm writes only "
        "inside the folders it owns, so it writes nothing through it: remove the link"
    )


def check_inside(path: StrPath, root: StrPath, *, follow_last: bool = False) -> Path:
    """``path`` (``root`` itself or a path under it) once no link between ``root`` and it
    leads out of ``root``; its last part is checked too when ``follow_last`` (a folder to write
    into), else left to the caller, which replaces a link there rather than following it."""
    path, root = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    if not _within(path, root):
        raise ValueError(f"{path} is not inside {root}")  # a bug of the caller, not the user's
    base, current = root.resolve(), root
    parts = path.relative_to(root).parts
    for index, part in enumerate(parts):
        current = current / part
        last = index == len(parts) - 1
        checked = follow_last or not last
        if checked and current.is_symlink() and not _within(current.resolve(), base):
            raise _refuse(current, root)
    return path


def _remove_link(path: Path) -> None:
    """Remove a link at ``path`` (the link, never its target)."""
    if path.is_symlink():
        path.unlink()


def make_dir(path: StrPath, *, root: StrPath | None = None) -> Path:
    """Make folder ``path`` (and its parents) inside ``root`` (default: ``path``'s parent),
    refusing a link on the way or at ``path`` whose target leaves ``root``."""
    path = Path(path)
    folder = check_inside(path, path.parent if root is None else root, follow_last=True)
    folder.mkdir(parents=True, exist_ok=True)
    return path


def writer_dir(path: StrPath, *, root: StrPath) -> Path:
    """``make_dir``, and every link inside the folder removed (the links, not their targets):
    a folder handed to a library that writes its own files there."""
    folder = make_dir(path, root=root)
    for parent, folders, names in os.walk(folder):
        for name in folders + names:
            _remove_link(Path(parent, name))
    return folder


@contextlib.contextmanager
def atomic_write(
    path: StrPath, suffix: str = ".partial", *, root: StrPath | None = None
) -> Iterator[Path]:
    """Yield ``PATH + suffix``, a new empty file to write; when the block ends it is renamed
    onto ``path`` (a crash leaves the old ``path`` whole; a link at ``path`` is replaced, not
    followed), and when the block raises it is removed. ``root`` (default: ``path``'s folder)
    is the folder odelm owns: a link on the way leaving it is refused."""
    path = check_inside(path, Path(path).parent if root is None else root)
    partial = path.with_name(path.name + suffix)
    remove(partial, root=path.parent)  # a stale partial file, or a link planted there
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def write_text(path: StrPath, text: str, *, root: StrPath | None = None, **options: Any) -> None:
    """Write ``text`` to ``path`` atomically (``atomic_write``); ``options`` go to
    ``Path.write_text`` (``encoding``, ``newline``)."""
    with atomic_write(path, root=root) as partial:
        partial.write_text(text, **options)


def write_bytes(path: StrPath, data: bytes, *, root: StrPath | None = None) -> None:
    """Write ``data`` to ``path`` atomically (``atomic_write``)."""
    with atomic_write(path, root=root) as partial:
        partial.write_bytes(data)


def copy_file(source: StrPath, path: StrPath, *, root: StrPath | None = None) -> None:
    """Copy the file ``source`` to ``path`` atomically (``atomic_write``)."""
    with atomic_write(path, root=root) as partial:
        shutil.copyfile(source, partial)


def move_file(source: StrPath, path: StrPath, *, root: StrPath | None = None) -> None:
    """Rename the file ``source`` (odelm's own staged file) onto ``path``: a link at ``path``
    is replaced, never written through."""
    os.replace(source, check_inside(path, Path(path).parent if root is None else root))


def open_fd(path: StrPath, flags: int, *, root: StrPath | None = None) -> int:
    """``os.open(path, flags | O_CREAT)`` that never follows a link at ``path`` (it is
    replaced by a new file) nor one on the way out of ``root``; returns the descriptor."""
    path = check_inside(path, Path(path).parent if root is None else root)
    _remove_link(path)
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, 0o666)


def open_new(path: StrPath, *, root: StrPath | None = None) -> IO[str]:
    """``path`` opened for writing text from its start (a log file that a child process
    writes as it runs), by ``open_fd``'s rule."""
    return os.fdopen(open_fd(path, os.O_WRONLY | os.O_TRUNC, root=root), "w")


def remove(path: StrPath, *, root: StrPath | None = None) -> None:
    """Delete ``path`` if it exists: a file or link is unlinked (a link's target is kept), a
    folder removed with all it holds (links inside removed, never followed)."""
    path = check_inside(path, Path(path).parent if root is None else root)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def write_all(texts: dict[Path, str]) -> None:
    """Write every file of ``texts`` or none: each is written whole beside its target first
    (``atomic_write``, so a link at a target is replaced, never followed), and only when all
    of them are written are they renamed into place, back to back."""
    with contextlib.ExitStack() as stack:
        partials = {path: stack.enter_context(atomic_write(path)) for path in texts}
        for path, partial in partials.items():
            partial.write_text(texts[path], encoding="utf-8")
