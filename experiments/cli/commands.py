"""``odelm compare``'s options and command (``odelm train`` is a LightningCLI:
``experiments.cli.lightning_cli``)."""

from __future__ import annotations

import typing
from argparse import SUPPRESS
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import Namespace
from jsonargparse._actions import _ActionConfigLoad

from experiments.cli.parser import Parser, epilog
from experiments.comparison.launchers import LAUNCH_KEYS, add_launch_options, launch_settings
from experiments.config_errors import ConfigError
from experiments.training.config import (
    SECTIONS,
    Replace,
    RunConfig,
    TrainerConfig,
    load_yaml,
    parse_config,
)
from experiments.training.lightning_form import plain, run_form_key, run_form_overrides
from experiments.training.run_parser import SHORT_FLAGS, run_parser
from experiments.training.run_sections import ModelSection
from experiments.training.threads import check_threads, set_threads

ALIASES = {**SHORT_FLAGS, "--max-time-s": "trainer.max_time_s"}
"""The short flags: ``odelm train``'s (``SHORT_FLAGS``) and ``--max-time-s``, the run form's
budget (train spells it ``--trainer.max_time``); tests/test_option_vocabulary.py keeps the
sets of train, compare and eval equal but for the reasons it lists."""
TRAIN_ONLY = {"help", "config", "print_config", "print_shtab"}


def options_parser(prog: str, description: str) -> Parser:
    """The parser of a subcommand that takes run-config options (``compare``)."""
    description += (
        " Defaults shown are the schema's: the config file's values replace them, and options "
        "given here replace both."
    )
    return Parser(prog=prog, description=description, epilog=epilog(prog.removeprefix("odelm ")))


class ModelOption(ModelSection):
    """``odelm train``'s ``--model``, where ``--model '{...}'`` replaces the config file's
    model section (a ``Replace``: ``compare``'s options lie over each run's section)."""

    whole = Replace


def add_run_options(parser: Parser, skip: set[str] | None = None) -> None:
    """``odelm train``'s run-config options (the run config's parser's: the same types,
    ranges and help lines; ``skip``: top-level keys left out), the keys that ``odelm train``
    renames also under their run-form names (``--trainer.val_every``, ``--seed``),
    ``--trainer.max_time_s`` (``--max-time-s``) and ``--print_config``; the values are read
    into the run form by ``run_form_overrides``."""
    parser.add_argument(
        "--print_config", action="store_true", help="print the resolved config as YAML and exit"
    )
    keys = _run_keys()
    for action in run_parser()._actions:
        flags, dest = action.option_strings[:1], action.dest
        if not flags or dest in TRAIN_ONLY | set(skip or ()) or dest.endswith(".help"):
            continue
        kind: dict[str, Any] = {"type": getattr(action, "_typehint", None)}
        if isinstance(action, _ActionConfigLoad):  # --trainer FILE: the section's keys
            kind = {"action": _ActionConfigLoad(basetype=action.basetype)}
        elif isinstance(action, ModelSection):
            kind = {"action": ModelOption, "default": None}
        elif action.nargs == 0:  # --download
            kind = {"action": "store_true"}
        elif dest == "recipe":
            kind = {"type": Optional[str]}  # noqa: UP045 (a runtime type)
        elif action.choices:
            kind["choices"] = action.choices
        elif dest == "trainer.max_steps":  # Lightning's -1 (no step budget) or the run form's
            kind["type"] = Optional[int]  # noqa: UP045 (a runtime type)
        elif dest.startswith("trainer.") and dest in keys:  # Lightning's type; the run form's
            kind["type"] = keys[dest]
        run_key = run_form_key(dest)
        same = dest == "seed_everything" or dest.startswith("run.")  # the same values
        for flag, key, help_text in ((flags[0], dest, action.help), (f"--{run_key}", run_key, "")):
            if flag not in parser._option_string_actions:
                kind = kind if key == dest or same else {"type": keys[run_key]}
                default = {"default": action.default} if key == dest else {}
                alias = f"same as {flags[0]}" if "." not in key else SUPPRESS  # --seed listed;
                text = help_text or alias  # the run form's dotted names accepted, not listed
                parser.add_argument(flag, dest=key, help=text, **{**default, **kind})
    budget = "the wall-clock budget in seconds (null: none; as --trainer.max_time)"
    max_time = typing.get_type_hints(TrainerConfig)["max_time_s"]
    parser.add_argument("--trainer.max_time_s", type=max_time, help=SUPPRESS)
    parser.add_argument("--max-time-s", dest="trainer.max_time_s", type=max_time, help=budget)


def _run_keys() -> dict[str, Any]:
    """Every dotted run-form key (``trainer.val_every``) and its type."""
    hints = typing.get_type_hints(RunConfig)
    keys = {key: hint for key, hint in hints.items() if key not in SECTIONS}
    for section, schema in SECTIONS.items():
        keys |= {f"{section}.{k}": v for k, v in typing.get_type_hints(schema).items()}
    return keys


def given_options(args: Namespace) -> dict[str, Any]:
    """The options of ``train`` or ``compare`` as a nested mapping (only those given: the
    config file's values lie under them); ``--model '{...}'`` stays a ``Replace``."""
    given = plain(args.as_dict())
    for section in given.values():  # a section read from a file (--trainer FILE)
        if isinstance(section, dict):
            section.pop("__path__", None)
    if "model" in given:
        given["model"] = args["model"]  # as_dict() copies it into a plain dict
    return given


def compare_parser() -> Parser:
    """The options of ``odelm compare``."""
    parser = options_parser(
        "odelm compare",
        "Train a grid of models on identical data, seeds and budget, then write tables and "
        "plots. Any shared config key may be overridden for every run as --section.key VALUE "
        "(e.g. --trainer.max_steps 200 --optim.lr 3e-4), spelled as odelm train spells it "
        "(the grid files' names, such as --trainer.val_every or --trainer.num_threads, are "
        "read too); model keys given here (--model.KEY, --model '{...}') lie under each "
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
    add_run_options(parser, skip={"name", "out_dir"})
    return parser


def cmd_compare(args: Namespace) -> int:
    from experiments.comparison.compare import (
        check_grid,
        expand_grid,
        grid_path,
        grid_slurm,
        run_grid,
    )

    shared = run_form_overrides(given_options(args))
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
    requested = trainer.get("num_threads") or launch.slurm.get("cpus")
    # the policy's threads, shared among the runs in flight at once
    trainer["num_threads"] = set_threads(requested, runs=min(launch.jobs, runs))
    results = run_grid(grid, out, shared, num_seeds=num_seeds, launch=launch)
    print(f"[compare] {len(results)} runs; tables and plots in {out}")
    print((Path(out) / "results.md").read_text())
    return 0
