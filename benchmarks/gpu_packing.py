"""A study on one GPU (issue 50): runs per hour with N runs packed on one device, and the
wall time a study grid would take there (``odelm bench gpu-packing``, and the GPU check's
``packing`` phase).

``odelm compare --jobs N`` on one visible GPU starts N ``odelm train`` processes on it, each
with its own CUDA context (the device time-slices between them; with NVIDIA's MPS daemon
running, which odelm does not start, their kernels run side by side), after checking that
the device has the memory a run needs (``experiments.comparison.gpus.MemoryGate``). This
benchmark measures what that gives: for N in ``LEVELS`` it starts N worker processes, each
training one of the grid's models (round robin, the first seed's config: its model, batch,
window and precision; uniform random tokens of the corpus's vocabulary) with the library's
step (``benchmarks.gpu_models.Stepper``: the harness's loss, AdamW, one read of the loss per
step as the harness's finiteness check makes). Each worker builds its model and warms up,
says it is ready; when all are, they train together for ``window_s`` seconds and report
their steps. A run's time is its steps (``trainer.max_steps``, or ``max_epochs`` times the
batches of an epoch of its corpus) at the rate measured plus its start-up (the worker's
imports, model and warm-up); validation and test evaluation are not counted, so runs per
hour are an upper bound of what ``odelm compare`` reaches, to be checked against a slice of
a study trained there. ``predict_grid_hours`` turns them into a grid's wall time.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_models import free
from benchmarks.gpu_phases import Context, fmt

GRID = "study2-continuous"
"""The GPU check's grid (one grid within its time budget)."""
BENCH_GRIDS = ("study2-continuous", "study-grammar-d1", "study-grammar-d3")
"""``odelm bench gpu-packing``'s grids: the study run sizes of PTB-mini and the grammars."""
SHORT_GRID = "study-grammar-d1"
LEVELS, SHORT_LEVELS = (1, 4, 8, 16), (1,)
WINDOW_S, SHORT_WINDOW_S = 8.0, 0.5
READY_TIMEOUT_S = 120.0
DEFAULT_VOCAB = 10_000
"""The vocabulary a worker's model gets when the grid's corpus cannot be loaded here."""
SHORT_MODEL = {"d_model": 16, "d_ff": 32, "n_heads": 2}
"""The short mode's stand-in width (every run of the grid at it, on the CPU)."""


def grid_runs(grid: str) -> list[dict[str, Any]]:
    """One run config (values) per model of the named grid, at its first seed."""
    from experiments.comparison.compare import expand_grid, grid_path
    from experiments.training.config import load_yaml

    plans = expand_grid(load_yaml(grid_path(grid)), Path("unused"), {})
    first: dict[str, dict[str, Any]] = {}
    for plan in plans:
        first.setdefault(plan.name, plan.values)
    return list(first.values())


def run_steps(values: dict[str, Any], epoch_batches: int | None) -> int | None:
    """A run's training steps: ``max_steps``, else ``max_epochs`` times ``epoch_batches``."""
    trainer = values.get("trainer", {})
    if trainer.get("max_steps"):
        return int(trainer["max_steps"])
    epochs = trainer.get("max_epochs")
    return int(epochs) * epoch_batches if epochs and epoch_batches else None


def corpus_facts(values: dict[str, Any]) -> dict[str, Any]:
    """The vocabulary and the batches of a training epoch of a run's corpus, or the default
    vocabulary and None where the corpus cannot be loaded here (the reason recorded)."""
    from experiments.training.config import parse_config
    from experiments.training.datamodule import LMDataModule, load_data

    config = parse_config(values)
    try:
        module = LMDataModule(load_data(config.data), config.data, config.seed)
        return {"vocab": module.vocab_size, "epoch_batches": len(module.train_batches())}
    except Exception as error:  # noqa: BLE001 - no corpus here: the default, said so
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return {"vocab": DEFAULT_VOCAB, "epoch_batches": None, "corpus": f"not loaded: {reason}"}


def worker_job(
    values: dict[str, Any], vocab: int, device: str, window_s: float, short: bool
) -> dict:
    """What one worker is told: the run's values, vocabulary, device and window (the short
    mode: a tiny width, and the loss without Lightning, whose import alone takes seconds)."""
    if short:
        values = {**values, "model": {**values["model"], **SHORT_MODEL}}
    return {"values": values, "vocab": vocab, "device": device, "window_s": window_s,
            "harness": not short}  # fmt: skip


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """Train ``job``'s run for its window once the parent says go (a line on stdin). The
    run's values were checked by the parent (``expand_grid``); the worker reads them
    directly, the schema's defaults for what they leave out."""
    started = time.perf_counter()
    from benchmarks.gpu_models import Stepper, random_batches, sync
    from experiments.models.build import build_model
    from experiments.training.run_schema import DataConfig, TrainerConfig

    values = job["values"]
    data, trainer = values.get("data", {}), values.get("trainer", {})
    device = torch.device(job["device"])
    torch.manual_seed(values.get("seed", 0))
    model = build_model(values["model"], job["vocab"]).to(device)
    bf16 = str(trainer.get("precision", TrainerConfig.precision)).startswith("bf16")
    step = Stepper(model, bf16=bf16, lr=1e-4, harness=job["harness"])
    shape = (data.get("batch_size", DataConfig.batch_size), data.get("bptt", DataConfig.bptt))
    batches = random_batches(4, *shape, job["vocab"], device)
    for batch in batches[:2]:
        float(step(batch))
    sync(device)
    print(json.dumps({"ready": time.perf_counter() - started}), flush=True)
    sys.stdin.readline()
    steps, began = 0, time.perf_counter()
    while time.perf_counter() - began < job["window_s"]:
        float(step(batches[steps % len(batches)]))  # the harness's one read per step
        steps += 1
    sync(device)
    memory = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"steps": steps, "seconds": time.perf_counter() - began, "memory_mb": memory}


def run_level(jobs: list[dict[str, Any]], repo: Path) -> list[dict[str, Any]]:
    """Start one worker per job, wait until all are ready, let them train together; each
    worker's report (its start-up seconds added) or its error."""
    with contextlib.ExitStack() as stack:  # stderr to files: no pipe left to fill up
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in jobs]
        children = [_start_worker(repo, log) for log in logs]
        try:
            return _run_workers(children, jobs, logs)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()


def _start_worker(repo: Path, log: Any) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmarks.gpu_packing", "--worker"]
    return subprocess.Popen(command, cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=log, text=True)  # fmt: skip


def _run_workers(
    children: list[subprocess.Popen], jobs: list[dict[str, Any]], logs: list[Any]
) -> list[dict[str, Any]]:
    """Hand each worker its job, wait until all are ready, say go, collect the reports."""
    ready = []
    for child, job in zip(children, jobs):
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(job) + "\n")
        child.stdin.flush()
    for child in children:
        line = child.stdout.readline() if child.stdout else ""
        ready.append(json.loads(line)["ready"] if line.startswith("{") else None)
    for child in children:
        if child.stdin is not None and child.poll() is None:
            with contextlib.suppress(BrokenPipeError):  # a worker that died is reported
                child.stdin.write("go\n")
                child.stdin.flush()
    reports = []
    for child, startup, log in zip(children, ready, logs):
        out, _ = child.communicate(timeout=READY_TIMEOUT_S)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if child.returncode or startup is None or not lines:
            log.seek(0)
            tail = (log.read().strip().splitlines() or ["no output"])[-1]
            reports.append({"error": f"worker exit {child.returncode}: {tail}"})
        else:
            reports.append({**json.loads(lines[-1]), "startup_s": startup})
    return reports


def runs_per_hour(reports: list[dict[str, Any]], steps: list[int | None]) -> float | None:
    """Runs an hour of the packed workers: each worker's run takes its steps at its measured
    rate plus its start-up; None when a worker failed or a run's steps are unknown."""
    total = 0.0
    for report, run in zip(reports, steps, strict=True):
        if "error" in report or not run or not report["steps"]:
            return None
        rate = report["steps"] / report["seconds"]
        total += 3600 / (run / rate + report["startup_s"])
    return total


def steps_per_hour(reports: list[dict[str, Any]]) -> float | None:
    """The training steps an hour of all the workers together (None when one failed)."""
    if any("error" in report for report in reports):
        return None
    return sum(3600 * report["steps"] / report["seconds"] for report in reports)


def speedup(levels: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The last level's runs per hour over the first's, and what it counts: runs, or the
    training steps of all workers where a run's length is unknown (its corpus not loaded
    here: start-up left out)."""
    for key, basis in (("runs_per_hour", "runs"), ("steps_per_hour", "training steps")):
        first, last = levels[0][key], levels[-1][key]
        if len(levels) > 1 and first and last:
            return last / first, basis
    return None, "not measured: one level" if len(levels) < 2 else "not measured: a worker failed"


def measure_packing(record: dict[str, Any], device: torch.device, short: bool, repo: Path,
                    check: Any = lambda: None, grid: str | None = None) -> None:  # fmt: skip
    """Fill ``record`` with each level's workers, runs per hour and the speed-up of ``grid``
    (default ``GRID``, the short mode's ``SHORT_GRID``)."""
    grid = grid or (SHORT_GRID if short else GRID)
    runs = grid_runs(grid)
    facts: dict[str, Any] = {"vocab": 100, "epoch_batches": None}
    facts = facts if short else corpus_facts(runs[0])
    record["grid"], record["corpus"] = grid, facts
    record["mps"], record["fit"] = mps_active(), runs_that_fit(runs, device)
    window = SHORT_WINDOW_S if short else WINDOW_S
    levels = record.setdefault("levels", {})
    for n in SHORT_LEVELS if short else LEVELS:
        check()
        chosen = [runs[i % len(runs)] for i in range(n)]
        jobs = [worker_job(v, facts["vocab"], str(device), window, short) for v in chosen]
        reports = run_level(jobs, repo)
        steps = [run_steps(v, facts["epoch_batches"]) for v in chosen]
        levels[str(n)] = {
            "runs": [v["name"] for v in chosen],
            "workers": reports,
            "runs_per_hour": runs_per_hour(reports, steps),
            "steps_per_hour": steps_per_hour(reports),
        }
    record["speedup"], record["speedup_basis"] = speedup(list(levels.values()))
    record["summary"] = f"{grid}: runs/hour " + ", ".join(
        f"N={n} {fmt(level['runs_per_hour'])}" for n, level in levels.items()
    )


def runs_that_fit(runs: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """How many of the grid's largest runs ``odelm compare`` packs on the device at once
    (``gpus.run_memory_mb`` against its memory; the CPU: not measured)."""
    from experiments.comparison.gpus import fitting_runs, run_memory_mb
    from experiments.training.run_schema import DataConfig

    def need_mb(values: dict[str, Any]) -> float:
        data = values.get("data", {})
        batch = data.get("batch_size", DataConfig.batch_size)
        return run_memory_mb(values["model"], batch, data.get("bptt", DataConfig.bptt))

    need = max(need_mb(values) for values in runs)
    if device.type != "cuda":
        return {"need_mb": need, "runs": None}
    total = torch.cuda.mem_get_info(device)[1] / 2**20
    return {"need_mb": need, "total_mb": total, "runs": fitting_runs(need, total)}


def mps_active() -> bool:
    """Whether NVIDIA's MPS control daemon seems to run (its default pipe exists)."""
    return Path("/tmp/nvidia-mps/control").exists()


def predict_grid_hours(grid: str, rate: float) -> dict[str, Any]:
    """The wall time of the named grid on one GPU at ``rate`` runs per hour: its runs
    (models x seeds, the seed-noise row) and its tuning trials (values x models, at
    least: an extended tuning adds more)."""
    from experiments.comparison.compare import expand_grid, grid_path, result_seeds
    from experiments.comparison.tuning import tune_spec
    from experiments.training.config import load_yaml

    values = load_yaml(grid_path(grid))
    planned = expand_grid(values, Path("unused"), {})
    spec = tune_spec(values, result_seeds(planned))
    trials = 0 if spec is None else len(spec.values) * len(spec.also_values) * len(values["runs"])
    runs = len(planned) + trials
    return {"grid": grid, "runs": runs, "runs_per_hour": rate, "hours": runs / rate}


def packing_phase(ctx: Context, record: dict[str, Any]) -> None:
    """The GPU check's ``packing`` phase."""
    free(ctx.device)  # the check's own cached memory back to the device for the workers
    measure_packing(record, ctx.device, ctx.short, ctx.repo, ctx.check)
    best = max((v["runs_per_hour"] or 0 for v in record["levels"].values()), default=0)
    if best and not ctx.short:
        record["predicted"] = predict_grid_hours(record["grid"], best)


def gpu_packing(out: str | None = None, short: bool = False) -> list[dict[str, Any]]:
    """``odelm bench gpu-packing``: for each grid of ``BENCH_GRIDS`` (the short mode:
    ``SHORT_GRID`` on the CPU), runs per hour at each N, N=16 over N=1 (target 6) and the
    grid's predicted wall time on the device at its best N; ``out``: the records as JSON."""
    device = torch.device("cuda" if torch.cuda.is_available() and not short else "cpu")
    repo, rows = Path(__file__).resolve().parents[1], []
    records: dict[str, dict[str, Any]] = {}
    for grid in (SHORT_GRID,) if short else BENCH_GRIDS:
        record = records.setdefault(grid, {})
        measure_packing(record, device, short, repo, grid=grid)
        rates = [level["runs_per_hour"] or 0 for level in record["levels"].values()]
        if max(rates) and not short:
            record["predicted"] = predict_grid_hours(grid, max(rates))
        rows += packing_rows(grid, record, short)
    if out:
        from odelm import files

        folder = Path(out)
        files.make_dir(folder, root=folder)
        files.write_text(folder / "packing.json", json.dumps(records, indent=2) + "\n", root=folder)
    return rows


def packing_rows(grid: str, record: dict[str, Any], short: bool) -> list[dict[str, Any]]:
    """``odelm bench`` rows of one grid's packing record."""
    common = {"bench": "gpu-packing", "better": "higher", "grid": grid}
    rows = [
        {**common, "metric": f"{grid} runs_per_hour N={n}", "value": level["runs_per_hour"],
         "target": None, "unit": "runs/h"}
        for n, level in record["levels"].items()
    ]  # fmt: skip
    speedup = record["speedup"]
    rows.append({**common, "metric": f"{grid} runs_per_hour N=16 over N=1",
                 "value": speedup if speedup is None or math.isfinite(speedup) else None,
                 "target": None if short else 6.0, "unit": "x", "basis": record["speedup_basis"]})  # fmt: skip
    if "predicted" in record:
        rows.append({**common, "metric": f"{grid} predicted hours on this GPU", "target": None,
                     "value": record["predicted"]["hours"], "unit": "h", "better": "lower"})  # fmt: skip
    return rows


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    print(json.dumps(worker(json.loads(sys.stdin.readline()))), flush=True)
