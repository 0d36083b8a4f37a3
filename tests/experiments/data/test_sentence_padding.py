"""Leak-free sentence evaluation: no causal model learns a sentence's length from padding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from experiments.data.corpora import load_corpus
from experiments.data.tokenization import WordTokenizer, encode_corpus
from experiments.training.metrics import EvalSettings, perplexity
from neuralode_lm import CausalODEHead, build_model
from odelm.contract import PaddingSideError

GPT2_TINY = {"n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 32}
SETTINGS = [(1, "right"), (16, "right"), (1, "left"), (16, "left")]


@pytest.fixture(scope="module")
def grammar_data():
    corpus = load_corpus("grammar")
    data = encode_corpus(corpus, WordTokenizer.from_corpus(corpus))
    valid = data.split("valid")
    valid.sentences = valid.sentences[:96]  # keep batch-1 evaluation quick
    return data


def _ppls(model, data, settings) -> list[float]:
    model.eval()
    return [
        perplexity(
            model,
            data,
            "valid",
            EvalSettings(batching="sentences", eval_batch_size=b, padding_side=side),
        )["ppl"]
        for b, side in settings
    ]


@pytest.mark.slow
def test_gpt2_sentence_perplexity_ignores_batch_size_and_padding_side(grammar_data):
    torch.manual_seed(0)
    model = build_model("gpt2", grammar_data.tokenizer.vocab_size, config=GPT2_TINY)
    ppls = _ppls(model, grammar_data, SETTINGS)
    assert ppls == pytest.approx([ppls[0]] * 4, rel=1e-5)


@pytest.mark.slow
def test_augmented_ode_gpt2_is_invariant_within_tolerance_and_exactly_per_position(grammar_data):
    valid = dataclasses.replace(grammar_data.split("valid"))
    valid.sentences = valid.sentences[:32]  # a solve per sentence at batch 1: fewer
    grammar_data = dataclasses.replace(grammar_data, splits={"valid": valid})
    torch.manual_seed(0)
    options = {"config": GPT2_TINY, "solver": {"rtol": 1e-3, "atol": 1e-4}}
    shared = build_model("aug-ode-gpt2", grammar_data.tokenizer.vocab_size, **options)
    ppls = _ppls(shared, grammar_data, SETTINGS)
    assert ppls == pytest.approx([ppls[0]] * 4, rel=1e-3)  # the solver's tolerance
    exact = build_model(
        "aug-ode-gpt2", grammar_data.tokenizer.vocab_size, exact_causal_eval=True, **options
    )
    exact.load_state_dict(shared.state_dict())
    ppls = _ppls(exact, grammar_data, SETTINGS)
    assert ppls == pytest.approx([ppls[0]] * 4, rel=1e-5)


@pytest.mark.slow
def test_lstm_is_invariant_with_right_padding_and_refuses_left(grammar_data):
    torch.manual_seed(0)
    model = build_model("lstm", grammar_data.tokenizer.vocab_size, embed_dim=16, hidden_dim=16)
    ppls = _ppls(model, grammar_data, SETTINGS[:2])
    assert ppls == pytest.approx([ppls[0]] * 2, rel=1e-5)
    with pytest.raises(PaddingSideError, match="padding_side: right"):
        _ppls(model, grammar_data, [(16, "left")])


def test_first_token_augmentation_reads_the_first_real_token():
    torch.manual_seed(0)
    head = CausalODEHead(
        4, 7, augment_dim=4, augment_init="first", solver={"method": "rk4", "step_size": 0.25}
    )
    hidden = torch.randn(1, 3, 4)
    padded = torch.cat([torch.randn(1, 2, 4), hidden], dim=1)  # two pad states first
    mask = torch.tensor([[False, False, True, True, True]])
    with torch.no_grad():
        alone, _ = head(hidden)
        left, _ = head(padded, mask)
    assert torch.allclose(left[:, 2:], alone, atol=1e-6)
