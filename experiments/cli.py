"""``odelm``: the one command line of the library (also ``python -m experiments``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from experiments.commands import REGISTRARS
from experiments.data.corpora import (
    CORPUS_NAMES,
    DEFAULT_CACHE_DIR,
    PROTOCOLS,
    SPECS,
    SPLITS,
    Corpus,
)
from experiments.help_examples import KeepExamples, epilog
from experiments.threads import positive_int
from odelm.errors import OdelmError


def _print_json_or_table(rows: list[dict[str, Any]], as_json: bool) -> None:
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
    name: str, data_dir: str | None, protocol: str | None = None, seed: int = 0
) -> dict[str, Any]:
    """Splits found, lines, words and tokens per split, vocabulary size, file checksums.

    Without a protocol it describes the files as they are (missing splits listed); with
    one it describes the splits a run under that protocol would use.
    """
    from experiments.data.checksums import checksum_status, sha256_file
    from experiments.data.corpora import load_corpus, read_lines, split_files

    if protocol is not None or name == "grammar":
        corpus: Corpus = load_corpus(
            name, data_dir, protocol=protocol or "full", seed=seed, verify_checksums=False
        )
        lines, label, paths = corpus.lines, corpus.protocol, corpus.files
    else:
        paths = {split: str(path) for split, path in split_files(name, data_dir).items()}
        if not paths:
            load_corpus(name, data_dir)  # raises the error naming files and folders searched
        lines = {split: read_lines(Path(path)) for split, path in paths.items()}
        label = "files as found"
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
        "missing": [split for split in SPLITS if split not in lines],
        "vocab_size": len({word for ls in lines.values() for line in ls for word in line}),
        "files": files,
    }
    if name == "grammar":
        from experiments.data.grammar import (
            ProbabilisticGrammar,
            default_rules,
            true_split_perplexity,
        )

        grammar = ProbabilisticGrammar(default_rules())
        info["entropy_nats_per_token"] = grammar.entropy_per_token
        info["expected_perplexity"] = grammar.expected_perplexity
        info["true_test_perplexity"] = true_split_perplexity(seed, "test")
    return info


def cmd_data_info(args: argparse.Namespace) -> int:
    seed = args.seed
    info = corpus_info(args.corpus, args.data_dir, args.protocol, seed)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"corpus {info['corpus']} ({info['protocol']}), vocabulary {info['vocab_size']}")
    if info["missing"]:
        print(f"missing splits: {', '.join(info['missing'])} (train with --protocol mini)")
    _print_json_or_table([{"split": k, **v} for k, v in info["splits"].items()], False)
    for split, entry in info["files"].items():
        print(f"{split} file {entry['path']}: checksum {entry['checksum']}")
    if "expected_perplexity" in info:
        print(
            f"true entropy rate {info['entropy_nats_per_token']:.4f} nats/token: the true "
            f"grammar's perplexity is {info['expected_perplexity']:.3f} in expectation and "
            f"{info['true_test_perplexity']:.3f} on this test split (seed {seed}); compare a "
            "model's test perplexity with the latter"
        )
    return 0


def cmd_data_download(args: argparse.Namespace) -> int:
    from experiments.data.download import download_corpus

    folder = download_corpus(
        args.corpus, args.cache_dir, url=args.url, sha256=args.sha256, splits=args.splits
    )
    print(f"{args.corpus}: verified files in {folder}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from experiments.bench import BENCHMARKS, run
    from experiments.threads import set_threads

    set_threads(args.num_threads)
    names = sorted(BENCHMARKS) if args.name == "all" else [args.name]
    failed = False
    for name in names:
        records = run(name)
        failed |= any(record["met"] is False for record in records)
        _print_json_or_table(records, args.json)
    return 1 if failed and args.strict else 0


def cmd_models(args: argparse.Namespace) -> int:
    from experiments.models import model_keys, model_keys_markdown

    if args.json:
        print(json.dumps(model_keys(), default=str))
    else:
        print(model_keys_markdown(), end="")
    return 0


class HelpFormatter(KeepExamples, argparse.ArgumentDefaultsHelpFormatter):
    """Appends each option's default to its help line; an option whose default is None
    says in its help what happens without it (e.g. "default: the config's"); a
    subcommand's examples keep their lines."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """The parser of ``odelm`` and of every subcommand (defaults shown in ``--help``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from experiments.bench import BENCHMARKS
    from odelm import __version__

    parser = Parser(
        prog="odelm",
        description="Continuous-depth language models: data, training, evaluation, generation, "
        "comparison grids and benchmarks (also `python -m experiments`).",
    )
    parser.add_argument("--version", action="version", version=f"odelm {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    data = commands.add_parser("data", help="corpora: inspect and download").add_subparsers(
        dest="data_command", required=True
    )
    info = data.add_parser("info", help="splits, words, tokens, vocabulary, checksums")
    info.add_argument("--corpus", required=True, choices=CORPUS_NAMES, help="the corpus")
    info.add_argument(
        "--data-dir",
        help="folder holding the corpus (default: $ODELM_DATA_DIR, then the download cache)",
    )
    info.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help="describe the splits a run would use under it (default: the files as found)",
    )
    info.add_argument("--seed", type=int, default=0, help="seed of the grammar corpus")
    info.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    info.set_defaults(func=cmd_data_info)
    download = data.add_parser("download", help="fetch and verify a corpus archive")
    download.add_argument("--corpus", required=True, choices=list(SPECS), help="the corpus")
    download.add_argument(
        "--cache-dir", default=str(DEFAULT_CACHE_DIR), help="where the files are stored"
    )
    download.add_argument(
        "--url", help="override the archive URL, e.g. a mirror (default: the published one)"
    )
    download.add_argument(
        "--sha256",
        help="expected SHA-256 of the archive at --url (default: the published one, if any)",
    )
    download.add_argument(
        "--splits",
        nargs="+",
        choices=SPLITS,
        default=list(SPLITS),
        help="split files to extract (valid test: what --protocol mini needs)",
    )
    download.set_defaults(func=cmd_data_download)

    bench = commands.add_parser("bench", help="run a registered benchmark ('all' for every one)")
    bench.add_argument("name", help=f"the benchmark: all, {', '.join(sorted(BENCHMARKS))}")
    bench.add_argument("--json", action="store_true", help="one JSON object per line")
    bench.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    bench.add_argument(
        "--num-threads",
        type=positive_int,
        help="torch CPU threads (default: the free cores, printed)",
    )
    bench.set_defaults(func=cmd_bench)

    models = commands.add_parser("models", help="every model: key of each family, with defaults")
    models.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    models.set_defaults(func=cmd_models)

    for register in REGISTRARS:
        register(commands)
    for name, subcommand in commands.choices.items():
        subcommand.epilog = epilog(name)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A user error (:class:`OdelmError`) prints one line and returns 2;
    ``--debug`` shows its traceback. Anything else is a bug and keeps its traceback."""
    parser = build_parser()
    # train and compare hand their options to jsonargparse (--section.key for every key)
    args, args.options = parser.parse_known_args(argv)
    if args.options and not getattr(args, "options_parser", False):
        parser.error(f"unrecognized arguments: {' '.join(args.options)}")
    try:
        return args.func(args)
    except OdelmError as error:
        if args.debug:
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        if isinstance(error, OSError) and error.strerror:
            message = error.strerror
        print(f"odelm: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
