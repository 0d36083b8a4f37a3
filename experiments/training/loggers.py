"""The run's Lightning loggers, chosen by ``trainer.logger``: CSV, TensorBoard, W&B (offline).

CSV (``RUN/logs/metrics.csv``) feeds the comparison plots; TensorBoard
(``RUN/tensorboard``) also receives the hyperparameters; Weights & Biases writes an
offline run under ``RUN/wandb`` (sync it later with ``wandb sync``) and needs the
``wandb`` package, imported only when chosen.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    writer makes its own (``experiments.training.runs.HistoryCSVLogger``)."""
    from experiments.training.runs import HistoryCSVLogger

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
