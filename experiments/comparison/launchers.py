"""Where a grid's runs train: a local process pool, SLURM through submitit, or Ray.

Every launcher executes the same thing for a run, ``run_command``: ``odelm train`` on the
run's config file in a fresh process, its output into ``OUT/logs/RUN.log``. So a run computes
the same numbers whichever launcher starts it (at the same thread count, which its config
records), resumes the same way (``odelm train`` skips a finished run and resumes a half
finished one), and how it was launched never enters its identity (``experiments.training.runs``).

- ``local``: up to ``--jobs`` child processes at once on this machine (each dies with
  ``odelm compare``).
- ``submitit``: one job per run through ``submitit.AutoExecutor`` (SLURM where ``sbatch``
  exists, else submitit's local executor), with submitit's own parameters
  (``experiments.comparison.slurm``) from the grid's
  ``launcher: {slurm: {...}}`` section or ``--slurm.KEY`` (the command line wins).
- ``ray``: one remote task per run with ``num_cpus`` its threads; ``ray.init()`` on this
  machine (with the CPUs of ``--jobs`` runs) unless ``--ray-address`` names a cluster.

Remote launchers need the same Python environment and a shared filesystem for ``--out``.
``run_jobs`` starts the jobs, at most ``jobs`` in flight (a local GPU job once its device has
the memory: ``gpus.MemoryGate``), shows their progress (``experiments.training.progress``)
and hands each outcome to a callback as it comes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.comparison.gpus import MemoryGate, free_slot, job_env
from experiments.comparison.slurm import LauncherError, slurm_parameters, submitit_parameters
from experiments.training.threads import available_cores, busy_cores
from odelm import files

if TYPE_CHECKING:
    from experiments.training.progress import ProgressBoard

LAUNCHERS = ("local", "submitit", "ray")
LAUNCH_KEYS = ("launcher", "jobs", "ray_address", "slurm")
"""The options of ``odelm compare`` that say how runs are launched (never a run's config)."""
POLL_S = 1.0


@dataclass(frozen=True)
class Launch:
    """How a grid's runs are launched: engineering, never part of a run's identity."""

    launcher: str = "local"
    jobs: int = 1  # runs in flight at once
    slurm: dict[str, Any] = field(default_factory=dict)
    ray_address: str | None = None
    progress_every: float = 30.0  # seconds between plain status lines (no terminal)


@dataclass(frozen=True)
class Job:
    """One run to train: its ``odelm train`` command, log, progress file and threads."""

    run: str
    label: str  # e.g. "[3/7] rk4 seed 0"
    start_text: str  # printed after the label when it starts ("training", ...)
    command: list[str]
    log: Path
    progress: Path
    threads: int
    cwd: str
    gpus: int = 0  # GPUs one run trains on (experiments.comparison.gpus.run_gpus)
    memory_mb: float = 0.0  # its device memory, estimated (gpus.run_memory_mb)


def run_command(command: list[str], log: str, cwd: str) -> int:
    """Run one training command with its output in ``log``; its exit status. What every
    launcher executes (a plain function, importable wherever the job runs)."""
    files.make_dir(Path(log).parent)
    with files.open_new(log) as handle:
        return subprocess.run(
            command,
            check=False,
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(os.getpid()),
        ).returncode


def die_with_parent(parent: int) -> Any:
    """A ``preexec_fn`` that makes Linux kill the trainer when its launcher dies, however
    it dies (``PR_SET_PDEATHSIG``); elsewhere the child is left as it is. The C library is
    opened here, before the fork: the child only makes the call."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def add_launch_options(parser: Any) -> None:
    """``odelm compare``'s launch options: --jobs, --launcher, --ray-address, --slurm.KEY."""
    parser.add_argument(
        "--jobs",
        type=int,
        help="runs in flight at once (default: local: the free cores over --num-threads, one "
        "run without it; submitit, ray: every run, their scheduler queues them)",
    )
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="where runs train: local processes (default), SLURM jobs via submitit, Ray tasks",
    )
    parser.add_argument(
        "--ray-address",
        dest="ray_address",
        help="--launcher ray: the cluster to join (default: a local ray.init())",
    )
    parser.add_argument(
        "--slurm",
        type=dict[str, Any] | None,
        help="--launcher submitit: submitit's AutoExecutor parameters under its own names, "
        "e.g. --slurm.slurm_partition gpu --slurm.timeout_min 240 --slurm.mem_gb 16 "
        "(cpus_per_task defaults to the run's threads)",
    )


def default_jobs(launcher: str, threads: int | None, runs: int) -> int:
    """Runs at once by default: locally the free cores over ``threads`` (one run, given the
    free cores, when the threads are not set); every run with submitit and Ray, whose
    schedulers queue them."""
    if launcher != "local":
        return max(1, runs)
    if not threads:
        return 1
    cores = available_cores()
    free = max(1, round(cores - busy_cores(cores)))
    return max(1, min(runs, free // threads))


def launch_settings(
    options: dict[str, Any], runs: int, threads: int | None, grid_slurm: dict[str, Any]
) -> Launch:
    """The launch settings of ``odelm compare`` from its ``LAUNCH_KEYS`` options and
    the grid's SLURM options (``--slurm.KEY`` wins)."""
    launcher = options.get("launcher") or "local"
    jobs, address = options.get("jobs"), options.get("ray_address")
    slurm = options.get("slurm") or {}
    if jobs is not None and jobs < 1:
        raise LauncherError(f"--jobs must be at least 1, got {jobs}")
    if address and launcher != "ray":
        raise LauncherError("--ray-address needs --launcher ray")
    if slurm and launcher != "submitit":
        raise LauncherError(f"--slurm.{next(iter(slurm))} needs --launcher submitit")
    jobs, slurm = jobs or default_jobs(launcher, threads, runs), {**grid_slurm, **slurm}
    if launcher == "submitit":
        slurm_parameters(slurm, threads or 1)  # a bad option is one line, before any run
    return Launch(launcher, jobs, slurm, address)


class LocalLauncher:
    """Child processes on this machine."""

    def __init__(self) -> None:
        self.children: list[tuple[subprocess.Popen, Any, int]] = []

    def start(self, job: Job) -> Any:
        """Start ``job`` in the lowest free slot, with its own GPUs when several are visible."""
        files.make_dir(job.log.parent)  # a link there, or at the log, is not followed
        handle = files.open_new(job.log)
        slot = free_slot({slot for child, _, slot in self.children if child.poll() is None})
        child = subprocess.Popen(
            job.command,
            cwd=job.cwd,
            env=job_env(job.gpus, slot),
            stdout=handle,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 (no threads start children)
        )
        self.children.append((child, handle, slot))
        return child

    def outcome(self, child: subprocess.Popen) -> tuple[int, str] | None:
        status = child.poll()
        return None if status is None else (status, f"exit {status}")

    def close(self) -> None:
        for child, handle, _ in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()
            handle.close()


class SubmititLauncher:
    """One submitit job per run (SLURM, or submitit's local executor without SLURM)."""

    def __init__(self, folder: Path, slurm: dict[str, Any], cluster: str | None = None) -> None:
        submitit_parameters()  # installed, or one line saying how
        import submitit

        self.executor = submitit.AutoExecutor(folder=folder / "%j", cluster=cluster)
        self.slurm = slurm
        self.jobs: list[Any] = []

    def start(self, job: Job) -> Any:
        parameters = slurm_parameters(self.slurm, job.threads, job.gpus)
        self.executor.update_parameters(name=f"odelm-{job.run}", **parameters)
        submitted = self.executor.submit(run_command, job.command, str(job.log), job.cwd)
        self.jobs.append(submitted)
        return submitted

    def outcome(self, submitted: Any) -> tuple[int, str] | None:
        if not submitted.done():
            return None
        error = submitted.exception()
        if error is not None:
            first = str(error).strip().splitlines()[-1:] or [type(error).__name__]
            return (
                -1,
                f"submitit job {submitted.job_id} failed: {first[0]} ({submitted.paths.stderr})",
            )
        status = submitted.result()
        return status, f"exit {status} (submitit job {submitted.job_id})"

    def close(self) -> None:
        for submitted in self.jobs:
            if not submitted.done():
                submitted.cancel(check=False)


class RayLauncher:
    """One Ray task per run, ``num_cpus`` its threads (and ``num_gpus`` its GPUs)."""

    def __init__(self, address: str | None, cpus: int) -> None:
        try:
            import ray
        except ImportError:
            raise LauncherError(
                "--launcher ray needs Ray: pip install ray (or pip install 'odelm[launchers]')"
            ) from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            local = {} if address else {"num_cpus": cpus}
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **local,
            )
        self.task = ray.remote(run_command)
        self.refs: list[Any] = []

    def start(self, job: Job) -> Any:
        gpus = {"num_gpus": job.gpus} if job.gpus else {}
        task = self.task.options(num_cpus=job.threads, **gpus)
        ref = task.remote(job.command, str(job.log), job.cwd)
        self.refs.append(ref)
        return ref

    def outcome(self, ref: Any) -> tuple[int, str] | None:
        done, _ = self.ray.wait([ref], timeout=0)
        if not done:
            return None
        try:
            status = self.ray.get(ref)
        except self.ray.exceptions.RayError as error:  # a lost worker or node: the others go on
            return -1, f"Ray task failed: {str(error).strip().splitlines()[0]}"
        return status, f"exit {status} (Ray task)"

    def close(self) -> None:
        for ref in self.refs:
            if not self.ray.wait([ref], timeout=0)[0]:
                self.ray.cancel(ref, force=True)
        if self.started:
            self.ray.shutdown()


def make_launcher(launch: Launch, folder: Path, threads: int) -> Any:
    """The launcher ``launch`` names (``folder``: where submitit keeps its job files)."""
    if launch.launcher == "local":
        return LocalLauncher()
    if launch.launcher == "submitit":
        slurm_parameters(launch.slurm, threads)  # a bad option is one line, before any job
        return SubmititLauncher(folder, launch.slurm)
    if launch.launcher == "ray":
        return RayLauncher(launch.ray_address, launch.jobs * threads)
    raise LauncherError(f"unknown launcher {launch.launcher!r}; valid: {', '.join(LAUNCHERS)}")


def run_jobs(
    jobs: list[Job],
    launch: Launch,
    folder: Path,
    on_done: Callable[[Job, int, str, float], None],
    board: ProgressBoard | None = None,
) -> None:
    """Train ``jobs`` with the launcher of ``launch``, at most ``launch.jobs`` at once, showing
    each in-flight run's progress; ``on_done(job, status, detail, seconds)`` as each ends
    (status 0: it finished). Jobs still in flight when this is interrupted are cancelled."""
    from experiments.training.progress import ProgressBoard, read_progress, status_line

    if not jobs:
        return
    board = board or ProgressBoard(every=launch.progress_every)
    launcher = make_launcher(launch, folder, max(job.threads for job in jobs))
    pending, running, gate = list(jobs), {}, MemoryGate(launch.launcher, jobs)
    try:
        while pending or running:
            while pending and len(running) < launch.jobs and gate.ready(pending[0], running):
                job = pending.pop(0)
                board.event(f"{job.label}: {job.start_text}")
                running[job.run] = (job, launcher.start(job), time.time())
            for key, (job, handle, started) in list(running.items()):
                outcome = launcher.outcome(handle)
                if outcome is not None:
                    del running[key]
                    board.close()
                    on_done(job, *outcome, time.time() - started)
            lines = []
            for job, _, started in running.values():
                progress = read_progress(job.progress)
                fresh = progress if progress and progress.get("updated", 0) >= started else None
                lines.append(status_line(job.label, fresh))
            board.update(lines)
            if running:
                time.sleep(POLL_S)
    finally:
        board.close()
        launcher.close()
