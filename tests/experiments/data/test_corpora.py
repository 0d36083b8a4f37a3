"""Corpus loading: the standard token counts, protocols, and clear errors on bad input."""

import json

import pytest

from experiments.cli.main import main
from experiments.cli.tools import corpus_info
from experiments.data.corpora import CorpusError, load_corpus
from experiments.data.tokenization import (
    VocabularyMismatchError,
    WordTokenizer,
    check_tokenizer,
    encode_corpus,
)


def test_data_info_reports_the_standard_token_counts(data_dir, capsys):
    assert main(["data", "info", "--corpus", "ptb", "--data-dir", str(data_dir), "--json"]) == 0
    ptb = json.loads(capsys.readouterr().out)
    assert ptb["splits"]["valid"]["tokens"] == 73_760  # 70,390 words + 3,370 <eos>
    assert ptb["splits"]["test"]["tokens"] == 82_430
    assert ptb["missing"] == ["train"]
    assert {f["checksum"] for f in ptb["files"].values()} == {"ok"}
    assert ptb["vocab_size"] == 7_596  # words of the closed 10k vocabulary seen in valid + test
    wt2 = corpus_info("wikitext2", str(data_dir))
    assert wt2["splits"]["valid"]["tokens"] == 217_646
    assert wt2["splits"]["test"]["tokens"] == 245_569


def test_mini_protocol_splits_the_valid_file(data_dir):
    mini = corpus_info("ptb", str(data_dir), "mini")
    assert mini["splits"]["train"]["lines"] == 3033  # the first 90% of 3,370 lines
    assert mini["splits"]["train"]["tokens"] + mini["splits"]["valid"]["tokens"] == 73_760
    assert mini["protocol"].startswith("PTB-mini")


def test_full_protocol_without_train_split_names_files_and_fix(data_dir):
    with pytest.raises(CorpusError) as error:
        load_corpus("ptb", data_dir)
    message = str(error.value)
    assert "ptb.train.txt" in message and str(data_dir) in message and "--protocol mini" in message


def test_unknown_corpus_lists_valid_names():
    with pytest.raises(CorpusError, match="valid: ptb, wikitext2, wikitext2-raw, text, grammar"):
        load_corpus("penn")


def test_text_folder_eos_per_line_and_protocol_recorded(text_corpus_dir):
    corpus = load_corpus("text", text_corpus_dir)
    assert corpus.split("train")[2] == ["<eos>"]  # an empty line still ends with <eos>
    assert corpus.split("train")[3] == ["a", "cat", "ran", "<unk>", "<eos>"]
    mini = load_corpus("text", text_corpus_dir, protocol="mini")
    assert "mini" in mini.protocol
    data = encode_corpus(mini, WordTokenizer.from_corpus(mini))
    assert data.protocol == mini.protocol
    assert data.split("test").num_words == 4


def test_bad_files_give_clear_errors(tmp_path):
    (tmp_path / "train.txt").write_bytes(b"fine line\nbad \xff byte\n")
    (tmp_path / "valid.txt").write_text("")
    (tmp_path / "test.txt").write_text("x\n")
    with pytest.raises(CorpusError, match=r"train.txt is not UTF-8: byte offset 14"):
        load_corpus("text", tmp_path)
    (tmp_path / "train.txt").write_text("ok\n")
    with pytest.raises(CorpusError, match="valid.txt is empty"):
        load_corpus("text", tmp_path)
    (tmp_path / "valid.txt").unlink()
    with pytest.raises(CorpusError, match="lacks valid"):
        load_corpus("text", tmp_path)


def test_vocabulary_is_closed_and_checked(text_corpus_dir):
    corpus = load_corpus("text", text_corpus_dir)
    tokenizer = WordTokenizer.from_corpus(corpus)
    assert tokenizer.id_to_token(0) == "<eos>"
    assert tokenizer.encode_words(["<unk>"]) == [tokenizer.index["<unk>"]]
    with pytest.raises(VocabularyMismatchError, match="'zebra' is not in the vocabulary"):
        tokenizer.encode_words(["zebra"])
    other = WordTokenizer(["<eos>", "x"])
    with pytest.raises(VocabularyMismatchError, match="trained with tokenizer"):
        check_tokenizer(other.fingerprint(), tokenizer)
