"""Harness benchmarks: how fast the shared data path is."""

from __future__ import annotations

import time
from typing import Any

from experiments.data.corpora import load_corpus
from experiments.data.tokenization import WordTokenizer, encode_corpus


def corpus_load() -> list[dict[str, Any]]:
    """Tokens per second to generate, tokenize and encode the embedded grammar corpus."""
    started = time.perf_counter()
    corpus = load_corpus("grammar")
    data = encode_corpus(corpus, WordTokenizer.from_corpus(corpus))
    seconds = time.perf_counter() - started
    tokens = sum(split.ids.numel() for split in data.splits.values())
    return [
        {
            "bench": "corpus-load",
            "metric": "tokens_per_second",
            "value": tokens / seconds,
            "target": 5e4,
            "unit": "tokens/s",
            "better": "higher",
            "tokens": tokens,
        }
    ]
