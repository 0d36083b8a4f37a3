"""Side-by-side comparison: one data split, tokenizer, seed and budget for every model.

A grid file has ``shared`` (a partial run config: data, seed, optim, trainer) and ``runs``
(each a ``name``, a ``model`` section and optionally a ``recipe`` and ``optim`` overrides), and optionally
``seeds`` (a list: every model trains once per seed) and ``baseline`` (the run the others
are compared with; default the first). Runs may not override the data, the seed or the
budget (a recipe sets only the optimiser and whether recurrent state is carried across
windows), so every model sees the same tokens for the same number of steps or seconds. Each
run trains in its own process (so peak memory is its own) through ``odelm train``, started
by a launcher (``experiments.comparison.launchers``: a local process pool, submitit or Ray; the grid's
optional ``launcher: {slurm: {...}}`` section holds SLURM options); finished runs are
skipped and half-finished ones resume.

``results.csv`` holds one row per run (model x seed); ``results.md`` aggregates over seeds
(mean +- sample standard deviation, n) and gives each model's seed-paired difference to
the baseline with a 95% Student-t interval, its p-value and Holm's adjustment over the
grid (``experiments.comparison.stats``). ``seed_noise: OFFSET`` (or ``true``: 1000) adds
the row ``seed-noise``, the baseline's config at seeds ``S + OFFSET`` paired with the
baseline's seed ``S``: the A/A spread every difference is read against. ``tune:`` gives
every run the same tuning trials first (``experiments.comparison.tuning``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from experiments.comparison.compute import write_compute
from experiments.comparison.gpus import run_gpus, run_memory_mb
from experiments.comparison.launchers import Job, Launch, run_jobs
from experiments.comparison.tables import SEED_NOISE, runs_have_fixed_budget, write_tables
from experiments.comparison.tuning import Recorder, apply_choices, run_tuning, tune_spec
from experiments.training.config import ConfigError, load_yaml, merge, parse_config
from experiments.training.progress import PROGRESS_FILE, duration
from experiments.training.runfolder import (
    COMPARISON_MARKER,
    FolderWriteError,
    check_not_foreign,
    check_run_name,
    claim_folder,
)
from experiments.training.runs import RESULT_FILE, config_changes
from odelm import files
from odelm.errors import OdelmError

GRIDS_DIR = Path(__file__).parents[1] / "configs" / "grids"
GRID_KEYS = {"shared", "runs", "seeds", "baseline", "launcher", "tune", "seed_noise"}
SEED_NOISE_OFFSET = 1000
RUN_KEYS = {"name", "model", "optim", "recipe"}


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a grid: a model at one seed, with its full config."""

    name: str  # the grid's model name
    seed: int
    run: str  # the run directory's name: ``name``, or ``name-seedS`` with several seeds
    values: dict[str, Any]
    pair: int | None = None  # seed-noise runs: the baseline seed they are paired with


class GridRunError(OdelmError, RuntimeError):
    """Some runs of a grid failed (the others finished and are kept)."""


def grid_path(preset: str) -> Path:
    path = GRIDS_DIR / f"{preset}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in GRIDS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown grid preset {preset!r}; valid: {', '.join(names)}")
    return path


def grid_seeds(
    grid: dict[str, Any], shared_override: dict[str, Any], num_seeds: int | None = None
) -> list[int]:
    """The seeds every model trains with.

    ``num_seeds`` N (``--seeds N``) gives S, S+1, ..., S+N-1 where S is the overriding
    ``seed`` (``--seed``), else the grid's first ``seeds`` entry, else ``shared.seed`` (0).
    Without it: the overriding seed alone, else the grid's ``seeds`` list, else
    ``shared.seed``.
    """
    listed = grid.get("seeds")
    if listed is not None and (
        not isinstance(listed, list)
        or not listed
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in listed)
        or len(set(listed)) != len(listed)
    ):
        raise ConfigError(f"grid key seeds must be a list of distinct integers, got {listed!r}")
    shared_seed = grid.get("shared", {}).get("seed", 0)
    if "seed" in shared_override:
        base = shared_override["seed"]
    else:
        base = listed[0] if listed else shared_seed
    if num_seeds is not None:
        if num_seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {num_seeds}")
        return list(range(base, base + num_seeds))
    if "seed" in shared_override or not listed:
        return [base]
    return list(listed)


def expand_grid(
    grid: dict[str, Any],
    out_dir: Path,
    shared_override: dict[str, Any],
    num_seeds: int | None = None,
) -> list[PlannedRun]:
    """One full, checked run config per model and seed, with shared settings enforced;
    ordered seed by seed (every model at the first seed, then at the second, ...)."""
    unknown = sorted(set(grid) - GRID_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown grid key {unknown[0]}; a grid has {', '.join(sorted(GRID_KEYS))}"
        )
    seeds = grid_seeds(grid, shared_override, num_seeds)
    shared = merge(grid.get("shared", {}), shared_override)
    runs = grid.get("runs") or []
    if not runs:
        raise ConfigError("the grid has no runs")
    planned, names = [], []
    for index, run in enumerate(runs):
        extra = sorted(set(run) - RUN_KEYS)
        if extra:
            raise ConfigError(
                f"runs[{index}] sets {extra[0]}; a run may set only {', '.join(sorted(RUN_KEYS))} "
                "(data, seed and budget are shared so the comparison is fair)"
            )
        if run.get("name") in names or "name" not in run:
            raise ConfigError(f"runs[{index}] needs a unique name, got {run.get('name')!r}")
        names.append(run["name"])
        check_run_name(run["name"], f"runs[{index}] name")
        for seed in seeds:
            run_name = run["name"] if len(seeds) == 1 else f"{run['name']}-seed{seed}"
            check_run_name(run_name, f"runs[{index}] name")
            values = merge(
                shared, {**run, "name": run_name, "seed": seed, "out_dir": str(out_dir / "runs")}
            )
            parse_config(values, where=f"runs[{index}] ({run['name']})")
            planned.append(PlannedRun(run["name"], seed, run_name, values))
    baseline = grid.get("baseline", names[0])
    if baseline not in names:
        raise ConfigError(f"grid baseline {baseline!r} is not a run; runs: {', '.join(names)}")
    planned += _seed_noise_runs(grid, planned, baseline, out_dir)
    # Seed by seed: a grid stopped early has every model at its first seeds.
    return sorted(
        planned, key=lambda plan: seeds.index(plan.seed if plan.pair is None else plan.pair)
    )


def _seed_noise_runs(
    grid: dict[str, Any], planned: list[PlannedRun], baseline: str, out_dir: Path
) -> list[PlannedRun]:
    """The seed-noise row: the baseline's runs again at seeds shifted by the offset."""
    offset = grid.get("seed_noise")
    if offset is None or offset is False:
        return []
    if offset is True:
        offset = SEED_NOISE_OFFSET
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
        raise ConfigError(f"grid key seed_noise must be true or a seed offset >= 1, got {offset!r}")
    if SEED_NOISE in {plan.name for plan in planned}:
        raise ConfigError(f"a run named {SEED_NOISE} clashes with the seed-noise row")
    noise = []
    for plan in planned:
        if plan.name == baseline:
            seed = plan.seed + offset
            run = f"{SEED_NOISE}-seed{seed}"
            values = {**plan.values, "name": run, "seed": seed}
            noise.append(PlannedRun(SEED_NOISE, seed, run, values, pair=plan.seed))
    return noise


def grid_baseline(grid: dict[str, Any]) -> str:
    """The model every other model is compared with (``baseline:``, default the first)."""
    return grid.get("baseline") or grid["runs"][0]["name"]


def result_seeds(planned: list[PlannedRun]) -> list[int]:
    """The seeds the grid's results are read at (its seed-noise row's seeds left out)."""
    return sorted({plan.seed for plan in planned if plan.name != SEED_NOISE})


def check_grid(
    grid: dict[str, Any],
    out_dir: Path,
    shared_override: dict[str, Any],
    num_seeds: int | None = None,
) -> list[PlannedRun]:
    """The grid's planned runs, once the grid and every folder it would write are checked
    (nothing is written: a bad grid or a folder odelm did not make is one error)."""
    planned = expand_grid(grid, out_dir, shared_override, num_seeds)
    grid_slurm(grid)
    tune_spec(grid, result_seeds(planned))
    if out_dir.exists() and not out_dir.is_dir():
        raise FolderWriteError(
            f"cannot make comparison folder {out_dir} (File exists); choose another folder"
        )
    check_not_foreign(out_dir, COMPARISON_MARKER)
    for plan in planned:
        check_not_foreign(out_dir / "runs" / plan.run)
    return planned


def run_grid(
    grid_file: str | Path,
    out_dir: str | Path,
    shared_override: dict[str, Any] | None = None,
    num_seeds: int | None = None,
    launch: Launch | None = None,
) -> list[dict[str, Any]]:
    """Train every run of the grid (resuming) with ``launch``'s launcher (default: one run
    at a time on this machine), then write the tables and plots.

    Returns one result per run (model x seed), each with ``name`` (the model), ``seed``
    and ``run`` (its directory under ``out_dir/runs``).
    """
    started = time.perf_counter()
    out_dir, launch = Path(out_dir), launch or Launch()
    grid = load_yaml(grid_file)
    planned = check_grid(grid, out_dir, shared_override or {}, num_seeds)
    launch = replace(launch, slurm={**grid_slurm(grid), **launch.slurm})
    claim_folder(out_dir, COMPARISON_MARKER, "comparison", named=True)
    files.make_dir(out_dir / "configs")
    failed: list[str] = []
    counts = {"trained": 0, "kept": 0}

    def train(plans: list[PlannedRun], record: Recorder | None = None) -> dict[str, dict[str, Any]]:
        finished, jobs = _train_runs(plans, out_dir, launch, failed, record)
        counts["trained"] += jobs
        counts["kept"] += len(plans) - jobs
        return finished

    spec = tune_spec(grid, result_seeds(planned))
    if spec is not None:
        arms = {
            p.name: p.values for p in planned if p.name != SEED_NOISE and p.seed == planned[0].seed
        }

        def train_trials(
            todo: list[tuple[str, dict[str, Any], str]], record: Recorder
        ) -> dict[str, dict[str, Any]]:
            plans = [PlannedRun(label, spec.seed, name, values) for name, values, label in todo]
            return train(plans, record)

        spec, choices, _ = run_tuning(spec, arms, out_dir, train_trials)
        planned = apply_choices(planned, spec, choices, grid_baseline(grid))
        chosen = ", ".join(f"{arm} {value:g}" for arm, (value, _) in choices.items())
        print(f"[tune] chosen {spec.key}: {chosen}", flush=True)
    finished = train(planned)
    results = [
        {**finished[plan.run], "name": plan.name, "seed": plan.seed, "run": plan.run}
        | ({"pair": plan.pair} if plan.pair is not None else {})
        for plan in planned
        if plan.run in finished
    ]
    if results:
        fixed = runs_have_fixed_budget([plan.values for plan in planned])
        write_tables(results, out_dir, grid_baseline(grid), fixed)
        from experiments.comparison.plots import plot_comparison

        plot_comparison(out_dir, results)
        write_compute(out_dir, results, grid_baseline(grid))
    total = counts["trained"] + counts["kept"]
    print(
        f"[compare] {counts['trained'] - len(failed)} trained, {counts['kept']} kept, "
        f"{len(failed)} failed of {total} runs in {duration(time.perf_counter() - started)} "
        f"wall ({launch.launcher}, up to {launch.jobs} at once)",
        flush=True,
    )
    if failed:
        logs = ", ".join(f"{name} (log: {out_dir / 'logs' / (name + '.log')})" for name in failed)
        raise GridRunError(f"{len(failed)} of {total} runs failed: {logs}; the other runs are kept")
    return results


def _train_runs(
    planned: list[PlannedRun],
    out_dir: Path,
    launch: Launch,
    failed: list[str],
    record: Recorder | None = None,
) -> tuple[dict[str, dict[str, Any]], int]:
    """Train the runs not yet finished (failed ones are appended to ``failed``; ``record``
    hears of each result as it comes); the finished results by run name and how many jobs
    were started."""
    finished: dict[str, dict[str, Any]] = {}
    record = record or (lambda run, result: None)
    jobs = []
    for index, plan in enumerate(planned, start=1):
        label = f"[{index}/{len(planned)}] {plan.name} seed {plan.seed}"
        job = _prepare_run(plan, out_dir, label)
        if isinstance(job, Job):
            jobs.append(job)
        else:
            finished[plan.run] = job
            record(plan.run, job)

    def done(job: Job, status: int, detail: str, seconds: float) -> None:
        result_file = out_dir / "runs" / job.run / RESULT_FILE
        if status != 0 or not result_file.is_file():
            failed.append(job.run)
            print(f"{job.label}: FAILED ({detail}); see {job.log}{_log_tail(job.log)}", flush=True)
            return
        finished[job.run] = json.loads(result_file.read_text())
        record(job.run, finished[job.run])
        print(
            f"{job.label}: trained and tested in {seconds:.0f} s, "
            f"test ppl {finished[job.run].get('test_ppl', math.nan):.2f}",
            flush=True,
        )

    run_jobs(jobs, launch, out_dir / "submitit", done)
    return finished, len(jobs)


def grid_slurm(grid: dict[str, Any]) -> dict[str, Any]:
    """The SLURM options of the grid's ``launcher:`` section (how runs are launched, never
    what they compute: no run's config sees them)."""
    section = grid.get("launcher") or {}
    if not isinstance(section, dict) or set(section) - {"slurm"}:
        raise ConfigError(
            "the grid's launcher section takes only slurm: {submitit's parameters, e.g. "
            "slurm_partition, timeout_min, cpus_per_task, gpus_per_node, mem_gb}"
        )
    slurm = section.get("slurm") or {}
    if not isinstance(slurm, dict):
        raise ConfigError(
            "the grid's launcher.slurm must be a mapping, e.g. {slurm_partition: gpu}"
        )
    return slurm


def _prepare_run(plan: PlannedRun, out_dir: Path, label: str) -> Job | dict[str, Any]:
    """Write the run's config file; its stored result if it finished under the same config,
    else the job that trains it (re-trained with ``--overwrite`` if its config changed)."""
    name = plan.run
    path = out_dir / "configs" / f"{name}.yaml"
    files.write_text(path, yaml.safe_dump(plan.values, sort_keys=False), root=out_dir)
    run_dir = out_dir / "runs" / name
    files.check_inside(run_dir, out_dir, follow_last=True)  # never a link out of the comparison
    config = parse_config(plan.values)
    changes = config_changes(run_dir, config)
    command = [sys.executable, "-m", "experiments", "train", "--config", str(path), "--quiet"]
    start_text = "training"
    if changes:
        start_text = f"config changed ({'; '.join(changes)}), re-training"
        command.append("--overwrite")
    elif (run_dir / RESULT_FILE).is_file():
        print(f"{label}: skipped (finished)", flush=True)
        return json.loads((run_dir / RESULT_FILE).read_text())
    gpus = run_gpus(config.trainer.accelerator, config.trainer.devices)
    return Job(
        run=name,
        label=label,
        start_text=start_text,
        command=command,
        log=out_dir / "logs" / f"{name}.log",
        progress=run_dir / PROGRESS_FILE,
        threads=config.trainer.num_threads or 1,
        cwd=os.getcwd(),
        gpus=gpus,
        memory_mb=run_memory_mb(config.model, config.data.batch_size, config.data.bptt)
        if gpus
        else 0.0,
    )


def _log_tail(log: Path, lines: int = 5) -> str:
    """The last lines of a failed run's log, indented under its FAILED line."""
    try:
        tail = log.read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n    | {line}" for line in tail)
