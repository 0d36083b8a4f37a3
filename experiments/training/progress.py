"""Progress of the runs a grid has in flight: what each training process reports, and the
status lines ``odelm compare`` shows.

Every training process keeps ``RUN/logs/progress.json`` up to date (``ProgressFile``, a
Lightning callback; at most one write per ``WRITE_EVERY_S`` seconds, and at each
validation and at the end of training): its step and step budget, tokens per second, steps
per second, the last validation perplexity and its phase. The file is plain JSON written
atomically, so the process that launched the run reads it wherever the run trains (a
shared filesystem) and never needs the trainer's objects.

``ProgressBoard`` shows one line per run in flight (``status_line``): redrawn in
place on a terminal, printed as plain lines every ``every`` seconds otherwise (a log file
grows by one line per run per interval, however long the runs take).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from experiments.training.runs import write_json
from odelm import files
from odelm.lightning import pl

Callback, Timer = pl.Callback, pl.callbacks.Timer

PROGRESS_FILE = Path("logs") / "progress.json"
WRITE_EVERY_S = 2.0
PLAIN_EVERY_S = 30.0


class ProgressFile(Callback):
    """Write the run's progress to ``path`` as JSON while it trains (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.tokens = 0
        self._first: tuple[float, int] | None = None  # (time, step) of this process's first batch
        self._written = -math.inf
        self.val_ppl: float | None = None

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        if self._first is None:
            self._first = (time.perf_counter(), trainer.global_step)

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx) -> None:
        tokens = batch[0] if isinstance(batch, (tuple, list)) else batch
        now = time.perf_counter()
        self.tokens += tokens[:, 1:].numel() * trainer.world_size
        if now - self._written >= WRITE_EVERY_S:
            self.write(trainer, "training")

    def on_validation_end(self, trainer, task) -> None:
        ppl = trainer.callback_metrics.get("val/ppl")
        if ppl is not None and not trainer.sanity_checking:
            self.val_ppl = float(ppl)
            self.write(trainer, "training")

    def on_train_end(self, trainer, task) -> None:
        self.write(trainer, "testing")

    def write(self, trainer, phase: str) -> None:
        """Write the current progress (rank 0 only; the others train the same steps)."""
        if trainer.global_rank != 0:
            return
        now = time.perf_counter()
        values: dict[str, Any] = {
            "phase": phase,
            "step": trainer.global_step,
            "max_steps": trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
            "max_time_s": _max_time_s(trainer),
            "val_ppl": self.val_ppl,
            "tokens_per_s": None,
            "steps_per_s": None,
            "updated": time.time(),
        }
        if self._first is not None and now > self._first[0]:
            seconds = now - self._first[0]
            values["tokens_per_s"] = self.tokens / seconds
            values["steps_per_s"] = (trainer.global_step - self._first[1]) / seconds
            values["seconds"] = seconds
        files.make_dir(self.path.parent)  # refused if a link out of the run folder
        write_json(self.path, values)
        self._written = now


class StepDescription(Callback):
    """The training bar's description counts steps (``Epoch 0 · step 40/200``; Lightning's
    Rich bar reads ``Epoch 0/-2`` under a step budget), set after each batch through the
    bar's public tqdm bar or Rich ``Progress``."""

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        bar = trainer.progress_bar_callback
        text = f"Epoch {trainer.current_epoch} · step {trainer.global_step}/{trainer.max_steps}"
        if isinstance(bar, pl.callbacks.RichProgressBar):
            if bar.progress is not None and bar.train_progress_bar_id is not None:
                style = bar.theme.description
                description = f"[{style}]{text}" if style else text
                bar.progress.update(bar.train_progress_bar_id, description=description)
        elif isinstance(bar, pl.callbacks.TQDMProgressBar) and bar.is_enabled:
            bar.train_progress_bar.set_description(text)


def step_description(trainer: Any) -> list[Callback]:
    """``[StepDescription()]`` when ``trainer`` has a progress bar and its budget is in steps
    (``max_steps``, no ``max_epochs``), else empty: what ``LMTask.configure_callbacks``
    adds."""
    if trainer is None or trainer.progress_bar_callback is None:
        return []
    if trainer.max_steps is None or trainer.max_steps < 0 or trainer.max_epochs not in (None, -1):
        return []
    return [StepDescription()]


def _max_time_s(trainer) -> float | None:
    """The trainer's wall-time budget in seconds (``max_time``), if it has one."""
    for callback in trainer.callbacks:
        if isinstance(callback, Timer) and callback._duration is not None:
            return float(callback._duration)
    return None


def read_progress(path: Path) -> dict[str, Any] | None:
    """The progress a run last wrote, or None (not written yet, or being replaced)."""
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def duration(seconds: float) -> str:
    """``45 s``, ``12 min 05 s``, ``3 h 02 min``: a time for people."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def eta_seconds(progress: dict[str, Any]) -> float | None:
    """Seconds left in training at the measured step rate (or the wall-time budget left)."""
    step, total, rate = progress.get("step"), progress.get("max_steps"), progress.get("steps_per_s")
    left = []
    if total and rate and step is not None:
        left.append(max(0, total - step) / rate)
    budget, seconds = progress.get("max_time_s"), progress.get("seconds")
    if budget and seconds is not None:
        left.append(max(0.0, budget - seconds))
    return min(left) if left else None


def status_line(label: str, progress: dict[str, Any] | None) -> str:
    """One run's status: ``LABEL: step 120/800 (15%), 5,432 tok/s, ETA 3 min 05 s, val ppl
    45.21`` (the parts it knows), ``LABEL: starting`` before its first report."""
    if not progress:
        return f"{label}: starting"
    step, total = progress.get("step", 0), progress.get("max_steps")
    parts = [f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"]
    if progress.get("phase") == "testing":
        parts.append("testing")
    else:
        if progress.get("tokens_per_s"):
            parts.append(f"{progress['tokens_per_s']:,.0f} tok/s")
        eta = eta_seconds(progress)
        if eta is not None:
            parts.append(f"ETA {duration(eta)}")
    if progress.get("val_ppl") is not None:
        parts.append(f"val ppl {progress['val_ppl']:.2f}")
    return f"{label}: {', '.join(parts)}"


class ProgressBoard:
    """The status lines of the runs in flight, between the lines that report events.

    On a terminal the block of status lines is redrawn in place (events print above it);
    elsewhere the lines are printed, indented, once every ``every`` seconds.
    """

    def __init__(
        self, stream: TextIO | None = None, every: float = PLAIN_EVERY_S, tty: bool | None = None
    ) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every
        self._shown = 0  # status lines on screen (terminal)
        self._last = time.monotonic()  # the last plain report (none at the start)

    def event(self, text: str) -> None:
        """Print one event line (a run started, finished, failed)."""
        self._clear()
        print(text, file=self.stream, flush=True)

    def update(self, lines: list[str]) -> None:
        """Show the status lines of the runs in flight."""
        if self.tty:
            self._clear()
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would not be erased
            for line in lines:
                print(line[:width], file=self.stream)
            self._shown = len(lines)
            self.stream.flush()
        elif lines and time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            print("\n".join(f"  {line}" for line in lines), file=self.stream, flush=True)

    def close(self) -> None:
        """Remove the status lines (terminal)."""
        self._clear()

    def _clear(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\x1b[1A\x1b[2K" * self._shown)
            self.stream.flush()
        self._shown = 0
