"""Batching covers every token once; evaluate() matches hand-computed perplexities."""

import math

import pytest
import torch

from experiments.data.batching import (
    evaluation_windows,
    lm_nll,
    sentence_batch,
    stream_windows,
)
from experiments.data.corpora import load_corpus
from experiments.data.tokenization import WordTokenizer, encode_corpus
from experiments.reference import BigramLM
from experiments.training.metrics import (
    EvalSettings,
    NonCausalModelError,
    evaluate,
    perplexity,
)


def test_stream_windows_predict_each_token_once():
    ids = torch.arange(103)
    windows = stream_windows(ids, batch_size=4, bptt=7)
    assert [w.shape[1] for w in windows] == [8, 8, 8, 4]  # rows of 25 tokens: 24 targets
    targets = torch.cat([w[:, 1:] for w in windows], dim=1)
    rows = ids[:100].view(4, 25)
    assert torch.equal(targets, rows[:, 1:])


def test_evaluation_windows_cover_the_split_exactly():
    ids = torch.arange(1, 24)
    windows = evaluation_windows(ids, eos_id=0, length=5)
    predicted = torch.cat([w[1:] for w in windows])
    assert torch.equal(predicted, ids)
    assert windows[0][0] == 0


def test_sentence_batches_pad_left_and_right_with_masks():
    tokens, mask = sentence_batch([[5, 6, 0], [7, 0]], pad_id=9, bos_id=0, side="left")
    assert tokens.tolist() == [[0, 5, 6, 0], [9, 0, 7, 0]]
    assert mask.tolist() == [[True] * 4, [False, True, True, True]]
    tokens, mask = sentence_batch([[5, 6, 0], [7, 0]], pad_id=9, bos_id=0, side="right")
    assert tokens.tolist() == [[0, 5, 6, 0], [0, 7, 0, 9]]
    logits = torch.zeros(2, 4, 10)
    nll, count = lm_nll(logits, tokens, mask)
    assert count == 5 and nll.item() == pytest.approx(5 * math.log(10))


@pytest.fixture
def grammar_data():
    corpus = load_corpus("grammar")
    return encode_corpus(corpus, WordTokenizer.from_corpus(corpus))


def test_bigram_perplexity_equals_hand_computation(grammar_data):
    train, test = grammar_data.split("train").ids, grammar_data.split("test").ids
    vocab = grammar_data.tokenizer.vocab_size
    model = BigramLM.from_counts(train, vocab)
    stream = torch.cat([torch.tensor([grammar_data.tokenizer.eos_id]), test])
    table = model.table.weight.double().log_softmax(-1)
    expected = math.exp(-table[stream[:-1], stream[1:]].mean().item())
    result = perplexity(
        model, grammar_data, "test", EvalSettings(eval_window=50, eval_batch_size=7)
    )
    assert result["tokens"] == test.numel() == result["words"]
    assert result["ppl"] == pytest.approx(expected, rel=1e-5)
    assert result["ppl_per_word"] == pytest.approx(expected, rel=1e-5)


def test_evaluate_reports_everything_and_refuses_noncausal(grammar_data):
    model = BigramLM.from_counts(grammar_data.split("train").ids, grammar_data.tokenizer.vocab_size)
    result = evaluate(model, grammar_data, "test", settings=EvalSettings(bleu_sentences=50))
    assert {"ppl", "ppl_per_word", "bleu_tf", "bleu_cont", "tokens", "seconds", "protocol"} <= set(
        result
    )
    assert 0.0 < result["bleu_tf"] < 1.0
    assert result["protocol"].startswith("grammar")
    model.is_causal = False
    with pytest.raises(NonCausalModelError, match="allow_noncausal"):
        evaluate(model, grammar_data, "test")
    labelled = evaluate(
        model, grammar_data, "test", settings=EvalSettings(bleu_sentences=0), allow_noncausal=True
    )
    assert "not a valid language-model perplexity" in labelled["ppl_label"]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.slow
def test_sentence_mode_equals_stream_mode_for_a_bigram(grammar_data, side):
    # A bigram sees only the previous token, and every sentence in the stream follows an
    # <eos>, so scoring padded sentences must give exactly the stream's total NLL.
    model = BigramLM.from_counts(grammar_data.split("train").ids, grammar_data.tokenizer.vocab_size)
    stream = perplexity(
        model, grammar_data, "valid", EvalSettings(batching="stream", eval_window=40)
    )
    sentences = perplexity(
        model, grammar_data, "valid", EvalSettings(batching="sentences", padding_side=side)
    )
    assert sentences["tokens"] == stream["tokens"]
    assert sentences["nll"] == pytest.approx(stream["nll"], rel=1e-6)
