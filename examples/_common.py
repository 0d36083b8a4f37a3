"""What the three examples share: tiny-size command-line options and the train/test loop.

Not a library module: the examples import it as ``from _common import ...`` (their folder
is on ``sys.path`` when run as ``python examples/NAME.py``).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import lightning as L

from experiments.training.config import OptimConfig
from experiments.training.datamodule import LMDataModule
from experiments.training.task import LMTask


def parser(description: str) -> argparse.ArgumentParser:
    """The options every example takes; defaults train for a few minutes on a CPU."""
    options = argparse.ArgumentParser(description=description)
    options.add_argument("--corpus", default="grammar", help="grammar, ptb or wikitext2")
    options.add_argument("--data-dir", default=None, help="folder of the corpus files")
    options.add_argument("--max-steps", type=int, default=500, help="training steps")
    options.add_argument("--batch-size", type=int, default=16)
    options.add_argument("--bptt", type=int, default=35, help="tokens per training window")
    options.add_argument("--lr", type=float, default=1e-3)
    options.add_argument("--val-batches", type=int, default=20, help="validation batches")
    options.add_argument("--seed", type=int, default=0)
    return options


def data_module(args: argparse.Namespace, **options: Any) -> LMDataModule:
    """The corpus of ``--corpus``, tokenized and batched; ``options`` are further
    ``data:`` keys (``tokenizer``, ``tokenizer_dir``, ...)."""
    return LMDataModule.from_corpus(
        args.corpus,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        bptt=args.bptt,
        val_batches=args.val_batches,
        seed=args.seed,
        **options,
    )


def train_and_test(model: Any, data: LMDataModule, args: argparse.Namespace) -> float:
    """Train ``model`` with a plain ``lightning.Trainer``, print and return its test perplexity."""
    task = LMTask(model, OptimConfig(lr=args.lr))
    trainer = L.Trainer(
        max_steps=args.max_steps,
        val_check_interval=min(args.max_steps, 100),  # steps, across epochs:
        check_val_every_n_epoch=None,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(task, datamodule=data)
    (result,) = trainer.test(task, datamodule=data, verbose=False)
    perplexity = float(result["test/ppl"])
    print(f"parameters: {model.num_parameters():,}")
    print(f"test perplexity: {perplexity:.2f}")
    if not math.isfinite(perplexity):
        raise SystemExit("the test perplexity is not finite: lower --lr")
    return perplexity
