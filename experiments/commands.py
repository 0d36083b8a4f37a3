"""The training-side subcommands of ``odelm``: train, eval, generate, compare."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import torch

from experiments.data.corpora import CORPUS_NAMES, PROTOCOLS
from experiments.discretize import register_discretize


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Command-line settings that override a config (only those given)."""
    values: dict[str, Any] = {}
    if getattr(args, "data_dir", None):
        values.setdefault("data", {})["data_dir"] = args.data_dir
    if getattr(args, "protocol", None):
        values.setdefault("data", {})["protocol"] = args.protocol
    if getattr(args, "download", False):
        values.setdefault("data", {})["download"] = True
    trainer_keys = ("max_steps", "max_time_s", "devices", "num_nodes", "strategy", "accelerator")
    for key in (*trainer_keys, "num_threads"):
        value = getattr(args, key, None)
        if value is not None:
            values.setdefault("trainer", {})[key] = value
    if getattr(args, "seed", None) is not None:
        values["seed"] = args.seed
    if getattr(args, "out_dir", None):
        values["out_dir"] = args.out_dir
    return values


def quiet_lightning() -> None:
    """Hide Lightning's hardware lines, tips and advertisements (shown with ``--verbose``)."""
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)


def cmd_train(args: argparse.Namespace) -> int:
    from experiments.config import load_config
    from experiments.train import train

    config = load_config(args.config, _overrides(args))
    if not args.verbose:
        quiet_lightning()
    if args.quiet:
        logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
        config.trainer.progress_bar = False
    result = train(config, overwrite=args.overwrite)
    if result:
        print(json.dumps(result))
        print(f"wrote {config.run_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import dataclasses

    from experiments.evaluate import evaluate_run
    from experiments.trained import load_run

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    run = load_run(args.run)
    config = run.config
    settings = ("bleu_sentences", "continuation_sentences", "prompt_len", "decode")
    given = {key: getattr(args, key) for key in settings if getattr(args, key) is not None}
    config.eval = dataclasses.replace(config.eval, **given)
    data = run.data(**({"data_dir": args.data_dir} if args.data_dir else {}))
    result = evaluate_run(run.model, data, config, args.split, allow_noncausal=args.allow_noncausal)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>14}: {value}")
    return 0


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
        eos_id=run.tokenizer.eos_id if args.stop_at_eos else None,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=torch.Generator().manual_seed(args.seed),
    )
    print(text)
    return 0


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (thread counts)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def cmd_compare(args: argparse.Namespace) -> int:
    from experiments.compare import grid_path, run_grid
    from experiments.config import ConfigError

    if bool(args.grid) == bool(args.preset):
        raise ConfigError("give exactly one of --grid FILE or --preset NAME")
    grid = args.grid or grid_path(args.preset)
    shared = _overrides(args)
    shared.pop("out_dir", None)
    if args.data_dir and not args.corpus:
        shared["data"].setdefault("corpus", "ptb")
        shared["data"].setdefault("protocol", "mini")
    if args.corpus:
        shared.setdefault("data", {})["corpus"] = args.corpus
    results = run_grid(grid, args.out, shared, num_seeds=args.seeds)
    print(f"[compare] {len(results)} runs; tables and plots in {args.out}")
    print((__import__("pathlib").Path(args.out) / "results.md").read_text())
    return 0


def _add_training_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", help="folder holding the corpus (default: the config's, $ODELM_DATA_DIR)"
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help="full: train/valid/test; mini: train on the valid split (default: the config's)",
    )
    parser.add_argument(
        "--download", action="store_true", help="fetch the PTB/WikiText-2 files a run needs"
    )
    parser.add_argument(
        "--max-steps", type=int, help="optimizer steps per run (default: the config's)"
    )
    parser.add_argument(
        "--max-time-s",
        type=float,
        help="wall-clock training budget per run, seconds (default: the config's)",
    )
    parser.add_argument("--seed", type=int, help="seed of the run (default: the config's)")
    parser.add_argument(
        "--accelerator", help="Lightning accelerator: cpu, gpu, auto (default: the config's)"
    )
    parser.add_argument(
        "--devices",
        type=lambda v: v if v == "auto" else int(v),
        help="Lightning devices: a count or auto (default: the config's)",
    )
    parser.add_argument("--num-nodes", type=int, help="Lightning nodes (default: the config's)")
    parser.add_argument("--strategy", help="Lightning strategy, e.g. ddp (default: the config's)")
    parser.add_argument(
        "--num-threads",
        type=int,
        help="torch CPU threads per run (default: the config's, else torch's choice)",
    )


def register_train(commands: Any) -> None:
    parser = commands.add_parser("train", help="train one model from a YAML config")
    parser.add_argument("--config", required=True, help="the run's YAML config file")
    parser.add_argument("--out-dir", help="runs go to OUT_DIR/NAME (default: the config's)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or Lightning chatter")
    parser.add_argument(
        "--verbose", action="store_true", help="show Lightning's hardware lines and tips"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an existing run of this name (made with another config) and train afresh",
    )
    _add_training_overrides(parser)
    parser.set_defaults(func=cmd_train)


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
        "--num-threads", type=positive_int, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--allow-noncausal",
        action="store_true",
        help="score a model that sees the tokens it predicts (labelled as such)",
    )
    parser.add_argument(
        "--data-dir", help="where the run's corpus is now (default: where it was trained)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.set_defaults(func=cmd_eval)


def register_generate(commands: Any) -> None:
    from experiments.decoding import STRATEGIES

    parser = commands.add_parser("generate", help="continue a prompt with a trained run")
    parser.add_argument("run", help="a run directory written by odelm train")
    parser.add_argument("--prompt", required=True, help="the text to continue (its words)")
    parser.add_argument("--max-new-tokens", type=int, default=20, help="tokens to generate")
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
    parser = commands.add_parser("compare", help="train a grid of models side by side")
    parser.add_argument("--grid", help="grid YAML file (no default: give this or --preset)")
    parser.add_argument(
        "--preset",
        help="a grid shipped in experiments/configs/grids (no default: give this or --grid)",
    )
    parser.add_argument("--out", required=True, help="output directory (resumable)")
    parser.add_argument(
        "--corpus", choices=CORPUS_NAMES, help="corpus of every run (default: the grid's)"
    )
    parser.add_argument(
        "--seeds",
        type=positive_int,
        metavar="N",
        help="train every model with N seeds: S..S+N-1, S being --seed, else the grid's "
        "first seed (default: the grid's seeds; results.md: mean ± sd, paired 95%% intervals)",
    )
    _add_training_overrides(parser)
    parser.set_defaults(func=cmd_compare)


REGISTRARS = [
    register_train,
    register_eval,
    register_generate,
    register_compare,
    register_discretize,
]
