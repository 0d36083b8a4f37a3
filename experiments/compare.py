"""Side-by-side comparison: one data split, tokenizer, seed and budget for every model.

A grid file has ``shared`` (a partial run config: data, seed, optim, trainer) and ``runs``
(each a ``name``, a ``model`` section and optionally a ``recipe`` and ``optim`` overrides), and optionally
``seeds`` (a list: every model trains once per seed) and ``baseline`` (the run the others
are compared with; default the first). Runs may not override the data, the seed or the
budget (a recipe sets only the optimiser and whether recurrent state is carried across
windows), so every model sees the same tokens for the same number of steps or seconds. Each
run trains in its own process (so peak memory is its own) through ``odelm train``;
finished runs are skipped and half-finished ones resume.

``results.csv`` holds one row per run (model x seed); ``results.md`` aggregates over seeds
(mean +- sample standard deviation, n) and gives each model's seed-paired difference to
the baseline with a 95% Student-t interval (``experiments.stats``).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from experiments.config import ConfigError, load_yaml, merge, parse_config
from experiments.runfolder import (
    COMPARISON_MARKER,
    FolderWriteError,
    check_not_foreign,
    check_run_name,
    claim_folder,
)
from experiments.runs import config_changes
from experiments.tables import write_tables
from experiments.train import RESULT_FILE
from odelm.errors import OdelmError

GRIDS_DIR = Path(__file__).parent / "configs" / "grids"
GRID_KEYS = {"shared", "runs", "seeds", "baseline"}
RUN_KEYS = {"name", "model", "optim", "recipe"}


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a grid: a model at one seed, with its full config."""

    name: str  # the grid's model name
    seed: int
    run: str  # the run directory's name: ``name``, or ``name-seedS`` with several seeds
    values: dict[str, Any]


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
    # Seed by seed: a grid stopped early has every model at its first seeds.
    return sorted(planned, key=lambda plan: seeds.index(plan.seed))


def grid_baseline(grid: dict[str, Any]) -> str:
    """The model every other model is compared with (``baseline:``, default the first)."""
    return grid.get("baseline") or grid["runs"][0]["name"]


def check_grid(
    grid: dict[str, Any],
    out_dir: Path,
    shared_override: dict[str, Any],
    num_seeds: int | None = None,
) -> list[PlannedRun]:
    """The grid's planned runs, once the grid and every folder it would write are checked
    (nothing is written: a bad grid or a folder odelm did not make is one error)."""
    planned = expand_grid(grid, out_dir, shared_override, num_seeds)
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
) -> list[dict[str, Any]]:
    """Train every run of the grid (resuming), then write the tables and plots.

    Returns one result per run (model x seed), each with ``name`` (the model), ``seed``
    and ``run`` (its directory under ``out_dir/runs``).
    """
    out_dir = Path(out_dir)
    grid = load_yaml(grid_file)
    planned = check_grid(grid, out_dir, shared_override or {}, num_seeds)
    claim_folder(out_dir, COMPARISON_MARKER, "comparison")
    (out_dir / "configs").mkdir(parents=True, exist_ok=True)
    results, failed = [], []
    for index, plan in enumerate(planned, start=1):
        result = _train_run(plan, out_dir, f"[{index}/{len(planned)}] {plan.name} seed {plan.seed}")
        if result is None:
            failed.append(plan.run)
        else:
            results.append({**result, "name": plan.name, "seed": plan.seed, "run": plan.run})
    if results:
        write_tables(results, out_dir, grid_baseline(grid))
        from experiments.plots import plot_comparison

        plot_comparison(out_dir, results)
    if failed:
        logs = ", ".join(f"{name} (log: {out_dir / 'logs' / (name + '.log')})" for name in failed)
        raise GridRunError(
            f"{len(failed)} of {len(planned)} runs failed: {logs}; the other runs are kept"
        )
    return results


def _train_run(plan: PlannedRun, out_dir: Path, label: str) -> dict[str, Any] | None:
    """Train one run in its own process (kept if finished under the same config; re-trained
    if its config changed); its output goes to ``logs/RUN.log``. None if it failed.
    Prints one progress line per outcome, starting with ``label``."""
    name = plan.run
    path = out_dir / "configs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(plan.values, sort_keys=False))
    run_dir = out_dir / "runs" / name
    changes = config_changes(run_dir, parse_config(plan.values))
    command = [sys.executable, "-m", "experiments", "train", "--config", str(path), "--quiet"]
    if changes:
        print(f"{label}: config changed ({'; '.join(changes)}), re-training", flush=True)
        command.append("--overwrite")
    elif (run_dir / RESULT_FILE).is_file():
        print(f"{label}: skipped (finished)", flush=True)
        return json.loads((run_dir / RESULT_FILE).read_text())
    else:
        print(f"{label}: training", flush=True)
    log = out_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        status = subprocess.run(
            command,
            check=False,
            stdout=handle,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(os.getpid()),
        ).returncode
    if status != 0:
        print(f"{label}: FAILED (exit {status}); see {log}", flush=True)
        return None
    result = json.loads((run_dir / RESULT_FILE).read_text())
    print(
        f"{label}: trained and tested in {time.perf_counter() - started:.0f} s, "
        f"test ppl {result.get('test_ppl', math.nan):.2f}",
        flush=True,
    )
    return result


def _die_with_parent(parent: int) -> Any:
    """A ``preexec_fn`` that makes Linux kill the trainer when ``odelm compare`` dies, however
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
