"""A run directory's identity and history: the config it was made with, and its full log.

A run directory is made by one config. ``config.yaml`` records it and ``result.json`` its
SHA-256 (``config_sha256``). Training again under the same name resumes only when the
config is the same; a different one is refused with the keys that differ
(``RunConfigChangedError``), unless the caller overwrites the run. A run that never
got to a checkpoint or a result (e.g. a first attempt that failed) holds nothing to keep:
its config may change freely.

The identity compared and hashed is ``experiments.training.identity``'s (re-exported here).

``HistoryCSVLogger`` keeps ``logs/metrics.csv`` across resumptions: rows logged before the
checkpoint a run resumes from stay, rows of the lost steps after it are dropped (the
resumed process logs them again).
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.data.tokenization import LMData, Tokenizer
from experiments.training.config import ConfigError, RunConfig, load_run_config
from experiments.training.identity import config_sha256, identity  # noqa: F401 (re-exported)
from odelm import files
from odelm.errors import OdelmError
from odelm.hub import set_special_tokens
from odelm.lightning import pl

CONFIG_FILE = "config.yaml"
MODEL_DIR = "model"
RESULT_FILE = "result.json"


class RunConfigChangedError(OdelmError, ValueError):
    """A run directory exists for another config."""


def config_changes(run_dir: Path, config: RunConfig) -> list[str]:
    """Keys whose values differ from the config ``run_dir`` was made with ([] if none, new,
    or with no checkpoint and no result yet)."""
    path = run_dir / CONFIG_FILE
    progress = (run_dir / "result.json", run_dir / "checkpoints" / "last.ckpt")
    if not path.is_file() or not any(p.is_file() for p in progress):
        return []
    try:
        old = identity(load_run_config(path))
    except ConfigError as error:
        return [f"(the run's {CONFIG_FILE} is no longer valid: {error})"]
    new = identity(config)
    return [
        f"{key}: {old.get(key, '(unset)')!r} -> {new.get(key, '(unset)')!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def check_same_config(run_dir: Path, config: RunConfig) -> None:
    """Refuse to resume or reuse a run made with another config."""
    changes = config_changes(run_dir, config)
    if changes:
        raise RunConfigChangedError(
            f"run {run_dir} was made with another config ({'; '.join(changes)}); give the run a "
            "new name, or pass --overwrite to discard it and train afresh"
        )


def write_json(path: Path, values: dict[str, Any]) -> None:
    """Write JSON atomically (``odelm.files.write_text``: a link there is replaced)."""
    files.write_text(path, json.dumps(values, indent=2))


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


def split_checksums(data: LMData) -> dict[str, str]:
    """SHA-256 of each split's token ids (int64) under the run's tokenizer."""
    return {
        name: hashlib.sha256(split.ids.to(torch.int64).numpy().tobytes()).hexdigest()
        for name, split in sorted(data.splits.items())
    }


def save_run_model(model: nn.Module, run_dir: Path, tokenizer: Tokenizer) -> list[str]:
    """Write the run's final model to ``RUN/model``, tagged with its tokenizer's fingerprint,
    and the tokenizer's Hugging Face files (``tokenizer.json``, ``tokenizer_config.json``) in
    ``RUN`` and ``RUN/model``: ``AutoTokenizer.from_pretrained(RUN)``, and
    ``pipeline("text-generation", model=RUN/model)`` finds its tokenizer. Returns the names
    written in ``RUN``."""
    from experiments.data.hf_tokenizer import HF_TOKENIZER_FILES, save_hf_tokenizer

    files.make_dir(run_dir / MODEL_DIR, root=run_dir)
    eos = tokenizer.eos_id  # BOS of every prompt, end of every line, padding
    set_special_tokens(model, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(  # type: ignore[operator]
        run_dir / MODEL_DIR, metadata={"tokenizer": tokenizer.fingerprint()}
    )
    limit = getattr(model, "max_positions", None)
    for folder in (run_dir, run_dir / MODEL_DIR):  # RUN/model alone is a Hugging Face folder too
        save_hf_tokenizer(tokenizer, folder, limit if isinstance(limit, int) else None, run_dir)
    return [MODEL_DIR, *HF_TOKENIZER_FILES]
