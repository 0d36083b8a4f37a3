"""The run's Lightning loggers, chosen by ``trainer.logger``: CSV, TensorBoard, W&B (offline).

CSV (``RUN/logs/metrics.csv``) feeds the comparison plots; TensorBoard
(``RUN/tensorboard``) also receives the hyperparameters; Weights & Biases writes an
offline run under ``RUN/wandb`` (sync it later with ``wandb sync``) and needs the
``wandb`` package, imported only when chosen.

``HistoryCSVLogger`` keeps ``logs/metrics.csv`` across resumptions: rows logged before the
checkpoint a run resumes from stay, rows of the lost steps after it are dropped (the
resumed process logs them again).
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from typing import Any

from experiments.training.config import ConfigError
from experiments.training.run_schema import LOGGERS
from experiments.training.runfolder import is_worker_process
from odelm import files
from odelm.lightning import pl


def build_loggers(
    names: list[str], run_dir: Path, run_name: str, keep_csv_before: int | None = None
) -> list[pl.loggers.Logger]:
    """One Lightning logger per name in ``names`` (see ``LOGGERS``); a resumed run's CSV
    keeps its rows logged before step ``keep_csv_before``. TensorBoard and W&B get their
    folders from ``odelm.files.writer_dir`` (no link in them) on global rank 0; the CSV
    writer makes its own (``HistoryCSVLogger``)."""
    loggers: list[pl.loggers.Logger] = []
    for name in names:
        if name == "csv":
            loggers.append(
                HistoryCSVLogger(run_dir, name="logs", version="", keep_before=keep_csv_before)
            )
        elif name == "tensorboard":
            _logger_dir(run_dir, name)
            loggers.append(pl.loggers.TensorBoardLogger(run_dir, name="tensorboard", version=""))
        elif name == "wandb":
            if importlib.util.find_spec("wandb") is None:
                raise ConfigError(
                    "trainer.logger wandb needs the wandb package: pip install wandb "
                    "(or choose csv / tensorboard)"
                )
            _logger_dir(run_dir, name)
            loggers.append(
                pl.loggers.WandbLogger(
                    name=run_name, save_dir=str(run_dir), offline=True, project="odelm"
                )
            )
        else:
            raise ConfigError(f"trainer.logger {name!r} is not one of {', '.join(LOGGERS)}")
    return loggers


def _logger_dir(run_dir: Path, name: str) -> None:
    """The logger's folder ``RUN/NAME``, holding no link (on global rank 0, which writes it)."""
    if not is_worker_process():
        files.writer_dir(run_dir / name, root=run_dir)


class _HistoryWriter(pl.loggers.csv_logs.ExperimentWriter):
    """Lightning's CSV writer, keeping the rows logged before ``keep_before``."""

    def __init__(self, log_dir: str, keep_before: int | None) -> None:
        self.keep_before = keep_before
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        files.writer_dir(path.parent, root=path.parent.parent)  # Lightning writes in it
        if not path.is_file():
            return
        if self.keep_before is None:
            files.remove(path)
            return
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            rows = [row for row in reader if int(row["step"]) < self.keep_before]
        with files.atomic_write(path) as partial, partial.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        self.metrics_keys = sorted(header)


class HistoryCSVLogger(pl.loggers.CSVLogger):
    """``CSVLogger`` that resumes ``metrics.csv`` at step ``keep_before`` instead of erasing it."""

    def __init__(self, *args: Any, keep_before: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep_before = keep_before

    @property
    @pl.loggers.logger.rank_zero_experiment
    def experiment(self) -> pl.loggers.csv_logs.ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _HistoryWriter(self.log_dir, self.keep_before)
        return self._experiment
