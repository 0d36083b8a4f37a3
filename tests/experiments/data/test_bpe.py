"""Byte-level BPE: lossless round trip on real PTB lines, <unk> kept whole, determinism, I/O."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import pre_tokenizers

from experiments.data.bpe import BPETokenizer

TOY = [" the cat sat on the mat ", " the dog sat on the <unk> ", " a cat and a dog "] * 20


@pytest.fixture(scope="module")
def ptb_lines(data_dir: Path) -> list[str]:
    return (data_dir / "ptb" / "ptb.valid.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def ptb_bpe(ptb_lines) -> BPETokenizer:
    return BPETokenizer.train(ptb_lines, vocab_size=1000)


def test_round_trip_on_real_ptb_lines(ptb_lines, ptb_bpe):
    assert ptb_bpe.vocab_size == 1000
    total_words = total_tokens = 0
    for line in ptb_lines:
        ids = ptb_bpe.encode_line(line)
        assert ptb_bpe.decode(ids) == " ".join(line.split())
        assert ptb_bpe.eos_id not in ids
        total_words += len(line.split())
        total_tokens += len(ids)
    # Merges learned: fewer tokens than bytes, at least one per word.
    assert total_words <= total_tokens < 2 * total_words


def test_unk_is_one_special_token(ptb_lines, ptb_bpe):
    unk = ptb_bpe.unk_id
    assert ptb_bpe.id_to_token(unk) == "<unk>"
    assert ptb_bpe.encode_line("<unk>") == [unk]
    a, b = ptb_bpe.encode_line("the"), ptb_bpe.encode_line("company")
    assert ptb_bpe.encode_line("the <unk> company") == [*a, unk, *b]
    n_unk = sum(line.split().count("<unk>") for line in ptb_lines)
    n_ids = sum(ptb_bpe.encode_line(line).count(unk) for line in ptb_lines)
    assert n_unk > 1000 and n_ids == n_unk
    # No byte-level token of any line spells a piece of "<unk>".
    pieces = {ptb_bpe.id_to_token(i) for line in ptb_lines[:300] for i in ptb_bpe.encode_line(line)}
    assert not any("<" in p or ">" in p for p in pieces - {"<unk>"})


def test_training_is_deterministic(ptb_lines, ptb_bpe):
    again = BPETokenizer.train(ptb_lines, vocab_size=1000)
    for line in ptb_lines[:500]:
        assert again.encode_line(line) == ptb_bpe.encode_line(line)
    assert [again.id_to_token(i) for i in range(1000)] == [
        ptb_bpe.id_to_token(i) for i in range(1000)
    ]


def test_save_and_from_directory_round_trip(tmp_path):
    bpe = BPETokenizer.train(TOY, vocab_size=300)
    assert (bpe.eos_id, bpe.unk_id) == (0, 1)
    bpe.save(tmp_path / "tok")
    loaded = BPETokenizer.from_directory(tmp_path / "tok")
    assert (loaded.vocab_size, loaded.eos_id, loaded.unk_id) == (bpe.vocab_size, 0, 1)
    unicode = " Fédération – naïve 東京 @-@ <unk> café "  # bytes never seen in training
    for line in [*TOY[:3], unicode]:
        assert loaded.encode_line(line) == bpe.encode_line(line)
        assert loaded.decode(bpe.encode_line(line)) == " ".join(line.split())


def _gpt2_style_dir(path: Path) -> dict[str, int]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("c", "a")]
    tokens = alphabet + [a + b for a, b in merges] + ["<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return vocab


def test_gpt2_vocab_and_merges_directory_loads(tmp_path):
    vocab = _gpt2_style_dir(tmp_path / "gpt2")
    bpe = BPETokenizer.from_directory(tmp_path / "gpt2")
    assert bpe.eos_id == vocab["<|endoftext|>"]
    assert bpe.unk_id == len(vocab) and bpe.vocab_size == len(vocab) + 1  # <unk> appended
    ids = bpe.encode_line("the cat <unk> the")
    assert [bpe.id_to_token(i) for i in ids] == ["Ġthe", "Ġ", "ca", "t", "<unk>", "Ġthe"]
    assert bpe.decode(ids) == "the cat <unk> the"
    assert bpe.decode([*ids, bpe.eos_id]) == "the cat <unk> the <|endoftext|>"


def test_missing_tokenizer_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json.*vocab.json, merges.txt"):
        BPETokenizer.from_directory(tmp_path)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="missing tokenizer.json and merges.txt"):
        BPETokenizer.from_directory(tmp_path)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="at least 258"):
        BPETokenizer.train(TOY, vocab_size=100)
    bpe = BPETokenizer.train(TOY, vocab_size=300)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bpe.decode([bpe.vocab_size])
    with pytest.raises(IndexError):
        bpe.id_to_token(-1 + 10**6)
