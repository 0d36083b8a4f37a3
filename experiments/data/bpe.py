"""Byte-level BPE (GPT-2 style) over pre-tokenized corpus lines, through ``tokenizers``.

Corpus lines are words separated by spaces. Every word is encoded with a leading space
(``" word"``, GPT-2's ``Ġword``), so a word maps to the same tokens wherever it stands in a
line; special tokens that occur as whole words (the corpus's ``<unk>``) map to their single
id. ``decode`` inverts this: ``decode(encode_line(line)) == " ".join(line.split())``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from odelm import files
from odelm.errors import OdelmError


class TokenizerDirError(OdelmError, FileNotFoundError):
    """A tokenizer directory holds no GPT-2 tokenizer."""


GPT2_EOS = "<|endoftext|>"


class BPETokenizer:
    """A byte-level BPE tokenizer with an end-of-sentence and an unknown-word token."""

    def __init__(self, tokenizer: Tokenizer, eos_token: str, unk_token: str) -> None:
        for token in (eos_token, unk_token):
            if tokenizer.token_to_id(token) is None:
                raise ValueError(f"special token {token!r} is not in the tokenizer's vocabulary")
        self._tok = tokenizer
        self.eos_token, self.unk_token = eos_token, unk_token
        self._special = {
            t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        }
        self._special.update({eos_token: self.eos_id, unk_token: self.unk_id})
        self._special_ids = {i: t for t, i in self._special.items()}

    @classmethod
    def train(
        cls,
        lines: Iterable[str],
        vocab_size: int,
        special_tokens: Sequence[str] = ("<eos>", "<unk>"),
    ) -> BPETokenizer:
        """Learn merges from ``lines`` offline; deterministic for the same lines and size.

        ``special_tokens[0]`` is the end-of-sentence token, ``special_tokens[1]`` the
        unknown-word token; all of them get the first ids and are never split.
        """
        specials = list(special_tokens)
        if len(specials) < 2 or len(set(specials)) != len(specials):
            raise ValueError(f"need distinct (eos, unk, ...) special tokens, got {specials}")
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + len(specials):
            raise ValueError(
                f"vocab_size={vocab_size} is below the {len(alphabet)} byte symbols plus "
                f"{len(specials)} special tokens; use at least {len(alphabet) + len(specials)}"
            )
        tokenizer = _byte_level(Tokenizer(models.BPE()))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=alphabet,
            show_progress=False,
        )
        skip = set(specials)
        # Train on exactly what encode_line feeds the model: " w1 w2 ..." without specials.
        words = (" " + " ".join(w for w in line.split() if w not in skip) for line in lines)
        tokenizer.train_from_iterator(words, trainer)
        return cls(tokenizer, specials[0], specials[1])

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> BPETokenizer:
        """Load a local GPT-2 tokenizer dir: ``tokenizer.json``, or ``vocab.json`` + ``merges.txt``.

        The end-of-sentence token is ``<eos>`` when the vocabulary has it, else GPT-2's
        ``<|endoftext|>``; ``<unk>`` is added as a new special token when missing (a pretrained
        model's embedding matrix then needs ``vocab_size`` rows).
        """
        path = Path(path)
        if (path / "tokenizer.json").is_file():
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        elif (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            bpe = models.BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt"))
            tokenizer = _byte_level(Tokenizer(bpe))
        else:
            present = sorted(p.name for p in path.iterdir()) if path.is_dir() else "not a directory"
            missing = [n for n in ("vocab.json", "merges.txt") if not (path / n).is_file()]
            raise TokenizerDirError(
                f"{path} holds no GPT-2 tokenizer: expected tokenizer.json, or vocab.json and "
                f"merges.txt (missing tokenizer.json and {', '.join(missing)}; found: {present})"
            )
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        eos = "<eos>" if "<eos>" in vocab or GPT2_EOS not in vocab else GPT2_EOS
        tokenizer.add_special_tokens([eos, "<unk>"])  # keeps the ids of tokens already present
        return cls(tokenizer, eos, "<unk>")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``tokenizer.json`` into directory ``path`` (created if needed; refused if it is
        a link out of its parent folder, ``odelm.files.make_dir``)."""
        files.make_dir(path)
        with files.atomic_write(Path(path) / "tokenizer.json") as partial:
            self._tok.save(str(partial))

    def encode_line(self, line: str) -> list[int]:
        """Token ids of one pre-tokenized line, without a trailing end-of-sentence id."""
        ids: list[int] = []
        run: list[str] = []
        for word in line.split():
            if word in self._special:
                ids.extend(self._encode_words(run))
                run = []
                ids.append(self._special[word])
            else:
                run.append(" " + word)
        ids.extend(self._encode_words(run))
        return ids

    def _encode_words(self, words: list[str]) -> list[int]:
        if not words:
            return []
        return self._tok.encode(words, is_pretokenized=True, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: words separated by single spaces, special tokens written out."""
        pieces: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i in self._special_ids:
                pieces.append(self._tok.decode(run, skip_special_tokens=False))
                pieces.append(" " + self._special_ids[i])
                run = []
            else:
                run.append(i)
        pieces.append(self._tok.decode(run, skip_special_tokens=False))
        return "".join(pieces).removeprefix(" ")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        return self._tok.token_to_id(self.eos_token)

    @property
    def unk_id(self) -> int:
        return self._tok.token_to_id(self.unk_token)

    def id_to_token(self, i: int) -> str:
        """The vocabulary entry of id ``i`` (byte-level form, e.g. ``Ġthe``)."""
        token = self._tok.id_to_token(int(i))
        if token is None:
            raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return token


def _byte_level(tokenizer: Tokenizer) -> Tokenizer:
    """GPT-2's byte-level pre-tokenizer and decoder; spaces come from the caller."""
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer
