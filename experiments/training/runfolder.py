"""What odelm may write and delete: run names, folder markers, the run lock, file checksums.

A run's name is one folder name of safe characters (``check_run_name``), so a run
stays inside ``out_dir``. Every folder odelm makes for a run (or a comparison) carries a
marker file (``RUN_MARKER``, ``COMPARISON_MARKER``) saying odelm wrote it; a
non-empty folder without one is never written into, and ``--overwrite`` deletes only the
names odelm makes in a marked run folder (``RUN_FILES``), never other files.

While a process trains in a run folder it holds an exclusive ``flock`` on
``LOCK_FILE`` (released by the kernel when the process ends, however it ends); a second
process gets ``RunInUseError`` naming the holder's PID. The run marker also records
the SHA-256 of the files a finished run is loaded from, which ``verify_run_files``
checks on load. Every file here is written and deleted through ``odelm.files``, never
through a link that leaves the run folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from experiments.data.checksums import (  # noqa: F401 (RunFilesChangedError re-exported)
    RUN_MARKER,
    RunFilesChangedError,
    verify_recorded_files,
)
from experiments.data.tokenization import LMData
from experiments.training.rankorder import rank_zero_first
from odelm import __version__, files
from odelm.errors import OdelmError
from odelm.pretrained import file_sha256

COMPARISON_MARKER = ".odelm-comparison"
LOCK_FILE = ".odelm-lock"
RUN_FILES = frozenset(
    {
        "config.yaml",
        "result.json",
        "result.json.partial",
        "tokenizer",
        "tokenizer.json",
        "tokenizer_config.json",
        "checkpoints",
        "logs",
        "tensorboard",
        "wandb",
        "model",
        "README.md",
        ".write-test",
    }
)
"""The names odelm makes inside a run folder: all that ``--overwrite`` ever deletes."""
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK")
"""Where launchers put a process's rank: the global rank (torchrun, ``srun``), then the local
and node ranks (Lightning's ``ddp`` launcher re-runs the command with them)."""
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


class RunNameError(OdelmError, ValueError):
    """A run name is not one safe folder name."""


class ForeignFolderError(OdelmError, FileExistsError):
    """A non-empty folder odelm did not make (no marker) was to be written into."""


class FolderWriteError(OdelmError, OSError):
    """A run or comparison folder cannot be made or marked."""


class RunInUseError(OdelmError, BlockingIOError):
    """Another process is training in the run folder."""


class RankVariableError(OdelmError, ValueError):
    """A launcher's rank variable (``RANK``, ``LOCAL_RANK``, ...) is not an integer."""


def check_run_name(name: Any, what: str = "run name") -> None:
    """Refuse a name that is not one folder name of letters, digits, ``.``, ``_`` and ``-``
    (not starting with ``.``, at most 128 characters): no ``/``, ``..``, absolute paths."""
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise RunNameError(
            f"{what} {name!r} is not one folder name; use 1-128 letters, digits, '.', '_' or "
            "'-', not starting with '.' (the run is written to out_dir/NAME)"
        )


def check_not_foreign(folder: Path, marker: str = RUN_MARKER) -> None:
    """Refuse a folder that exists, is not empty, and carries no odelm ``marker``."""
    if folder.is_dir() and not (folder / marker).is_file() and any(folder.iterdir()):
        raise ForeignFolderError(
            f"{folder} is not empty and odelm did not make it (no {marker} marker), so odelm "
            "will not write or delete anything there; choose another name or folder (a run "
            f"made by an older odelm is adopted by creating {folder / marker})"
        )


def _write_marker(folder: Path, marker: str, values: dict[str, Any]) -> None:
    text = json.dumps({"odelm": __version__, **values}, indent=2) + "\n"
    files.write_text(folder / marker, text, root=folder)


def read_marker(folder: Path, marker: str = RUN_MARKER) -> dict[str, Any]:
    """The marker's JSON ({} for a marker a user created empty to adopt an old run)."""
    try:
        values = json.loads((folder / marker).read_text() or "{}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return values if isinstance(values, dict) else {}


def claim_folder(folder: Path, marker: str, kind: str, named: bool = False) -> None:
    """Make ``folder`` (refusing a foreign one) and mark it as odelm's ``kind`` folder. A
    run's folder is a name odelm makes in ``out_dir``, never a link out of it; a folder the
    user ``named`` (a comparison's ``--out``) may be a link."""
    check_not_foreign(folder, marker)
    try:
        files.make_dir(folder, root=folder if named else folder.parent)
        if not (folder / marker).is_file():
            _write_marker(folder, marker, {"kind": kind, "files": {}})
    except OSError as error:
        if isinstance(error, OdelmError):
            raise
        raise FolderWriteError(
            f"cannot make {kind} folder {folder} ({error.strerror}); choose another folder"
        ) from None


def clear_run(run_dir: Path) -> None:
    """Delete what odelm made in a marked run folder (``RUN_FILES``) and nothing else."""
    check_not_foreign(run_dir)
    if not run_dir.is_dir():
        return
    for name in sorted(RUN_FILES):
        files.remove(run_dir / name, root=run_dir)
    _write_marker(run_dir, RUN_MARKER, {"kind": "run", "files": {}})


def process_rank() -> int:
    """This process's rank in a distributed run, read from ``RANK_VARIABLES`` (the largest
    one set; 0 in the main process and outside a distributed run)."""
    ranks = [0]
    for key in RANK_VARIABLES:
        value = os.environ.get(key, "").strip()
        if value:
            try:
                ranks.append(int(value))
            except ValueError:
                raise RankVariableError(
                    f"environment variable {key}={value!r} is not an integer rank; unset it, "
                    "or let the launcher (torchrun, srun, Lightning) set it"
                ) from None
    return max(ranks)


def is_worker_process() -> bool:
    """True in a distributed run's other processes (global rank under torchrun or ``srun``,
    local or node rank under Lightning's ``ddp`` launcher above 0): they neither lock, clear
    nor write the run folder's files; global rank 0 does."""
    return process_rank() > 0


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock, or raise ``RunInUseError`` naming the holder."""
    if is_worker_process():
        yield
        return
    path = run_dir / LOCK_FILE
    try:
        descriptor = files.open_fd(path, os.O_RDWR, root=run_dir)  # a link there is replaced
    except OSError as error:
        if isinstance(error, OdelmError):
            raise
        why = "is a directory, not odelm's lock file" if path.is_dir() else error.strerror
        raise FolderWriteError(
            f"cannot take the run lock {path} ({why}); remove it, or give this run another name"
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunInUseError(
                f"run {run_dir} is in use by another odelm process (PID {holder}); wait for it "
                "to finish or stop it, or give this run another name"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


@contextmanager
def claimed_run(run_dir: Path, *, overwrite: bool = False) -> Iterator[None]:
    """Mark ``run_dir`` as a run folder and hold its lock; ``overwrite`` first clears what
    odelm made there (``clear_run``). In a distributed run only global rank 0 does, and
    the other ranks wait for it (``experiments.training.rankorder.rank_zero_first``)."""
    if not is_worker_process():
        claim_folder(run_dir, RUN_MARKER, "run")
    with run_lock(run_dir):
        with rank_zero_first(run_dir, is_worker_process()):  # torchrun starts all ranks at once
            if overwrite and not is_worker_process():
                clear_run(run_dir)
        yield


def _files_under(run_dir: Path, names: Iterable[str]) -> list[str]:
    found: list[str] = []
    for name in names:
        path = run_dir / name
        if path.is_dir():
            found += sorted(str(p.relative_to(run_dir)) for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            found.append(name)
    return found


def record_run_files(
    run_dir: Path, names: Iterable[str], data_sha256: dict[str, str] | None = None
) -> None:
    """Record in the run marker the SHA-256 of each file under ``names`` (files or folders)
    and, given, of each split's tokens (``data_sha256``: what ``odelm eval`` checks the
    splits against, also when ``result.json`` is damaged)."""
    files = {name: file_sha256(run_dir / name) for name in _files_under(run_dir, names)}
    splits = {} if data_sha256 is None else {"data_sha256": data_sha256}
    marker = read_marker(run_dir)
    _write_marker(run_dir, RUN_MARKER, {**marker, "kind": "run", "files": files, **splits})


def verify_run_files(run_dir: Path) -> None:
    """Refuse a run whose recorded files changed (a run with no record is not checked)."""
    verify_recorded_files(run_dir)


def split_checksums(data: LMData) -> dict[str, str]:
    """SHA-256 of each split's token ids (int64) under the run's tokenizer."""
    return {
        name: hashlib.sha256(split.ids.to(torch.int64).numpy().tobytes()).hexdigest()
        for name, split in sorted(data.splits.items())
    }
