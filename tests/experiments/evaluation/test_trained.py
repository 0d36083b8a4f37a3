"""Self-contained models and runs: save_pretrained / from_pretrained for every model, and
``experiments.load_run`` scoring and continuing text with the corpus moved away."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import experiments
from experiments.data.corpora import CorpusError
from experiments.data.tokenization import VocabularyMismatchError
from experiments.reference import BigramLM, WordLMTransformer
from experiments.training.config import parse_config
from experiments.training.train import train
from neuralode_lm.models import build_model as build_neural_ode
from ode_transformer import ODETransformerLM
from ode_transformer.presets import config_from_preset
from odelm.pretrained import PretrainedError, PretrainedNotFoundError, load_pretrained

TINY_GPT2 = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32}
VOCAB = 30


def every_model() -> dict[str, torch.nn.Module]:
    solver = {"method": "rk4", "step_size": 0.5}
    small = {"embed_dim": 8, "hidden_dim": 8}
    return {
        "lstm": build_neural_ode("lstm", VOCAB, **small),
        "ode-lstm": build_neural_ode("ode-lstm", VOCAB, **small, field_hidden=8, solver=solver),
        "gpt2": build_neural_ode("gpt2", VOCAB, config=TINY_GPT2),
        "ode-gpt2": build_neural_ode("ode-gpt2", VOCAB, config=TINY_GPT2, solver=solver),
        "aug-ode-gpt2": build_neural_ode("aug-ode-gpt2", VOCAB, config=TINY_GPT2, solver=solver),
        "rk2-transformer": ODETransformerLM(
            config_from_preset("small", vocab_size=VOCAB, block="rk2", d_model=16, d_ff=32)
        ),
        "bigram": BigramLM(VOCAB),
        "reference-transformer": WordLMTransformer(VOCAB, d_model=16, d_ff=32, n_layers=1),
        "node-transformer": build_neural_ode(
            "node-transformer",
            VOCAB,
            d_model=16,
            n_heads=2,
            d_ff=32,
            solver={"method": "rk4"},
            steps=2,
        ),
    }


def test_every_registered_model_class_saves_and_loads():
    """A model the harness can build but not save would crash at the end of training."""
    from neuralode_lm.models import MODELS
    from odelm.pretrained import PretrainedMixin

    classes = [*MODELS.values(), ODETransformerLM, BigramLM, WordLMTransformer]
    assert [c.__name__ for c in classes if not issubclass(c, PretrainedMixin)] == []


@pytest.mark.parametrize("name", list(every_model()))
def test_every_model_round_trips_through_save_pretrained(tmp_path, name):
    model = every_model()[name].eval()
    with torch.no_grad():  # move every weight off its initial value
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architecture"].endswith(type(model).__name__)
    loaded = type(model).from_pretrained(tmp_path)
    assert type(loaded) is type(model) and not loaded.training
    tokens = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(tokens)[0], loaded(tokens)[0])
    assert torch.equal(load_pretrained(tmp_path)(tokens)[0], loaded(tokens)[0])


def test_tied_embeddings_stay_tied_after_loading(tmp_path):
    model = ODETransformerLM(config_from_preset("small", vocab_size=VOCAB, d_model=16, d_ff=32))
    assert model.head.weight is model.token_embedding.weight
    model.save_pretrained(tmp_path)
    loaded = ODETransformerLM.from_pretrained(tmp_path)
    assert loaded.head.weight is loaded.token_embedding.weight
    assert torch.equal(loaded.head.weight, model.token_embedding.weight)


def test_loading_names_a_missing_or_foreign_model(tmp_path):
    with pytest.raises(PretrainedNotFoundError, match="save_pretrained"):
        load_pretrained(tmp_path / "nothing")
    BigramLM(VOCAB).save_pretrained(tmp_path)
    with pytest.raises(PretrainedError, match="holds a BigramLM, not a ODETransformerLM"):
        ODETransformerLM.from_pretrained(tmp_path)


RUN_MODELS = {
    "ode_transformer": {
        "family": "ode_transformer",
        "preset": "small",
        "n_layers": 1,
        "d_model": 16,
        "d_ff": 32,
        "n_heads": 2,
        "block": "rk2",
    },
    "neuralode_lm": {
        "family": "neuralode_lm",
        "name": "ode-lstm",
        "embed_dim": 16,
        "hidden_dim": 16,
        "field_hidden": 8,
        "solver": {"method": "rk4", "step_size": 0.5},
    },
    "reference": {"family": "reference", "name": "transformer", "d_model": 16, "d_ff": 32},
}


@pytest.mark.parametrize("family", list(RUN_MODELS))
def test_a_run_loads_scores_and_generates_without_its_corpus(tmp_path, family):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = ["the cat sat on the mat", "a dog sat on the cat", "the dog ran"]
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n")
    config = parse_config(
        {
            "name": family,
            "out_dir": str(tmp_path / "runs"),
            "model": RUN_MODELS[family],
            "data": {"corpus": "text", "data_dir": str(corpus), "batch_size": 2, "bptt": 8},
            "trainer": {"max_steps": 3, "val_every": 3, "progress_bar": False},
            "eval": {"bleu_sentences": 0},
        }
    )
    result = train(config)
    shutil.move(corpus, tmp_path / "moved")

    run = experiments.load_run(tmp_path / "runs" / family)
    # Scoring the test lines again reproduces the run's test perplexity (every token once).
    assert run.perplexity(lines) == pytest.approx(result["test_ppl_per_word"], rel=1e-9)
    assert run.perplexity(["the cat sat"]) > 1.0
    with pytest.raises(VocabularyMismatchError, match="'zebra' is not in this run's closed"):
        run.perplexity(["the zebra sat"])
    text = run.generate("the cat", max_new_tokens=4)
    assert text.startswith("the cat")
    assert len(text.split()) <= 2 + 4
    sampled = [
        run.generate("the cat", 6, strategy="sample", generator=torch.Generator().manual_seed(1))
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]  # a seeded generator reproduces the sample
    with pytest.raises(CorpusError, match="does not exist"):
        run.data()  # evaluating on the corpus still needs the corpus
    assert run.data(data_dir=str(tmp_path / "moved")).split("test").num_words == 18


@pytest.mark.slow  # trains a run and scores its 100k-token test split twice
def test_a_grammar_family_run_is_scored_on_its_own_splits(tmp_path, tiny_config):
    """A run of the grammar family (``data.grammar_depth``) loads the splits of its depth for
    ``odelm eval`` and ``discretize``, not the embedded grammar's: their checksums are the
    ones the run recorded, and scoring them again gives its test NLL."""
    data = {"grammar_depth": 1, "batching": "sentences", "eval_batch_size": 64}
    values = tiny_config(tmp_path, "family", data=data, trainer={"max_steps": 2, "val_every": 2})
    values["eval"] = {"bleu_sentences": 0, "continuation_sentences": 0}
    result = train(parse_config(values))
    run = experiments.load_run(tmp_path / "family")
    scored = run.evaluate()  # refused before: the embedded grammar's splits, other checksums
    assert scored["nll"] == pytest.approx(result["test_nll"], rel=1e-9)
    assert scored["excess_nll_per_token"] == pytest.approx(
        result["test_excess_nll_per_token"], abs=1e-9
    )
