"""Side-by-side comparison: one data split, tokenizer, seed and budget for every model.

A grid file has ``shared`` (a partial run config: data, seed, optim, trainer) and ``runs``
(each a ``name``, a ``model`` section and optionally ``optim`` overrides). Runs may not
override the data, the seed or the budget, so every model sees the same tokens for the
same number of steps or seconds. Each run trains in its own process (so peak memory is its
own) through ``odelm train``; finished runs are skipped and half-finished ones resume.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from experiments.config import ConfigError, load_yaml, merge, parse_config
from experiments.runs import config_changes
from experiments.train import RESULT_FILE
from odelm.errors import OdelmError

GRIDS_DIR = Path(__file__).parent / "configs" / "grids"
RUN_KEYS = {"name", "model", "optim"}
COLUMNS = [
    ("name", "model"),
    ("family", "family"),
    ("parameters", "parameters"),
    ("test_ppl", "perplexity"),
    ("test_ppl_per_word", "per-word perplexity"),
    ("test_bleu_tf", "BLEU teacher-forced"),
    ("test_bleu_cont", "BLEU continuation"),
    ("test_nfe", "NFE"),
    ("train_tokens_per_s", "train tokens/s"),
    ("peak_memory_mb", "peak memory MB"),
    ("is_causal", "is_causal"),
    ("protocol", "data protocol"),
    ("valid_ppl", "valid perplexity"),
    ("steps", "steps"),
    ("train_seconds", "train seconds"),
    ("model", "configuration"),
]


class GridRunError(OdelmError, RuntimeError):
    """Some runs of a grid failed (the others finished and are kept)."""


def grid_path(preset: str) -> Path:
    path = GRIDS_DIR / f"{preset}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in GRIDS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown grid preset {preset!r}; valid: {', '.join(names)}")
    return path


def expand_grid(grid: dict[str, Any], out_dir: Path, shared_override: dict[str, Any]) -> list[dict]:
    """One full run config per grid entry, checked, with shared settings enforced."""
    unknown = sorted(set(grid) - {"shared", "runs"})
    if unknown:
        raise ConfigError(f"unknown grid key {unknown[0]}; a grid has 'shared' and 'runs'")
    shared = merge(grid.get("shared", {}), shared_override)
    runs = grid.get("runs") or []
    if not runs:
        raise ConfigError("the grid has no runs")
    configs, names = [], set()
    for index, run in enumerate(runs):
        extra = sorted(set(run) - RUN_KEYS)
        if extra:
            raise ConfigError(
                f"runs[{index}] sets {extra[0]}; a run may set only {', '.join(sorted(RUN_KEYS))} "
                "(data, seed and budget are shared so the comparison is fair)"
            )
        if run.get("name") in names or "name" not in run:
            raise ConfigError(f"runs[{index}] needs a unique name, got {run.get('name')!r}")
        names.add(run["name"])
        values = merge(shared, {**run, "out_dir": str(out_dir / "runs")})
        parse_config(values, where=f"runs[{index}] ({run['name']})")
        configs.append(values)
    return configs


def run_grid(
    grid_file: str | Path,
    out_dir: str | Path,
    shared_override: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Train every run of the grid (resuming), then write the tables and plots."""
    out_dir = Path(out_dir)
    configs = expand_grid(load_yaml(grid_file), out_dir, shared_override or {})
    (out_dir / "configs").mkdir(parents=True, exist_ok=True)
    results, failed = [], []
    for values in configs:
        result = _train_run(values, out_dir)
        if result is None:
            failed.append(values["name"])
        else:
            results.append(result)
    if results:
        write_tables(results, out_dir)
        from experiments.plots import plot_comparison

        plot_comparison(out_dir, [r["name"] for r in results], results)
    if failed:
        logs = ", ".join(f"{name} (log: {out_dir / 'logs' / (name + '.log')})" for name in failed)
        raise GridRunError(
            f"{len(failed)} of {len(configs)} runs failed: {logs}; the other runs are kept"
        )
    return results


def _train_run(values: dict[str, Any], out_dir: Path) -> dict[str, Any] | None:
    """Train one run in its own process (kept if finished under the same config; re-trained
    if its config changed); its output goes to ``logs/NAME.log``. None if it failed."""
    name = values["name"]
    path = out_dir / "configs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    run_dir = out_dir / "runs" / name
    changes = config_changes(run_dir, parse_config(values))
    command = [sys.executable, "-m", "experiments", "train", "--config", str(path), "--quiet"]
    if changes:
        print(f"[compare] {name}: config changed ({'; '.join(changes)}), re-training", flush=True)
        command.append("--overwrite")
    elif (run_dir / RESULT_FILE).is_file():
        print(f"[compare] {name}: finished earlier, kept", flush=True)
        return json.loads((run_dir / RESULT_FILE).read_text())
    else:
        print(f"[compare] training {name}", flush=True)
    log = out_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        status = subprocess.run(
            command, check=False, stdout=handle, stderr=subprocess.STDOUT
        ).returncode
    if status != 0:
        print(f"[compare] {name}: FAILED (exit {status}); see {log}", flush=True)
        return None
    return json.loads((run_dir / RESULT_FILE).read_text())


def write_tables(results: list[dict[str, Any]], out_dir: Path) -> None:
    """``results.csv`` (every column) and ``results.md`` (the table a paper would show)."""
    with (out_dir / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([key for key, _ in COLUMNS])
        for result in results:
            writer.writerow([result.get(key) for key, _ in COLUMNS])
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for result in results:
        cells = [_cell(key, result.get(key)) for key, _ in COLUMNS]
        if not result.get("is_causal", True):
            cells[3] += " (non-causal: not an LM perplexity)"
        lines.append("| " + " | ".join(cells) + " |")
    protocols = sorted({str(r.get("protocol")) for r in results})
    lines += ["", f"Data protocol: {'; '.join(protocols)}. Perplexities are on the test split."]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "parameters":
        return f"{value / 1e6:.2f}M"
    if isinstance(value, float):
        return f"{value:.3f}" if "bleu" in key else f"{value:.2f}"
    return str(value)
