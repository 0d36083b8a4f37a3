"""The training-side subcommands of ``odelm``: train, eval, generate, compare."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import ArgumentParser

from experiments.config import (
    Replace,
    RunConfig,
    add_run_arguments,
    load_config,
    load_yaml,
    merge,
    parse_config,
)
from experiments.config_checks import ConfigError, check_range, config_error, key_type
from experiments.data.corpora import CORPUS_NAMES
from experiments.discretize import register_discretize
from experiments.help_examples import OptionsHelpFormatter, epilog
from experiments.launchers import LAUNCH_KEYS, add_launch_options, launch_settings
from experiments.model_schema import model_keys_help, resolved_model_comment
from experiments.threads import positive_int, set_threads

# Short flags kept beside the dotted options they stand for (``--max-steps`` is
# ``--trainer.max_steps``): the settings a user changes most from the shell, the same on
# train and compare (eval has those that make sense for a trained run: --data-dir,
# --num-threads; tests/test_option_vocabulary.py keeps the sets equal).
ALIASES = {
    "--corpus": "data.corpus",
    "--max-steps": "trainer.max_steps",
    "--max-time-s": "trainer.max_time_s",
    "--num-threads": "trainer.num_threads",
    "--data-dir": "data.data_dir",
    "--protocol": "data.protocol",
}
COMMAND_KEYS = ("config", "overwrite", "quiet", "verbose", "print_config")


def options_parser(prog: str, description: str) -> ArgumentParser:
    """A jsonargparse parser for a subcommand that takes run-config options."""
    description += (
        " Defaults shown are the schema's: the config file's values replace them, and options "
        "given here replace both."
    )
    return ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog(prog.removeprefix("odelm ")),
        formatter_class=OptionsHelpFormatter,
        exit_on_error=False,
        print_config=None,
    )


def add_run_options(parser: ArgumentParser, skip: set[str] | None = None) -> None:
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
    add_run_arguments(parser, skip)
    for action in parser._actions:  # the corpora from the registry, not the docstring's list
        if action.dest == "data.corpus" and action.option_strings == ["--data.corpus"]:
            action.help = (
                f"the corpus, one of {', '.join(CORPUS_NAMES)} (grammar is generated; text "
                "reads a folder of train*, valid*, test* files)"
            )


def given_options(parser: ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The options given on the command line (defaults left out), as a nested mapping."""
    try:
        given = parser.parse_args(argv, defaults=False).as_dict()
    except argparse.ArgumentError as error:
        unknown = str(error).removeprefix("unrecognized arguments: ")
        if unknown != str(error):
            raise ConfigError(
                f"unknown option {unknown.split()[0]}; {parser.prog} --help lists the options "
                "(config keys as --section.key)"
            ) from None
        missing = str(error).removeprefix("the following arguments are required: ")
        if missing != str(error):
            raise ConfigError(
                f"{parser.prog} needs --{missing}; see {parser.prog} --help"
            ) from None
        raise config_error(error, lambda key: f"--{key}", {}, RunConfig) from None
    # --model.solver.rtol 1e-4 arrives as the model key "solver.rtol": nest it
    model: dict[str, Any] = {}
    for key, value in given.get("model", {}).items():
        for part in reversed(key.split(".")):
            value = {part: value}
        model = merge(model, value)
    if model:  # --model '{...}' replaces the file's model section; --model.KEY edits it
        whole = any(arg == "--model" or arg.startswith("--model=") for arg in argv)
        given["model"] = Replace(model) if whole else model
    return given


def quiet_lightning() -> None:
    """Hide Lightning's hardware lines, tips and advertisements (shown with ``--verbose``)."""
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)


def train_parser() -> ArgumentParser:
    """The options of ``odelm train``."""
    parser = options_parser(
        "odelm train",
        "Train one model from a YAML run config; any config key may be overridden on the "
        "command line as --section.key VALUE (e.g. --optim.lr 1e-3 --trainer.max_steps 20); "
        "--model.KEY VALUE edits one model key, --model '{...}' replaces the whole model section.",
    )
    parser.add_argument("--config", required=True, help="the run's YAML config file")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an existing run of this name (made with another config) and train afresh",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or Lightning chatter")
    parser.add_argument(
        "--verbose", action="store_true", help="show Lightning's hardware lines and tips"
    )
    add_run_options(parser)
    parser.epilog = f"{parser.epilog or ''}\n\n{model_keys_help()}".lstrip()
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    from datetime import datetime

    from experiments.runs import config_sha256
    from experiments.train import RESULT_FILE, train

    given = given_options(train_parser(), args.options)
    command = {key: given.pop(key, None) for key in COMMAND_KEYS}
    config = load_config(command["config"], given)
    if config.name == "auto":  # a run folder per config: trying an override needs no --overwrite
        config.name = f"{Path(command['config']).stem}-{config_sha256(config)[:10]}"
    if command["print_config"]:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None), end="")
        print(resolved_model_comment(config.model), end="")
        return 0
    if not command["verbose"]:
        quiet_lightning()
    if command["quiet"]:
        logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
        config.trainer.progress_bar = False
    done = config.run_dir / RESULT_FILE
    finished = done.is_file() and not command["overwrite"]
    result = train(config, overwrite=bool(command["overwrite"]))
    if result:
        print(json.dumps(result))
        if finished:
            date = datetime.fromtimestamp(done.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            print(f"{config.run_dir}: already finished, result from {date} (--overwrite retrains)")
        else:
            print(f"wrote {config.run_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from experiments.trained import load_run

    settings = ("bleu_sentences", "continuation_sentences", "prompt_len", "decode")
    given = {key: getattr(args, key) for key in settings if getattr(args, key) is not None}
    for key, value in given.items():
        if key != "decode":  # a choice argparse checks
            check_range(f"eval.{key}", value, "--" + key.replace("_", "-"))
    run = load_run(args.run)
    overrides = {"data_dir": args.data_dir} if args.data_dir else {}
    data = run.data(allow_changed_data=args.allow_changed_data, **overrides)
    set_threads(args.num_threads)  # once the run and its data load: an error stays one line
    result = run.evaluate(args.split, **given, allow_noncausal=args.allow_noncausal, data=data)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>14}: {rounded(key, value)}")
    return 0


def rounded(key: str, value: Any) -> Any:
    """A result value for people: perplexities (and numbers >= 100) to 2 decimals, other
    floats to 4 significant digits (``--json`` keeps full precision)."""
    if not isinstance(value, float):
        return value
    return f"{value:.2f}" if "ppl" in key or abs(value) >= 100 else f"{value:.4g}"


def cmd_generate(args: argparse.Namespace) -> int:
    from experiments.trained import load_run

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    run = load_run(args.run)
    text = run.generate(
        args.prompt,
        args.max_new_tokens,
        strategy=args.strategy,
        num_beams=args.num_beams,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_at_eos=args.stop_at_eos,
    )
    print(text)
    return 0


def compare_parser() -> ArgumentParser:
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
    return parser


def cmd_compare(args: argparse.Namespace) -> int:
    from experiments.compare import check_grid, expand_grid, grid_path, grid_slurm, run_grid

    shared = given_options(compare_parser(), args.options)
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
    requested = trainer.get("num_threads") or launch.slurm.get("cpus")
    # the policy's threads, shared among the runs in flight at once
    trainer["num_threads"] = set_threads(requested, runs=min(launch.jobs, runs))
    results = run_grid(grid, out, shared, num_seeds=num_seeds, launch=launch)
    print(f"[compare] {len(results)} runs; tables and plots in {out}")
    print((Path(out) / "results.md").read_text())
    return 0


def register_train(commands: Any) -> None:
    parser = commands.add_parser(
        "train",
        help="train one model from a YAML config (--config, --section.key overrides)",
        add_help=False,
    )
    parser.set_defaults(func=cmd_train, options_parser=True)


def register_eval(commands: Any) -> None:
    parser = commands.add_parser("eval", help="perplexity, per-word perplexity, BLEU, NFE of a run")
    parser.add_argument("run", help="a run directory written by odelm train")
    parser.add_argument("--split", default="test", help="the split to score")
    parser.add_argument(
        "--bleu-sentences",
        type=int,
        help="sentences scored for BLEU (default: the run's eval setting)",
    )
    parser.add_argument(
        "--continuation-sentences",
        type=int,
        help="sentences continued for continuation BLEU (default: the run's eval setting)",
    )
    parser.add_argument(
        "--prompt-len",
        type=int,
        help="prompt tokens of continuation BLEU (default: the run's eval setting)",
    )
    parser.add_argument(
        "--decode",
        choices=["greedy", "beam"],
        help="decoding of continuation BLEU (default: the run's eval setting)",
    )
    parser.add_argument(
        "--num-threads",
        type=positive_int,
        help="torch CPU threads (default: the cores other work leaves free, printed)",
    )
    parser.add_argument(
        "--allow-noncausal",
        action="store_true",
        help="score a model that sees the tokens it predicts (labelled as such)",
    )
    parser.add_argument(
        "--data-dir", help="where the run's corpus is now (default: where it was trained)"
    )
    parser.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="score splits that differ from those the run recorded (data_sha256)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.set_defaults(func=cmd_eval)


def register_generate(commands: Any) -> None:
    from odelm.decoding import MAX_NEW_TOKENS, STRATEGIES

    parser = commands.add_parser("generate", help="continue a prompt with a trained run")
    parser.add_argument("run", help="a run directory written by odelm train")
    parser.add_argument("--prompt", required=True, help="the text to continue (its words)")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=20,
        help=f"tokens to generate (at most {MAX_NEW_TOKENS})",
    )
    parser.add_argument(
        "--strategy",
        default="greedy",
        choices=STRATEGIES,
        help="argmax, sampling (--temperature, --top-k, --top-p, --seed) or beam search",
    )
    parser.add_argument("--num-beams", type=int, default=4, help="beams of --strategy beam")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling: divide the logits by it"
    )
    parser.add_argument(
        "--top-k", type=int, help="sampling: keep the K likeliest tokens (default: all)"
    )
    parser.add_argument(
        "--top-p",
        type=float,
        help="sampling: keep the smallest set of tokens with probability >= P (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    parser.add_argument(
        "--stop-at-eos", action="store_true", help="stop at the first end of line (<eos>)"
    )
    parser.add_argument(
        "--num-threads", type=positive_int, help="torch CPU threads (default: torch's choice)"
    )
    parser.set_defaults(func=cmd_generate)


def register_compare(commands: Any) -> None:
    parser = commands.add_parser(
        "compare",
        help="train a grid of models side by side (--grid or --preset, --out)",
        add_help=False,
    )
    parser.set_defaults(func=cmd_compare, options_parser=True)


REGISTRARS = [
    register_train,
    register_eval,
    register_generate,
    register_compare,
    register_discretize,
]
