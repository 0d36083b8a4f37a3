"""The examples at the end of every subcommand's ``--help``: commands that run as written
from the repository root (``odelm verdicts`` reads ``docs/results``) once the README's main
job has made ``runs/quick``
(tests/project/test_examples.py runs every one, training ones with a tiny budget)."""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "train": (
        (
            "odelm train --model.family ode_transformer --model.block rk4 --corpus grammar "
            "--trainer.max_time 00:05:00 --name flags-rk4"
        ),
        "odelm train --config experiments/configs/example.yaml",
        "odelm train --config experiments/configs/example.yaml --optim.lr 3e-4 --name auto",
        (
            "odelm train --config experiments/configs/example.yaml --corpus grammar --seed 1 "
            "--model.block rk4 --name example-rk4"
        ),
        (
            "odelm train --config experiments/configs/example.yaml --name example-lstm "
            "--model '{family: neuralode_lm, name: lstm, embed_dim: 64, hidden_dim: 64}'"
        ),
        "odelm train --config experiments/configs/example.yaml --print_config",
    ),
    "compare": (
        "odelm compare --preset quick --out runs/quick",
        "odelm compare --preset table5-seeds --out runs/table5 --corpus ptb --print_config",
    ),
    "eval": (
        "odelm eval runs/quick/runs/rk4",
        "odelm eval runs/quick/runs/rk4 --split valid --json --num-threads 1",
    ),
    "generate": (
        "odelm generate runs/quick/runs/rk4 --prompt 'this dog'",
        "odelm generate runs/quick/runs/rk4 --prompt 'this dog' --strategy sample --top-k 10",
    ),
    "data": (
        "odelm data info --corpus grammar",
        "odelm data info --corpus grammar --protocol mini --json",
    ),
    "models": ("odelm models", "odelm models --json"),
    "bench": ("odelm bench corpus-load", "odelm bench corpus-load --json --num-threads 1"),
    "discretize": (
        "odelm discretize runs/quick/runs/rk4 --max-batches 1 --eval-batch-size 2 --steps 1 2",
    ),
    "verdicts": ("odelm verdicts", "odelm verdicts --json"),
}
"""Each subcommand's examples, shown in its ``--help`` under "examples:"."""


def epilog(command: str) -> str | None:
    """The "examples:" block of a subcommand's help (None for one without examples)."""
    lines = EXAMPLES.get(command)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


class KeepExamples:
    """A help-formatter mixin that prints the "examples:" block line by line, unwrapped,
    so each example can be copied (argparse would join and rewrap its lines)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:\n"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)  # type: ignore[misc]
