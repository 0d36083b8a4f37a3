"""``odelm bench grammar-stream``: the streamed grammar corpus is never the bottleneck.

The generator draws training batches exactly as a run reads them
(``experiments.training.datamodule.StreamedBatches``: depth-4 grammar, 16 rows of 35
predicted tokens, ids of the run's tokenizer); the model side is one optimizer step per
batch of the fastest model such a run trains, a one-layer ODE Transformer of width 32
(forward, loss, backward, AdamW), on the same batches and thread count. The two are timed
alternating in one process (``odelm.timing``); the record is the ratio of their tokens per
second, which must be at least 10.
"""

from __future__ import annotations

from typing import Any

import torch

from experiments.data.batching import lm_nll
from experiments.models.build import build_model
from experiments.training.config import DataConfig
from experiments.training.datamodule import StreamedBatches, load_data
from experiments.training.speed import bench_threads
from odelm.contract import call_model
from odelm.timing import alternating, medians

TINY = {
    "family": "ode_transformer",
    "preset": "small",
    "n_layers": 1,
    "d_model": 32,
    "d_ff": 64,
    "n_heads": 2,
    "block": "residual",
}
"""The smallest model of the study's kind: the fastest consumer of the stream."""
STEPS = 20


def grammar_stream(short: bool = False) -> list[dict[str, Any]]:
    """Training tokens per second of the stream against those of the tiny model."""
    torch.set_num_threads(bench_threads())
    config = DataConfig(grammar_depth=4, batch_size=16, bptt=35)
    data = load_data(config)
    assert data.stream is not None
    batches = StreamedBatches(data.stream, 0, config)
    steps = STEPS // 2 if short else STEPS
    fixed = [batches[index] for index in range(steps)]
    model = build_model(dict(TINY), data.tokenizer.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def generate() -> None:
        for index in range(steps):
            batches[index]

    def train() -> None:
        for tokens in fixed:
            logits, _ = call_model(model, tokens)
            loss, _ = lm_nll(logits, tokens, reduction="mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    times = medians(alternating({"stream": generate, "model": train}, 3 if short else 5, warmup=1))
    tokens = steps * config.batch_size * config.bptt
    stream, trained = tokens / times["stream"], tokens / times["model"]
    return [
        {
            "bench": "grammar-stream",
            "metric": "stream_over_model_tokens_per_s",
            "value": stream / trained,
            "target": 10.0,
            "unit": "x",
            "better": "higher",
            "stream_tokens_per_s": stream,
            "model_tokens_per_s": trained,
            "threads": torch.get_num_threads(),
        }
    ]
