"""``odelm bench``: the benchmark registry and the subcommand that runs them.

A benchmark is a function ``() -> list[dict]`` (the library's own live in the top-level
``benchmarks`` package); each dict is one measurement with at least ``bench``, ``metric``,
``value``, ``target``, ``unit`` and ``better`` ("lower" or "higher"; how ``value`` compares
with ``target``). The registry maps names to ``"module:function"`` strings, imported only
when run, so ``benchmarks`` (which imports the harness) stays above it. A benchmark
function with an ``out``, ``short`` or ``neighbour`` parameter gets ``--out``, ``--short``
or ``--neighbour``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import sys
from collections.abc import Callable
from typing import Any

from jsonargparse import Namespace

from experiments.cli import values
from experiments.cli.options import Parser
from experiments.cli.tools import print_rows
from odelm.errors import OdelmError

REQUIRED_FIELDS = ("bench", "metric", "value", "target", "unit", "better")

BENCHMARKS: dict[str, str] = {
    "corpus-load": "benchmarks.corpus:corpus_load",
    "grammar-stream": "benchmarks.grammar_stream:grammar_stream",
    "rk-overhead": "benchmarks.rk_blocks:rk_overhead",
    "generate-cache": "benchmarks.rk_blocks:generate_cache",
    "ode-batching": "benchmarks.ode_heads:ode_batching",
    "adjoint-memory": "benchmarks.ode_heads:adjoint_memory",
    "solver-overhead": "benchmarks.ode_heads:solver_overhead",
    "ct-step-overhead": "benchmarks.node_transformer:ct_step_overhead",
    "ct-adjoint-memory": "benchmarks.node_transformer:ct_adjoint_memory",
    "seminorm-saving": "benchmarks.node_transformer:seminorm_saving",
    "precision-speedup": "benchmarks.training_speed:precision_speedup",
    "peak": "benchmarks.training_speed:peak",
    "compile-speedup": "benchmarks.training_speed:compile_speedup",
    "harness-throughput": "benchmarks.harness:harness_throughput",
    "checkpoint-memory": "benchmarks.hf_paths:checkpoint_memory",
    "batch-invariant-cost": "benchmarks.hf_paths:batch_invariant_cost",
    "gpu": "benchmarks.gpu_check:gpu",
    "gpu-packing": "benchmarks.gpu_packing:gpu_packing",
}
NOT_IN_ALL = frozenset({"gpu", "gpu-packing"})
"""Benchmarks ``odelm bench all`` leaves out: the GPU check writes a folder of records and
runs for minutes (``odelm bench gpu --out DIR``); the packing benchmark starts up to 16
training processes on one GPU."""
OPTIONS = ("out", "short", "neighbour")
"""``odelm bench`` options handed to the benchmarks whose functions take them."""


class UnknownBenchmarkError(OdelmError, KeyError):
    """No benchmark is registered under the name asked for."""


def resolve(name: str) -> Callable[[], list[dict[str, Any]]]:
    """Import the function registered as ``name``."""
    if name not in BENCHMARKS:
        raise UnknownBenchmarkError(
            f"unknown benchmark {name!r}; valid: {', '.join(sorted(BENCHMARKS))}"
        )
    module_name, function_name = BENCHMARKS[name].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def judge(record: dict[str, Any]) -> dict[str, Any]:
    """Check a record's fields and add ``met``: whether ``value`` reaches ``target``."""
    missing = [field for field in REQUIRED_FIELDS if field not in record]
    if missing:
        raise ValueError(f"benchmark record {record} lacks fields {missing}")
    if record["better"] not in ("lower", "higher"):
        raise ValueError(f"`better` must be 'lower' or 'higher', got {record['better']!r}")
    value, target = record["value"], record["target"]
    if target is None or value is None or not math.isfinite(value):
        met = None
    elif record["better"] == "lower":
        met = value <= target
    else:
        met = value >= target
    return {**record, "met": met}


def run(name: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run one benchmark and return its judged records; ``options`` (of ``OPTIONS``)
    go to a benchmark function that takes them.

    Whatever the benchmark prints for people (side-by-side tables) goes to stderr, so
    stdout carries only the records.
    """
    function = resolve(name)
    accepted = inspect.signature(function).parameters
    given = {k: v for k, v in (options or {}).items() if k in accepted and v not in (None, False)}
    with contextlib.redirect_stdout(sys.stderr):
        records = function(**given)
    return [judge(record) for record in records]


def bench_parser() -> Parser:
    """The options of ``odelm bench``."""
    parser = Parser()
    parser.add_argument("name", help=f"the benchmark: all, {', '.join(sorted(BENCHMARKS))}")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--out", type=values.folder, help="folder of the records (gpu; default gpu-check)"
    )
    parser.add_argument("--short", action="store_true", help="gpu: every phase on the CPU, tiny")
    parser.add_argument(
        "--neighbour",
        action="store_true",
        help="harness-throughput: also measure beside one single-thread training process",
    )
    parser.add_argument(
        "--num-threads",
        type=values.threads,
        help="torch CPU threads, 1..this machine's CPUs (default: the free cores, printed)",
    )
    return parser


def cmd_bench(args: Namespace) -> int:
    from experiments.training.threads import set_threads

    set_threads(args.num_threads)
    names = sorted(set(BENCHMARKS) - NOT_IN_ALL) if args.name == "all" else [args.name]
    options = {key: args.get(key) for key in OPTIONS}
    failed = False
    for name in names:
        records = run(name, options)
        failed |= any(record["met"] is False for record in records)
        print_rows(records, args.json)
    return 1 if failed and args.strict else 0
