"""The thread policy of every training process (``odelm train``, ``compare``, ``eval``, ``bench``).

torch's default, a thread per physical core, oversubscribes a machine that other work is
using: on a busy 2-core machine two threads per process trained 25x slower than one. The
default here is the physical cores this process may run on that other work is not keeping
busy (the 1-minute load average), divided among the runs it starts at once: at least one
thread per run, never more than the cores it may use, and no more than an
``OMP_NUM_THREADS`` set in the environment. ``--num-threads`` (``trainer.num_threads``)
overrides it.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch

from experiments.config_errors import ConfigError

CPU_SYSFS = Path("/sys/devices/system/cpu")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> set[int]:
    """The logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def available_cores() -> int:
    """Physical cores among ``usable_cpus`` (hyperthreads share one), capped by a
    cgroup CPU quota when one is set; the logical count where the topology is unreadable."""
    cpus = usable_cpus()
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topology = CPU_SYSFS / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            cores.add((package, (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    count = len(cores) or len(cpus)
    quota = _cgroup_quota()
    return max(1, min(count, quota)) if quota else count


def _cgroup_quota() -> int | None:
    """CPUs' worth of a cgroup v2 ``cpu.max`` quota ("max 100000": none)."""
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        return math.ceil(int(quota) / int(period))
    except (OSError, ValueError):
        return None


def busy_cores(cores: int) -> float:
    """How many of ``cores`` other work keeps busy: the 1-minute load average, scaled to
    the share of the machine's CPUs this process may use."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0
    return load * cores / (os.cpu_count() or cores)


def default_threads(runs: int = 1) -> int:
    """Threads per run for ``runs`` runs at once: the free cores divided among them."""
    cores = available_cores()
    free = max(1, round(cores - busy_cores(cores)))
    threads = max(1, free // max(1, runs))
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        threads = min(threads, int(omp))
    return min(threads, cores)


def set_threads(requested: int | None, runs: int = 1) -> int:
    """Set torch's CPU threads to ``requested`` (``--num-threads``), else to
    ``default_threads`` and say so on stderr (stdout stays the command's output)."""
    if requested:
        torch.set_num_threads(requested)
        return requested
    threads = default_threads(runs)
    torch.set_num_threads(threads)
    print(
        f"threads: {threads} (of {available_cores()} cores; --num-threads to change)",
        file=sys.stderr,
        flush=True,
    )
    return threads


MAX_THREADS = os.cpu_count() or 1
"""The most CPU threads a process may ask for: this machine's logical CPUs (torch starts a
thread pool of the size asked; a hundred thousand threads fail far from the cause)."""


def check_threads(value: int | None, label: str = "trainer.num_threads") -> None:
    """Raise ``ConfigError`` naming ``label`` unless ``value`` is None (the thread policy's
    choice) or a thread count within 1..``MAX_THREADS``. Checked where threads are set,
    not when a config is read: a run trained on a larger machine still loads."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        unset = " or null" if label.startswith("trainer.") else ""
        raise ConfigError(
            f"{label} = {value!r} is out of range; it must be in [1, {MAX_THREADS}]{unset} "
            f"({MAX_THREADS} is this machine's CPU count)"
        )
