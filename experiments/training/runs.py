"""A run directory's identity and history: the config it was made with, and its full log.

A run directory is made by one config. ``config.yaml`` records it and ``result.json`` its
SHA-256 (``config_sha256``). Training again under the same name resumes only when the
config is the same; a different one is refused with the keys that differ
(``RunConfigChangedError``), unless the caller overwrites the run. A run that never
got to a checkpoint or a result (e.g. a first attempt that failed) holds nothing to keep:
its config may change freely.

The identity compared and hashed is ``experiments.training.identity``'s (re-exported here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.training.config import ConfigError, RunConfig, load_run_config
from experiments.training.identity import config_sha256, identity  # noqa: F401 (re-exported)
from odelm import files
from odelm.errors import OdelmError

CONFIG_FILE = "config.yaml"
MODEL_DIR = "model"
RESULT_FILE = "result.json"


def result_depth(result: Mapping[str, Any]) -> Any:
    """A result's depth kind (``baseline``, ``discrete depth``, ``continuous depth``, ...),
    from a ``result.json`` or a ``results.csv`` row: its ``depth``, or ``family``, the key
    results written before the rename used (the model's package is ``model.family``)."""
    return result.get("depth", result.get("family"))


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
