"""``odelm train`` and ``odelm compare``: the commands (their options:
``experiments.cli.options``)."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path

import yaml
from jsonargparse import Namespace

from experiments.cli.options import TRAIN_FLAGS, given_options
from experiments.comparison.launchers import LAUNCH_KEYS, launch_settings
from experiments.config_errors import ConfigError
from experiments.models.schema import resolved_model_comment
from experiments.training.config import NO_MODEL, load_yaml, named, parse_config
from experiments.training.threads import check_threads, set_threads


def quiet_lightning(level: int) -> None:
    """Hide Lightning's hardware lines, tips and advertisements (shown with ``--verbose``)."""
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(level)


def cmd_train(args: Namespace) -> int:
    """``odelm train``: the run config its options give, trained (or printed); its result
    and where it went."""
    from experiments.training.runs import RESULT_FILE
    from experiments.training.train import train

    values = given_options(args)
    options = {key: values.pop(key, False) for key in TRAIN_FLAGS}
    paths = values.pop("config", None)
    config = named(parse_config(values, where="odelm train", print_only=True), paths)
    if options["print_config"]:
        text = yaml.safe_dump(config.to_dict(), sort_keys=False)
        model = resolved_model_comment(config.model) if config.model else f"# {NO_MODEL}\n"
        print(text + model, end="")  # the run's identity is the section as written
        return 0
    if not config.model:
        raise ConfigError(NO_MODEL)
    check_threads(config.trainer.num_threads, "trainer.num_threads")
    if not options["verbose"]:
        quiet_lightning(logging.ERROR if options["quiet"] else logging.WARNING)
    if options["quiet"]:
        config.trainer.progress_bar = False
    done = config.run_dir / RESULT_FILE
    finished = done.is_file() and not options["overwrite"]
    result = train(config, overwrite=bool(options["overwrite"]))
    if result:
        print(json.dumps(result))
        if finished:
            date = datetime.fromtimestamp(done.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            print(f"{config.run_dir}: already finished, result from {date} (--overwrite retrains)")
        else:
            print(f"wrote {config.run_dir}")
    return 0


def cmd_compare(args: Namespace) -> int:
    from experiments.comparison.compare import (
        check_grid,
        expand_grid,
        grid_path,
        grid_slurm,
        run_grid,
    )

    shared = given_options(args)
    grid, preset, out = (shared.pop(key, None) for key in ("grid", "preset", "out"))
    num_seeds, print_config = shared.pop("seeds", None), shared.pop("print_config", False)
    launch_options = {key: shared.pop(key) for key in LAUNCH_KEYS if key in shared}
    if bool(grid) == bool(preset):
        raise ConfigError("give exactly one of --grid FILE or --preset NAME")
    grid = grid or grid_path(preset)
    if print_config:
        plans = expand_grid(load_yaml(grid), Path(out or "OUT"), shared, num_seeds)
        configs = [parse_config(plan.values).to_dict() for plan in plans]
        print(yaml.safe_dump_all(configs, sort_keys=False, default_flow_style=None), end="")
        return 0
    if not out:
        raise ConfigError("odelm compare needs --out DIR (where runs, tables and plots go)")
    trainer, values = shared.setdefault("trainer", {}), load_yaml(grid)
    runs = len(check_grid(values, Path(out), shared, num_seeds))  # errors first
    launch = launch_settings(launch_options, runs, trainer.get("num_threads"), grid_slurm(values))
    if launch.launcher == "local":  # Slurm's nodes may have more CPUs than this machine
        check_threads(trainer.get("num_threads"))
    requested = trainer.get("num_threads") or launch.slurm.get("cpus_per_task")
    # the policy's threads, shared among the runs in flight at once
    trainer["num_threads"] = set_threads(requested, runs=min(launch.jobs, runs))
    results = run_grid(grid, out, shared, num_seeds=num_seeds, launch=launch)
    print(f"[compare] {len(results)} runs; tables and plots in {out}")
    print((Path(out) / "results.md").read_text())
    return 0
