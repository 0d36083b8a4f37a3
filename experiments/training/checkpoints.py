"""Checkpoints of a run: atomic writes, a clear disk-full error, and one crash-consistent cycle.

``RunCheckpoint`` replaces Lightning's two ``ModelCheckpoint`` callbacks (best and periodic
last) with one validate/checkpoint cycle whose files agree at every instant:

1. validation computes ``val/ppl``;
2. if it improved, ``best.ckpt`` is written (atomically);
3. ``last.ckpt`` is written (atomically), holding the new best score and step.

Between validations ``last.ckpt`` is also written every ``every_n_steps`` steps, but never
on a step that validates: a ``last.ckpt`` written before its step's validation would carry
a stale best score. A process killed anywhere in the cycle leaves ``last.ckpt`` at an
earlier point of the same deterministic trajectory; resuming replays the lost steps,
repeats the validation and rewrites ``best.ckpt`` with the same weights.

Checkpoints are read weights-only (``read_checkpoint``): everything in them is
tensors, numbers, strings, lists and dicts, so no pickle of a class or function is ever
loaded, and a checkpoint that would need one (a malicious file) is refused, not run.
"""

from __future__ import annotations

import errno
import os
import pickle
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.training import runfolder
from odelm import files
from odelm.errors import OdelmError
from odelm.lightning import pl

Callback, Checkpoint, TorchCheckpointIO = (
    pl.Callback,
    pl.callbacks.Checkpoint,
    pl.plugins.TorchCheckpointIO,
)

BEST_FILE = "best.ckpt"
LAST_FILE = "last.ckpt"


class DiskFullError(OdelmError, OSError):
    """No space was left to write a file of the run (the previous version is kept)."""


class CorruptCheckpointError(OdelmError, RuntimeError):
    """A checkpoint or weights file cannot be read."""


class UnsafeCheckpointError(CorruptCheckpointError):
    """A checkpoint holds pickled objects that only an unsafe (code-running) load could read."""


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``PATH.partial``, then rename: a crash never truncates ``path``, and
    ``path``'s folder is never a link out of its own parent (``odelm.files.make_dir``).

    A full disk removes the partial file and raises ``DiskFullError`` naming the folder.
    """
    path = Path(path)
    files.make_dir(path.parent)
    try:
        # A Python file object makes a failed write an OSError with its errno instead of
        # a C++ stream error from torch's own writer.
        with files.atomic_write(path) as partial, partial.open("wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException as error:
        if _is_disk_full(error):
            raise DiskFullError(
                errno.ENOSPC,
                f"no space left on {path.parent} while writing {path.name}; free some space or "
                "choose another out_dir (the previous file is kept)",
            ) from None
        raise


@contextmanager
def disk_full_is_one_line(folder: Path) -> Iterator[None]:
    """Any other write of a run that fills the disk (logs, tokenizer, result) ends in
    ``DiskFullError`` naming the file, not in a traceback."""
    try:
        yield
    except OSError as error:
        if isinstance(error, OdelmError) or not _is_disk_full(error):
            raise
        where = error.filename or folder
        raise DiskFullError(
            errno.ENOSPC,
            f"no space left on device writing {where}; free some space or choose another "
            "out_dir (the run resumes from its last checkpoint)",
        ) from None


def _is_disk_full(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU, weights-only (no code runs), naming the file when it is
    truncated, corrupt, or would need an unsafe load."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UnsafeCheckpointError(
            f"{path} holds pickled objects other than tensors and plain data, which could run "
            "code when loaded; odelm refuses it. Delete it, or retrain with --overwrite"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise CorruptCheckpointError(
            f"{path} is corrupt or truncated ({str(error).splitlines()[0]}); delete it to "
            "restart from an earlier checkpoint, or retrain with --overwrite"
        ) from None
    if not isinstance(checkpoint, dict):
        raise CorruptCheckpointError(
            f"{path} is not a checkpoint (it holds a {type(checkpoint).__name__}, not a dict); "
            "delete it, or retrain with --overwrite"
        )
    return checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer through ``atomic_save``."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        atomic_save(checkpoint, path)

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Resuming reads through ``read_checkpoint``: weights-only, whatever is asked."""
        return read_checkpoint(path)


class RunCheckpoint(Checkpoint):
    """``best.ckpt`` (lowest ``monitor``) and ``last.ckpt`` in one crash-consistent cycle."""

    def __init__(
        self, dirpath: str | Path, every_n_steps: int, val_every: int, monitor: str = "val/ppl"
    ) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_steps, self.val_every, self.monitor = every_n_steps, val_every, monitor
        self.best_score: float | None = None
        self.best_step: int | None = None

    @property
    def best_model_path(self) -> Path | None:
        return self.dirpath / BEST_FILE if self.best_score is not None else None

    @best_model_path.setter
    def best_model_path(self, value: Any) -> None:
        """Lightning's spawn launcher hands the workers' path back; the state is re-read
        from ``last.ckpt`` instead (``reload_state``)."""

    def reload_state(self) -> None:
        """Take the best score and step from ``last.ckpt`` (after a spawned run, whose
        callbacks lived in the worker processes)."""
        if self.last_path.is_file():
            state = read_checkpoint(self.last_path)["callbacks"].get(self.state_key)
            if state is not None:
                self.load_state_dict(state)

    @property
    def last_path(self) -> Path:
        return self.dirpath / LAST_FILE

    def on_train_batch_end(self, trainer: pl.Trainer, task, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step % self.val_every != 0:
            self._save_last(trainer)

    def on_validation_end(self, trainer: pl.Trainer, task: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        score = trainer.callback_metrics.get(self.monitor)
        if score is not None and (self.best_score is None or float(score) < self.best_score):
            self.best_score, self.best_step = float(score), trainer.global_step
            trainer.save_checkpoint(self.dirpath / BEST_FILE)
        self._save_last(trainer)

    def _save_last(self, trainer: pl.Trainer) -> None:
        """Flush the logs first, so the history on disk reaches at least this checkpoint."""
        for logger in trainer.loggers:
            logger.save()
        trainer.save_checkpoint(self.last_path)

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score, "best_step": self.best_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_score = state_dict["best_score"]
        self.best_step = state_dict["best_step"]


class CheckpointAverager(Callback):
    """Keeps the weights of the last ``n`` validations; the run ends with their average
    (the ODE Transformer paper averages its last checkpoints)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=n)

    def on_validation_end(self, trainer: pl.Trainer, task: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.snapshots.append(
                {k: v.detach().cpu().clone() for k, v in task.model.state_dict().items()}
            )

    def average(self) -> dict[str, torch.Tensor]:
        keys = self.snapshots[0].keys()
        return {
            k: torch.stack([s[k].double() for s in self.snapshots])
            .mean(0)
            .to(self.snapshots[0][k].dtype)
            for k in keys
        }

    def state_dict(self) -> dict[str, Any]:
        return {"snapshots": list(self.snapshots)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.snapshots = deque(state_dict["snapshots"], maxlen=self.n)


def resume_point(run_dir: Path) -> tuple[Path | None, int | None]:
    """``last.ckpt`` and its step when the run has one (checked readable), else (None, None).

    Partial files left by a process killed mid-write, and a link planted at ``last.ckpt``
    (the link, not its target), are removed (by global rank 0).
    """
    folder = run_dir / "checkpoints"
    files.check_inside(folder, run_dir, follow_last=True)  # never read or clean a link's folder
    last = folder / LAST_FILE
    stale = [*folder.glob("*.partial"), *([last] if last.is_symlink() else [])]
    for path in [] if runfolder.is_worker_process() else stale:  # a link: odelm never wrote it
        files.remove(path, root=run_dir)
    if not last.is_file():
        return None, None
    step = read_checkpoint(last).get("global_step")
    if not isinstance(step, int):
        raise CorruptCheckpointError(f"{last} has no global_step; delete it or use --overwrite")
    return last, step


def select_weights(
    model: nn.Module, checkpoint: RunCheckpoint, averager: CheckpointAverager | None
) -> str:
    """Load the weights the run reports into ``model``; returns how they were chosen."""
    if averager and averager.snapshots:
        model.load_state_dict(averager.average())
        return f"average of last {len(averager.snapshots)} validations"
    if checkpoint.best_model_path is not None:
        state = read_checkpoint(checkpoint.best_model_path)["state_dict"]
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
        return "best validation"
    return "last"
