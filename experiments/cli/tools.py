"""The corpus and model subcommands of ``odelm``: ``data info``, ``data download`` and
``models``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from experiments.cli import values
from experiments.cli.options import Parser
from experiments.data.corpora import (
    CORPUS_NAMES,
    DEFAULT_CACHE_DIR,
    PROTOCOLS,
    SPECS,
    SPLITS,
    Corpus,
)
from experiments.data.grammar_family import GRAMMAR_DEPTHS


def print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    """One JSON object per row, or a table with a column per key (floats to 4 digits)."""
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    widths = {c: max(len(c), *(len(_fmt(row.get(c))) for row in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(widths[c]) for c in columns))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def corpus_info(
    name: str,
    data_dir: str | None,
    protocol: str | None = None,
    seed: int = 0,
    grammar_depth: int | None = None,
) -> dict[str, Any]:
    """Splits found, lines, words and tokens per split, vocabulary size, file checksums.

    Without a protocol it describes the files as they are (missing splits listed); with
    one it describes the splits a run under that protocol would use.
    """
    from experiments.data.checksums import checksum_status, sha256_file
    from experiments.data.corpora import load_corpus, read_lines, split_files

    if protocol is not None or name == "grammar" or grammar_depth is not None:
        corpus: Corpus = load_corpus(
            name,
            data_dir,
            protocol=protocol or "full",
            seed=seed,
            verify_checksums=False,
            grammar_depth=grammar_depth,
        )
        reference = corpus.reference_nll
        lines, label, paths = corpus.lines, corpus.protocol, corpus.files
    else:
        paths = {split: str(path) for split, path in split_files(name, data_dir).items()}
        if not paths:
            load_corpus(name, data_dir)  # raises the error naming files and folders searched
        lines = {split: read_lines(Path(path)) for split, path in paths.items()}
        label, reference = "files as found", {}
    streamed = bool(protocol is not None or name == "grammar") and corpus.stream is not None
    splits = {}
    for split, split_lines in lines.items():
        tokens = sum(len(line) for line in split_lines)
        splits[split] = {
            "lines": len(split_lines),
            "words": tokens - len(split_lines),
            "tokens": tokens,
        }
    files = {}
    for split, path in paths.items():
        if name in SPECS:
            actual, status = checksum_status(SPECS[name], Path(path))
        else:
            actual, status = sha256_file(path), "unknown"
        files[split] = {"path": path, "sha256": actual, "checksum": status}
    info: dict[str, Any] = {
        "corpus": name,
        "protocol": label,
        "splits": splits,
        "missing": [s for s in SPLITS if s not in lines and not (s == "train" and streamed)],
        "vocab_size": len({word for ls in lines.values() for line in ls for word in line}),
        "files": files,
    }
    if name == "grammar":
        from experiments.data.grammar import ProbabilisticGrammar, default_rules
        from experiments.data.grammar_family import family_grammar

        grammar = (
            ProbabilisticGrammar(default_rules())
            if grammar_depth is None
            else family_grammar(grammar_depth)
        )
        test_nll = reference["test"] / splits["test"]["tokens"]
        info["grammar_depth"] = grammar_depth
        info["entropy_nats_per_token"] = grammar.entropy_per_token
        info["expected_perplexity"] = grammar.expected_perplexity
        info["true_test_nll_per_token"] = test_nll
        info["true_test_perplexity"] = math.exp(test_nll)
    return info


def cmd_data_info(args: Namespace) -> int:
    seed = args.seed
    info = corpus_info(args.corpus, args.data_dir, args.protocol, seed, args.grammar_depth)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"corpus {info['corpus']} ({info['protocol']}), vocabulary {info['vocab_size']}")
    if info["missing"]:
        print(f"missing splits: {', '.join(info['missing'])} (train with --protocol mini)")
    print_rows([{"split": k, **v} for k, v in info["splits"].items()], False)
    if info.get("grammar_depth") is not None:
        print("train: streamed, every sentence drawn afresh (none repeated)")
    for split, entry in info["files"].items():
        print(f"{split} file {entry['path']}: checksum {entry['checksum']}")
    if "expected_perplexity" in info:
        print(
            f"true entropy rate {info['entropy_nats_per_token']:.6f} nats/token (exact); the "
            f"true grammar's NLL on this test split (seed {seed}) is "
            f"{info['true_test_nll_per_token']:.6f} nats/token: its perplexity is "
            f"{info['expected_perplexity']:.3f} in expectation and "
            f"{info['true_test_perplexity']:.3f} on this test split; compare a model's test "
            "perplexity with the latter (its excess loss is the difference in nats/token)"
        )
    return 0


def cmd_data_download(args: Namespace) -> int:
    from experiments.data.download import download_corpus

    folder = download_corpus(
        args.corpus, args.cache_dir, url=args.url, sha256=args.sha256, splits=args.splits
    )
    print(f"{args.corpus}: verified files in {folder}")
    return 0


def cmd_models(args: Namespace) -> int:
    from experiments.models.build import model_keys, model_keys_markdown

    if args.json:
        print(json.dumps(model_keys(), default=str))
    else:
        print(model_keys_markdown(), end="")
    return 0


def data_info_parser() -> Parser:
    """The options of ``odelm data info``."""
    parser = Parser()
    parser.add_argument("--corpus", required=True, choices=CORPUS_NAMES, help="the corpus")
    parser.add_argument(
        "--data-dir",
        help="folder holding the corpus (default: $ODELM_DATA_DIR, then the download cache)",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help="describe the splits a run would use under it (default: the files as found)",
    )
    parser.add_argument(
        "--seed", type=values.data_seed, default=0, help="seed of the grammar corpus"
    )
    parser.add_argument(
        "--grammar-depth",
        "--data.grammar_depth",
        dest="grammar_depth",
        type=int,
        choices=GRAMMAR_DEPTHS,
        help="the grammar family of that depth (data.grammar_depth; default: the embedded grammar)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    return parser


def data_download_parser() -> Parser:
    """The options of ``odelm data download``."""
    parser = Parser()
    parser.add_argument("--corpus", required=True, choices=list(SPECS), help="the corpus")
    parser.add_argument(
        "--cache-dir", default=str(DEFAULT_CACHE_DIR), help="where the files are stored"
    )
    parser.add_argument(
        "--url", help="override the archive URL, e.g. a mirror (default: the published one)"
    )
    parser.add_argument(
        "--sha256",
        help="expected SHA-256 of the archive at --url (default: the published one, if any)",
    )
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=SPLITS,
        default=list(SPLITS),
        help="split files to extract (valid test: what --protocol mini needs)",
    )
    return parser


def models_parser() -> Parser:
    """The options of ``odelm models``."""
    parser = Parser()
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    return parser


def verdicts_parser() -> Parser:
    """The options of ``odelm verdicts``."""
    parser = Parser()
    parser.add_argument(
        "--results",
        default="docs/results",
        help="folder holding one folder per grid with its results.csv",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--write",
        help="put the short table between the verdict markers of this file (README.md), the "
        "full one between those of RESULTS/verdicts.md, and redraw the generated tables "
        "(<!-- odelm:results -->, <!-- odelm:tuning -->) of every RESULTS/GRID/README.md; "
        "every input is read first, and every file is written or none",
    )
    output.add_argument(
        "--json",
        action="store_true",
        help="the table as JSON: each claim's verdict, its primary with Holm over the "
        "primaries and its detectable difference, the secondaries with their unadjusted p",
    )
    return parser


def cmd_verdicts(args: Namespace) -> int:
    import json
    from pathlib import Path

    from experiments.comparison import verdict_tables

    results = Path(args.results)
    if args.json:
        print(json.dumps(verdict_tables.table_json(results), indent=1))
    elif not args.write:
        print(verdict_tables.full_table(results), end="")
    else:
        for path, changed in verdict_tables.write_generated(results, Path(args.write)).items():
            print(f"{path}: generated tables {'rewritten' if changed else 'unchanged'}")
    return 0


def discretize_parser() -> Parser:
    """The options of ``odelm discretize``."""
    parser = Parser()
    parser.add_argument("run", help="a run directory of a node-transformer or ODE Transformer")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--max-batches", type=int, default=4, help="test batches to evaluate")
    parser.add_argument("--eval-batch-size", type=int, default=16, help="sequences per test batch")
    parser.add_argument(  # its old name, hidden (the commands in docs/results use it)
        "--batch-size",
        dest="eval_batch_size",
        type=int,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--steps", type=int, nargs="+", help="fixed-grid step counts (default: 1 2 4 8)"
    )
    parser.add_argument(
        "--dtype", default="float64", choices=["float32", "float64"], help="evaluation precision"
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="also the test-time depth curve: depth.png (test perplexity, or a grammar-family "
        "run's excess loss, against NFE per token, training depth marked, 2x and 4x the "
        "training steps) and depth.json",
    )
    parser.add_argument(
        "--out",
        type=values.folder,
        help="folder for discretize.md/.png, made when missing (default: RUN_DIR/discretize)",
    )
    values.add_placement(parser, "torch's")
    return parser


def cmd_discretize(args: Namespace) -> int:
    """``odelm discretize``; its module (the model families, Lightning, transformers) is
    imported here, not when the parser is built, so that ``odelm --help`` stays quick."""
    from experiments.evaluation import discretize

    return discretize.cmd_discretize(args)
