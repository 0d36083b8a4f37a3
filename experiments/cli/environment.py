"""The environment variables odelm and its launchers read, checked before any work starts:
each invalid one is named in one line (``EnvironmentVariableError``) instead of a traceback,
a misleading line or a minute of retries later on."""

from __future__ import annotations

import os
from collections.abc import Mapping

from experiments.data.corpora import env_data_dir
from experiments.training.runfolder import process_rank
from odelm.errors import OdelmError

COUNTS = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")
"""Launcher variables that must be non-negative integers (the ranks: ``RANK_VARIABLES``)."""
LEFTOVER = ("RANK", "LOCAL_RANK", "NODE_RANK")
"""Ranks that make a process a worker of a distributed run, whoever set them."""
LAUNCHER_MARKS = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")
"""What torchrun, Lightning's ``ddp`` launcher and ``srun`` set beside the ranks."""
SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
"""Hugging Face's on/off variables."""
SWITCH_VALUES = ("1", "0", "true", "false", "yes", "no", "on", "off")


class EnvironmentVariableError(OdelmError, ValueError):
    """An environment variable odelm or its launchers read holds an invalid value."""


def check_environment(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, in one line naming the variable, a rank or count that is not an integer, ranks
    left over from another job (set without a launcher), a Hugging Face switch that is not
    on or off, and an ``ODELM_DATA_DIR`` that is not a readable folder."""
    process_rank()  # RANK, SLURM_PROCID, LOCAL_RANK, NODE_RANK: integers
    for key in COUNTS:
        value = environ.get(key, "").strip()
        if value and not value.isdigit():
            raise EnvironmentVariableError(
                f"environment variable {key}={value[:40]!r} is not a whole number; unset it, or "
                "let the launcher (torchrun, srun, Lightning) set it"
            )
    given = [f"{key}={environ[key].strip()}" for key in LEFTOVER if _number(environ, key) > 0]
    if _number(environ, "WORLD_SIZE") > 1:
        given.append(f"WORLD_SIZE={environ['WORLD_SIZE'].strip()}")
    if given and not any(environ.get(key) for key in LAUNCHER_MARKS):
        raise EnvironmentVariableError(
            f"environment variables {', '.join(given)} are set but no launcher started this "
            "process (no MASTER_PORT); unset them (left over from another job?), or start "
            "odelm with torchrun, srun, or trainer.devices for Lightning to launch"
        )
    for key in SWITCHES:
        value = environ.get(key, "").strip()
        if value and value.lower() not in SWITCH_VALUES:
            raise EnvironmentVariableError(
                f"environment variable {key}={value[:40]!r} is neither on nor off; set it to 1 "
                f"to stay offline or 0 (one of {', '.join(SWITCH_VALUES)}), or unset it"
            )
    env_data_dir()  # ODELM_DATA_DIR: a readable folder


def _number(environ: Mapping[str, str], key: str) -> int:
    value = environ.get(key, "").strip()
    return int(value) if value.isdigit() else 0


def check_encodable(text: str, label: str, stream_encoding: str | None) -> None:
    """Refuse ``text`` (echoed to the output) that the output's encoding cannot show."""
    try:
        text.encode(stream_encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        raise EnvironmentVariableError(
            f"{label} holds characters the output's encoding {stream_encoding} cannot show "
            "(PYTHONIOENCODING or the locale); set PYTHONIOENCODING=utf-8"
        ) from None
