"""``odelm bench grammar-stream``: the streamed grammar corpus is never the bottleneck.

The generator draws training batches exactly as a run reads them
(``experiments.training.datamodule.StreamedBatches``: depth-4 grammar, 16 rows of 35
predicted tokens, ids of the run's tokenizer); the model side is one optimizer step per
batch of the fastest model such a run trains, a one-layer ODE Transformer of width 32
(forward, loss, backward, AdamW), on the same batches and thread count. The two are timed
alternating in one process (``odelm.timing``); each record (stream windows, padded
sentences) is the ratio of their predicted tokens per second, which must be at least 10.
"""

from __future__ import annotations

from typing import Any, Literal

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
    """Training tokens per second of the stream against those of the tiny model, for both
    batchings (stream windows; padded sentences, counting real tokens only)."""
    torch.set_num_threads(bench_threads())
    return [_ratio(batching, short) for batching in ("stream", "sentences")]


def _ratio(batching: Literal["stream", "sentences"], short: bool) -> dict[str, Any]:
    config = DataConfig(grammar_depth=4, batch_size=16, bptt=35, batching=batching)
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
        for batch in fixed:
            tokens, mask = batch if isinstance(batch, tuple) else (batch, None)
            logits, _ = call_model(model, tokens, mask)
            loss, _ = lm_nll(logits, tokens, mask, reduction="mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    times = medians(alternating({"stream": generate, "model": train}, 3 if short else 5, warmup=1))
    tokens = sum(_predicted(batch) for batch in fixed)
    stream, trained = tokens / times["stream"], tokens / times["model"]
    return {
        "bench": "grammar-stream",
        "metric": f"{batching}_over_model_tokens_per_s",
        "value": stream / trained,
        "target": 10.0,
        "unit": "x",
        "better": "higher",
        "stream_tokens_per_s": stream,
        "model_tokens_per_s": trained,
        "threads": torch.get_num_threads(),
    }


def _predicted(batch: Any) -> int:
    """The tokens a batch trains on: every one after the first, padding left out."""
    if isinstance(batch, tuple):
        mask = batch[1]
        return int((mask[:, 1:] & mask[:, :-1]).sum())
    return int(batch[:, 1:].numel())
