"""The harness's data benchmark: how fast the shared data path is (``corpus-load``)."""

from __future__ import annotations

from typing import Any

from experiments.data.corpora import load_corpus
from experiments.data.tokenization import LMData, WordTokenizer, encode_corpus
from odelm.timing import seconds


def corpus_load() -> list[dict[str, Any]]:
    """Tokens per second to generate, tokenize and encode the embedded grammar corpus."""
    loaded: list[LMData] = []

    def load() -> None:
        corpus = load_corpus("grammar")
        loaded.append(encode_corpus(corpus, WordTokenizer.from_corpus(corpus)))

    elapsed = seconds(load)
    tokens = sum(split.ids.numel() for split in loaded[0].splits.values())
    return [
        {
            "bench": "corpus-load",
            "metric": "tokens_per_second",
            "value": tokens / elapsed,
            "target": 5e4,
            "unit": "tokens/s",
            "better": "higher",
            "tokens": tokens,
        }
    ]
