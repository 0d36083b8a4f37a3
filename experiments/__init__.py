"""The shared harness: corpora, tokenization, training, evaluation, comparison, plots.

``experiments.load_run(run_dir)`` loads a trained run for use from Python (see
[`experiments.evaluation.trained`][experiments.evaluation.trained]); it is imported on first use so
that ``import experiments`` stays light for the command line.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_run"]


def __getattr__(name: str) -> Any:
    if name == "load_run":
        from experiments.evaluation.trained import load_run

        return load_run
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")
