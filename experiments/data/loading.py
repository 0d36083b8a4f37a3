"""A config's data section to encoded data: ``load_corpus`` -> ``build_tokenizer`` -> ``encode_corpus``."""

from __future__ import annotations

from experiments.data.corpora import load_corpus
from experiments.data.tokenization import LMData, build_tokenizer, encode_corpus
from experiments.training.config import DataConfig


def load_data(config: DataConfig) -> LMData:
    """Load, tokenize and encode a data section's corpus (what ``odelm train`` does)."""
    corpus = load_corpus(
        config.corpus,
        config.data_dir,
        protocol=config.protocol,
        seed=config.seed,
        download=config.download,
        verify_checksums=config.verify_checksums,
    )
    tokenizer = build_tokenizer(
        corpus,
        config.tokenizer,
        bpe_vocab_size=config.bpe_vocab_size,
        tokenizer_dir=config.tokenizer_dir,
    )
    return encode_corpus(corpus, tokenizer)
