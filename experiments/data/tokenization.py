"""Tokenizers and the encoded corpus every model trains on.

A tokenizer turns one corpus line (words, ending with ``<eos>``) into ids. The word-level
tokenizer maps each word to its id in a closed vocabulary; the byte-level BPE tokenizer
(``experiments.data.bpe``) splits words into sub-words. Either way the encoded corpus keeps
the number of *words* per split (words plus one ``<eos>`` per line), so sub-word models can
report per-word perplexity beside word-level models.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from experiments.data.bpe import BPETokenizer
from experiments.data.corpora import EOS, Corpus, CorpusError
from experiments.data.grammar_family import GrammarStream
from odelm import files
from odelm.errors import OdelmError


class SplitNotFoundError(OdelmError, KeyError):
    """The data has no split of the name asked for."""


class VocabularyMismatchError(OdelmError, ValueError):
    """A checkpoint was built for another vocabulary or tokenizer."""


class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    eos_id: int

    def encode_words(self, words: list[str]) -> list[int]: ...

    def id_to_token(self, index: int) -> str: ...

    def fingerprint(self) -> str: ...


class WordTokenizer:
    """A closed word vocabulary: ``<eos>`` is id 0, then words by descending frequency."""

    kind = "word"

    def __init__(self, tokens: list[str]) -> None:
        if not tokens or tokens[0] != EOS or len(set(tokens)) != len(tokens):
            raise ValueError("vocabulary must start with <eos> and hold each token once")
        self.tokens = tokens
        self.index = {token: i for i, token in enumerate(tokens)}
        self.eos_id = 0
        self.vocab_size = len(tokens)

    @classmethod
    def from_corpus(cls, corpus: Corpus) -> WordTokenizer:
        """Closed vocabulary from every split present, so no test word becomes ``<unk>``."""
        # A streamed corpus's every word, even one its fixed splits happen to lack.
        counts = {word: 0 for word in corpus.stream.words} if corpus.stream else {}
        for lines in corpus.lines.values():
            for line in lines:
                for word in line:
                    counts[word] = counts.get(word, 0) + 1
        counts.pop(EOS, None)
        return cls([EOS, *sorted(counts, key=lambda word: (-counts[word], word))])

    def encode_words(self, words: list[str]) -> list[int]:
        try:
            return [self.index[word] for word in words]
        except KeyError as error:
            raise VocabularyMismatchError(
                f"word {error.args[0]!r} is not in the vocabulary of {self.vocab_size} tokens "
                "(the vocabulary is closed: build it from every split you will encode)"
            ) from None

    def id_to_token(self, index: int) -> str:
        return self.tokens[index]

    def fingerprint(self) -> str:
        return "word:" + hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> None:
        files.write_text(path, json.dumps({"kind": self.kind, "tokens": self.tokens}))

    @classmethod
    def load(cls, path: str | Path) -> WordTokenizer:
        return cls(json.loads(Path(path).read_text())["tokens"])


@dataclass
class EncodedSplit:
    """One split as a token stream, as sentences, and its word count."""

    ids: torch.Tensor  # 1-D LongTensor: the whole split, lines concatenated
    sentences: list[list[int]]  # one list of ids per line, each ending with eos
    num_words: int  # words + one <eos> per line


@dataclass(frozen=True)
class EncodedStream:
    """A generated training stream and the tokenizer id of each of its words."""

    source: GrammarStream
    ids: torch.Tensor  # ids[w]: the tokenizer id of the grammar's word w (<eos> first)

    def batch(
        self, run_seed: int, index: int, rows: int, length: int, *, sentences: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Training batch ``index`` of run seed ``run_seed`` (``GrammarStream.batch``)."""
        return self.source.batch(run_seed, index, rows, length, self.ids, sentences=sentences)


@dataclass
class LMData:
    """A corpus encoded by one tokenizer: what training, evaluation and comparison share.

    ``reference_nll``: the true grammar's exact total NLL of a split (generated corpora);
    ``stream``: the training data of a streamed corpus, which then has no ``train`` split."""

    corpus_name: str
    protocol: str
    tokenizer: Tokenizer
    splits: dict[str, EncodedSplit]
    reference_nll: dict[str, float] = field(default_factory=dict)
    stream: EncodedStream | None = None

    def split(self, name: str) -> EncodedSplit:
        if name not in self.splits:
            raise SplitNotFoundError(f"no split {name!r}; have {', '.join(self.splits)}")
        return self.splits[name]


def encode_corpus(corpus: Corpus, tokenizer: Tokenizer) -> LMData:
    """Encode every split of ``corpus`` with ``tokenizer``."""
    splits = {}
    for name, lines in corpus.lines.items():
        sentences = [tokenizer.encode_words(line) for line in lines]
        ids = torch.tensor([i for sentence in sentences for i in sentence], dtype=torch.long)
        splits[name] = EncodedSplit(ids, sentences, sum(len(line) for line in lines))
    stream = None
    if corpus.stream is not None:
        ids = torch.tensor(tokenizer.encode_words(list(corpus.stream.words)), dtype=torch.long)
        stream = EncodedStream(corpus.stream, ids)
    return LMData(corpus.name, corpus.protocol, tokenizer, splits, corpus.reference_nll, stream)


def check_tokenizer(expected_fingerprint: str, tokenizer: Tokenizer) -> None:
    """Refuse to pair a checkpoint with data encoded by a different tokenizer."""
    actual = tokenizer.fingerprint()
    if actual != expected_fingerprint:
        raise VocabularyMismatchError(
            f"the checkpoint was trained with tokenizer {expected_fingerprint}, but the data "
            f"is encoded with {actual} ({tokenizer.vocab_size} tokens); evaluate it on the "
            "corpus, protocol and tokenizer it was trained with"
        )


class SubwordTokenizer:
    """Byte-level BPE (``experiments.data.bpe``) behind the word tokenizer's interface."""

    kind = "bpe"

    def __init__(self, bpe: BPETokenizer) -> None:
        self.bpe = bpe
        self.vocab_size = bpe.vocab_size
        self.eos_id = bpe.eos_id

    def encode_words(self, words: list[str]) -> list[int]:
        ends = bool(words) and words[-1] == EOS
        body = words[:-1] if ends else words
        return self.bpe.encode_line(" ".join(body)) + ([self.eos_id] if ends else [])

    def id_to_token(self, index: int) -> str:
        return self.bpe.id_to_token(index)

    def fingerprint(self) -> str:
        vocab = "\n".join(self.bpe.id_to_token(i) for i in range(self.vocab_size))
        return "bpe:" + hashlib.sha256(vocab.encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> None:
        self.bpe.save(path)


def load_tokenizer(path: str | Path) -> WordTokenizer | SubwordTokenizer:
    """A tokenizer written by ``save``: a word vocabulary file or a BPE directory."""
    path = Path(path)
    if path.is_dir():
        return SubwordTokenizer(BPETokenizer.from_directory(path))
    if not path.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {path}; a run keeps its tokenizer in RUN/tokenizer"
        )
    return WordTokenizer.load(path)


def build_tokenizer(
    corpus: Corpus, kind: str, *, bpe_vocab_size: int = 4000, tokenizer_dir: str | None = None
) -> WordTokenizer | SubwordTokenizer:
    """A word vocabulary, or BPE trained on the train split (or loaded from a GPT-2 dir)."""
    if kind == "word":
        return WordTokenizer.from_corpus(corpus)
    if corpus.stream is not None:
        raise CorpusError("the grammar family is word-level: set data.tokenizer: word")
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer {kind!r}; valid: word, bpe")
    if tokenizer_dir:
        return SubwordTokenizer(BPETokenizer.from_directory(tokenizer_dir))
    lines = (" ".join(line[:-1]) for line in corpus.split("train"))
    return SubwordTokenizer(BPETokenizer.train(lines, bpe_vocab_size))
