"""``train(config)``: one run from config to a tested model, resumable, with results on disk.

The entry point of a run: ``experiments.training.trainer`` builds Lightning's ``Trainer``
and fits, ``experiments.training.task`` is the ``LightningModule`` it fits.

A run directory holds ``config.yaml``, the tokenizer, the checkpoints of one crash-consistent
validate/checkpoint cycle (``experiments.training.checkpoints``), logs (``trainer.logger``: CSV,
kept across resumptions, and TensorBoard by default), the final model (``model/``:
``config.json`` + ``model.safetensors``, loadable with no corpus by
``experiments.load_run``) and ``result.json`` (test perplexity,
per-word perplexity, both BLEUs, NFE, throughput, peak memory, parameters, protocol, the
config's hash). A run whose ``result.json`` exists is finished; one with a ``last.ckpt``
resumes from it; either is reused only under the config it was made with
(``experiments.training.runs``).

``train`` returns a finished run's result having written nothing (not even its lock), else
claims the folder and checks its identity;
``experiments.training.trainer.fit_run`` builds the model, the task and the Lightning
trainer of the run and fits, resuming through Lightning's ``ckpt_path``; the trainer's
``experiments.training.result.RunFiles`` callback writes the config and tokenizer at setup
and, when fit ends, tests the best, averaged or last weights
(``experiments.training.metrics.evaluate``) and writes the model, card and result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.data.tokenization import LMData
from experiments.training import runfolder
from experiments.training.checkpoints import disk_full_is_one_line
from experiments.training.config import RunConfig
from experiments.training.datamodule import load_data
from experiments.training.kernels import matmul_precision
from experiments.training.result import RunFiles
from experiments.training.runs import RESULT_FILE, check_same_config
from experiments.training.threads import check_threads, set_threads
from experiments.training.trainer import Callback, fit_run
from odelm import files
from odelm.errors import OdelmError
from odelm.lightning import pl


class OutputDirError(OdelmError, OSError):
    """The run directory cannot be written."""


def prepare_data(config: RunConfig) -> LMData:
    """Load, tokenize and encode the run's corpus."""
    return load_data(config.data)


def check_writable(folder: Path) -> None:
    """Fail before training when the run directory cannot be written (global rank 0 only:
    the other processes of a distributed run would race on the probe)."""
    if runfolder.is_worker_process():
        return
    try:
        files.make_dir(folder)  # a run folder that is a link out of out_dir is refused
        probe = folder / ".write-test"
        files.write_text(probe, "ok", root=folder)
        files.remove(probe, root=folder)
    except OSError as error:
        if isinstance(error, OdelmError):
            raise
        raise OutputDirError(
            f"cannot write to run directory {folder} ({error.strerror}); pick another out_dir"
        ) from None


def train(
    config: RunConfig,
    *,
    callbacks: list[Callback] | None = None,
    overwrite: bool = False,
    data: LMData | None = None,
) -> dict[str, Any]:
    """Train, select, evaluate on test, and write the run directory; returns the result.

    A finished run with the same config returns its stored result; a half-finished one
    resumes; a run directory made by another config is refused unless ``overwrite``. The
    run's name must be one safe folder name, a non-empty folder odelm did not make is
    refused, and the folder is locked while this process uses it
    (``experiments.training.runfolder``).
    """
    run_dir = config.run_dir
    runfolder.check_run_name(config.name)
    check_threads(config.trainer.num_threads)  # the machine's, before the folder is made
    if not runfolder.is_worker_process():  # rank 0 may be making the folder meanwhile
        runfolder.check_not_foreign(run_dir)
    if not overwrite and _finished(run_dir):  # read only: not even the lock is written
        check_same_config(run_dir, config)
        return json.loads((run_dir / RESULT_FILE).read_text())
    check_writable(run_dir)
    with (
        runfolder.claimed_run(run_dir, overwrite=overwrite),
        disk_full_is_one_line(run_dir),
        matmul_precision(config.trainer.matmul_precision),
    ):
        return _train_locked(config, callbacks, data)


def _finished(run_dir: Path) -> bool:
    """A finished run of odelm's: a real folder with its marker and its result (not links)."""
    marked = (run_dir / runfolder.RUN_MARKER).is_file()
    return not run_dir.is_symlink() and marked and _has_result(run_dir)


def _has_result(run_dir: Path) -> bool:
    """The run wrote its ``result.json`` (a link planted there is no result)."""
    path = run_dir / RESULT_FILE
    return path.is_file() and not path.is_symlink()


def _train_locked(
    config: RunConfig, callbacks: list[Callback] | None, data: LMData | None
) -> dict[str, Any]:
    run_dir = config.run_dir
    main = not runfolder.is_worker_process()  # global rank 0 writes the run folder's files
    if main:
        check_same_config(run_dir, config)
    result_path = run_dir / RESULT_FILE
    if _has_result(run_dir):
        return json.loads(result_path.read_text())
    devices = config.trainer.devices  # the threads policy shares the cores among the processes
    processes = devices if isinstance(devices, int) else 1
    config.trainer.num_threads = set_threads(config.trainer.num_threads, processes)
    pl.seed_everything(config.seed, workers=True, verbose=False)
    data = data or prepare_data(config)
    fit_run(config, data, [RunFiles(config, data), *(callbacks or [])])
    return json.loads(result_path.read_text()) if main else {}  # written by rank 0's RunFiles
