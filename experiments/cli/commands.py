"""``odelm train`` and ``odelm compare``: their options (the run config's parser's,
``experiments.training.config``) and commands."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from experiments.cli.examples import epilog
from experiments.cli.parser import Parser
from experiments.comparison.launchers import LAUNCH_KEYS, add_launch_options, launch_settings
from experiments.config_errors import ConfigError
from experiments.models.schema import model_keys_help, resolved_model_comment
from experiments.training.config import (
    NO_MODEL,
    add_run_arguments,
    load_yaml,
    named,
    parse_config,
    plain,
)
from experiments.training.threads import check_threads, set_threads

COMMAND_OPTIONS = ("overwrite", "quiet", "verbose", "print_config")


def options_parser(prog: str, description: str) -> Parser:
    """The parser of a subcommand that takes run-config options (``train``, ``compare``)."""
    description += (
        " Defaults shown are the schema's: the config file's values replace them, and options "
        "given here replace both."
    )
    return Parser(prog=prog, description=description, epilog=epilog(prog.removeprefix("odelm ")))


def train_parser() -> Parser:
    """The options of ``odelm train``: the run config's parser's, and the command's."""
    parser = options_parser(
        "odelm train",
        "Train one model from YAML run configs (--config, repeatable: each file over the ones "
        "before) and/or options: any config key as --section.key VALUE (e.g. --optim.lr 1e-3 "
        "--trainer.max_steps 20 --trainer.max_time 00:05:00).",
    )
    parser.epilog = f"{parser.epilog}\n\n{model_keys_help()}"
    add_run_arguments(parser)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an existing run of this name (made with another config) and train afresh",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or Lightning chatter")
    parser.add_argument(
        "--verbose", action="store_true", help="show Lightning's hardware lines and tips"
    )
    parser.add_argument(
        "--print_config", action="store_true", help="print the resolved config as YAML and exit"
    )
    return parser


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
    options = {key: values.pop(key, False) for key in COMMAND_OPTIONS}
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


def given_options(args: Namespace) -> dict[str, Any]:
    """The options of ``train`` or ``compare`` as a nested mapping (only those given: the
    config file's values lie under them); ``--model '{...}'`` stays a ``Replace``."""
    given = plain(args.as_dict())
    for section in given.values():  # a section read from a file (--trainer FILE)
        if isinstance(section, dict):
            section.pop("__path__", None)
    given.pop("__path__", None)
    if "model" in given:
        given["model"] = args["model"]  # as_dict() copies it into a plain dict
    return given


def compare_parser() -> Parser:
    """The options of ``odelm compare``."""
    parser = options_parser(
        "odelm compare",
        "Train a grid of models on identical data, seeds and budget, then write tables and "
        "plots. Any shared config key may be overridden for every run as --section.key VALUE "
        "(e.g. --trainer.max_steps 200 --optim.lr 3e-4), spelled as odelm train and the grid "
        "files spell it; model keys given here (--model.KEY, --model '{...}') lie under each "
        "run's own model section, whose keys win.",
    )
    parser.add_argument("--grid", help="grid YAML file (give this or --preset)")
    parser.add_argument(
        "--preset", help="a grid shipped in experiments/configs/grids (give this or --grid)"
    )
    parser.add_argument("--out", help="output directory, resumable (needed unless --print_config)")
    parser.add_argument(
        "--seeds",
        type=int,
        help="train every model with N seeds: S..S+N-1, S being --seed, else the grid's "
        "first seed (null: the grid's seeds; results.md: mean ± sd, paired 95% intervals)",
    )
    add_launch_options(parser)
    parser.add_argument(
        "--print_config", action="store_true", help="print the resolved config as YAML and exit"
    )
    add_run_arguments(parser, grid=True)
    return parser


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
