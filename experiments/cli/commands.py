"""``odelm compare``'s options and command (``odelm train`` is a LightningCLI:
``experiments.cli.lightning_cli``)."""

from __future__ import annotations

from argparse import Action, ArgumentError
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from jsonargparse import Namespace, get_loader

from experiments.cli.parser import Parser, epilog
from experiments.comparison.launchers import LAUNCH_KEYS, add_launch_options, launch_settings
from experiments.config_errors import ConfigError, key_type
from experiments.data.corpora import CORPUS_NAMES
from experiments.training.config import (
    Replace,
    RunConfig,
    add_run_arguments,
    load_yaml,
    merge,
    parse_config,
)
from experiments.training.lightning_form import RUN_KEYS, run_form_overrides
from experiments.training.threads import check_threads, set_threads

# Short flags kept beside the dotted options they stand for (``--max-steps`` is
# ``--trainer.max_steps``): the settings a user changes most from the shell, the same on
# train (``experiments.cli.lightning_cli.SHORT_FLAGS``, less --max-time-s) and compare (eval
# has those that make sense for a trained run: --data-dir, --num-threads;
# tests/test_option_vocabulary.py keeps the sets equal).
ALIASES = {
    "--corpus": "data.corpus",
    "--max-steps": "trainer.max_steps",
    "--max-time-s": "trainer.max_time_s",
    "--num-threads": "trainer.num_threads",
    "--data-dir": "data.data_dir",
    "--protocol": "data.protocol",
}


def options_parser(prog: str, description: str) -> Parser:
    """The parser of a subcommand that takes run-config options (``compare``)."""
    description += (
        " Defaults shown are the schema's: the config file's values replace them, and options "
        "given here replace both."
    )
    return Parser(prog=prog, description=description, epilog=epilog(prog.removeprefix("odelm ")))


MODEL_HELP = (
    "the model: family (ode_transformer, neuralode_lm, reference), name, and that model's "
    "typed keys (listed below the options; odelm models); --model '{family: neuralode_lm, "
    "name: lstm, embed_dim: 128, hidden_dim: 128}' replaces the config file's model section, "
    "--model.KEY VALUE edits one key of it (--model.dropout 0.2, --model.solver.rtol 1e-6) "
    "(default: the config file's)"
)


class ModelOption(Action):
    """``--model '{...}'`` replaces the config file's model section (a ``Replace``);
    ``--model.KEY VALUE`` sets one key of it, a dotted key one level down per dot
    (``--model.solver.rtol 1e-6``). Values are read as YAML (``1e-6`` is a float); the
    section's keys are checked against its model's typed config when the config is read.
    jsonargparse hands this action every ``--model.*`` option because it declares a
    mapping type (``_typehint``)."""

    _typehint = dict[str, Any]

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        key = str(option or "").removeprefix(self.option_strings[0]).removeprefix(".")
        value = get_loader("yaml")(value)
        current = namespace.get(self.dest)
        if not key:
            if not isinstance(value, dict):
                raise ArgumentError(self, f"must be a mapping {{key: value, ...}}, got {value!r}")
            namespace[self.dest] = Replace(value)
            return
        for part in reversed(key.split(".")):
            value = {part: value}
        merged = merge(current or {}, value)
        namespace[self.dest] = Replace(merged) if isinstance(current, Replace) else merged


def add_run_options(parser: Parser, skip: set[str] | None = None) -> None:
    """One typed, documented option per run-config key (``--optim.lr 3e-4``,
    ``--trainer.max_steps 200``, ``--model.d_model 128``), the short aliases and
    ``--print_config``."""
    parser.add_argument(
        "--print_config", action="store_true", help="print the resolved config as YAML and exit"
    )
    for flag, key in ALIASES.items():
        kind = (
            {"choices": CORPUS_NAMES}
            if key == "data.corpus"
            else {"type": key_type(RunConfig, key)}
        )
        parser.add_argument(flag, dest=key, help=f"same as --{key}", **kind)
    parser.add_argument(
        "--download", dest="data.download", action="store_true", help="same as --data.download true"
    )
    add_run_arguments(parser, {*(skip or ()), "model"})
    parser.add_argument("--model", action=ModelOption, help=MODEL_HELP)
    for action in parser._actions:  # the corpora from the registry, not the docstring's list
        if action.dest == "data.corpus" and action.option_strings == ["--data.corpus"]:
            action.help = (
                f"the corpus, one of {', '.join(CORPUS_NAMES)} (grammar is generated; text "
                "reads a folder of train*, valid*, test* files)"
            )


def given_options(args: Namespace) -> dict[str, Any]:
    """The options of ``train`` or ``compare`` as a nested mapping (only those given: the
    config file's values lie under them); ``--model '{...}'`` stays a ``Replace``."""
    given = args.as_dict()
    if "model" in given:
        given["model"] = args["model"]  # as_dict() copies it into a plain dict
    return given


def add_lightning_spellings(parser: Parser) -> None:
    """``odelm train``'s spellings of the keys it names as Lightning does, as options of
    ``compare`` too (read into the run form: ``run_form_overrides``)."""
    same = "odelm train's name, as Lightning's Trainer"
    parser.add_argument("--seed_everything", type=int, help=f"same as --seed ({same})")
    parser.add_argument(
        "--trainer.val_check_interval",
        type=Union[int, float],  # noqa: UP007 (a runtime type)
        help=f"same as --trainer.val_every: steps, or 1.0 each epoch ({same})",
    )
    parser.add_argument(
        "--trainer.limit_val_batches",
        type=Optional[Union[int, float]],  # noqa: UP007, UP045
        help=f"same as --trainer.val_batches: windows, or 1.0 or null all ({same})",
    )
    parser.add_argument(
        "--trainer.log_every_n_steps", type=int, help=f"same as --trainer.log_every ({same})"
    )
    parser.add_argument(
        "--trainer.enable_progress_bar",
        type=bool,
        help=f"same as --trainer.progress_bar ({same})",
    )
    for key in RUN_KEYS:
        parser.add_argument(
            f"--run.{key}",
            type=key_type(RunConfig, f"trainer.{key}"),
            help=f"same as --trainer.{key} (odelm train's run: section)",
        )


def compare_parser() -> Parser:
    """The options of ``odelm compare``."""
    parser = options_parser(
        "odelm compare",
        "Train a grid of models on identical data, seeds and budget, then write tables and "
        "plots. Any shared config key may be overridden for every run as --section.key VALUE "
        "(e.g. --trainer.max_steps 200 --optim.lr 3e-4); model keys given here (--model.KEY, "
        "--model '{...}') lie under each run's own model section, whose keys win.",
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
    add_lightning_spellings(parser)
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
