"""The SLURM options of ``odelm compare --launcher submitit``: submitit's own parameters,
under submitit's own names, passed through to ``AutoExecutor.update_parameters``.

A grid's ``launcher: {slurm: {...}}`` section and ``--slurm.KEY`` take any parameter
``submitit.AutoExecutor`` takes: its shared ones (``timeout_min``, ``mem_gb``,
``cpus_per_task``, ``gpus_per_node``, ``tasks_per_node``, ``nodes``, ``stderr_to_stdout``)
and an executor's own, prefixed by its name (``slurm_partition``, ``slurm_qos``,
``slurm_account``, ...). Each is checked before any run starts, one line per error:
an unknown name, a value of the wrong type, or one of the launcher's former names
(``RENAMED``), which names its submitit spelling. ``timeout_min`` also takes ``H:MM:SS``.
"""

from __future__ import annotations

import re
from typing import Any

from odelm.errors import OdelmError

RENAMED = {
    "partition": "slurm_partition",
    "time": "timeout_min",
    "cpus": "cpus_per_task",
    "gpus": "gpus_per_node",
    "mem": "mem_gb",
}
"""The launcher's former option names and submitit's, which replace them."""
RESERVED = {"name": "odelm names each job odelm-RUN"}
"""submitit parameters odelm sets itself."""


class LauncherError(OdelmError, RuntimeError):
    """A launcher cannot start: not installed, or given options it does not know."""


def submitit_parameters() -> tuple[dict[str, type], dict[str, set[str]]]:
    """submitit's shared parameters with their types, and each executor's own names
    (what ``AutoExecutor.update_parameters`` checks)."""
    try:
        import submitit  # noqa: F401  (the package first: a stub of it in sys.modules fails)
        from submitit.auto.auto import AutoExecutor
        from submitit.core import plugins
    except ImportError:
        raise LauncherError(
            "--launcher submitit needs submitit: pip install submitit "
            "(or pip install 'odelm[launchers]')"
        ) from None
    executors = {name: set(ex._valid_parameters()) for name, ex in plugins.get_executors().items()}
    return dict(AutoExecutor._typed_parameters()), executors


def time_minutes(value: Any) -> int:
    """A SLURM time limit in minutes: an integer, or ``[D-]HH:MM[:SS]``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    match = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{2})(?::(\d{2}))?", str(value))
    if not match:
        raise LauncherError(
            f"slurm timeout_min must be minutes or H:MM:SS (e.g. 240 or 4:00:00), got {value!r}"
        )
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return max(1, days * 1440 + hours * 60 + minutes + (seconds > 0))


def _checked(key: str, value: Any, shared: dict[str, type], executors: dict[str, set[str]]) -> Any:
    """``value`` as submitit takes it, or one line on what is wrong with ``key``."""
    where = "(--slurm.KEY, or the grid's launcher: {slurm: {KEY: ...}})"
    if key in RENAMED:
        raise LauncherError(
            f"slurm option {key!r} is submitit's {RENAMED[key]!r} now: write "
            f"--slurm.{RENAMED[key]} (or {RENAMED[key]} in the grid's launcher: {{slurm: ...}})"
        )
    if key in RESERVED:
        raise LauncherError(f"slurm option {key!r} is not yours to set: {RESERVED[key]}")
    if key == "timeout_min":
        return time_minutes(value)
    kind = shared.get(key)
    if kind is None:
        executor, _, own = key.partition("_")
        if own in executors.get(executor, ()) or (executor in executors and own in shared):
            return value
        raise LauncherError(
            f"unknown slurm option {key!r}: submitit takes {', '.join(sorted(set(shared) - set(RESERVED)))} "
            f"or an executor's own option prefixed by its name ({', '.join(sorted(executors))}: "
            f"e.g. slurm_partition, slurm_qos) {where}"
        )
    if kind is bool:
        if not isinstance(value, bool):
            raise LauncherError(f"slurm {key} must be true or false, got {value!r}")
        return value
    number = (int, float) if kind is float else int
    if isinstance(value, bool) or not isinstance(value, number) or value < 0:
        what = "a number" if kind is float else "a whole number"
        raise LauncherError(f"slurm {key} must be {what} >= 0, got {value!r}")
    return value


def slurm_parameters(slurm: dict[str, Any], threads: int, gpus: int = 0) -> dict[str, Any]:
    """``AutoExecutor.update_parameters`` keywords: the grid's and the command line's SLURM
    options, checked, over odelm's defaults (``cpus_per_task`` the run's ``threads``; a run
    on ``gpus`` GPUs gets them, and on several one task per GPU: Lightning's SLURM DDP)."""
    shared, executors = submitit_parameters()
    given = {key: _checked(key, value, shared, executors) for key, value in slurm.items()}
    parameters: dict[str, Any] = {"cpus_per_task": threads}
    if gpus:
        parameters["gpus_per_node"] = gpus
    if gpus > 1:
        parameters["tasks_per_node"] = gpus
    return {**parameters, **given}
