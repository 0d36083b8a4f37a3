"""Evaluation and generation solve an adaptive model's batch one sequence at a time by default,
so a sentence scores the same in a padded batch as alone; training's own test evaluation
keeps the shared solve, so a run's recorded test perplexity reproduces with it."""

from __future__ import annotations

import pytest
import torch

import experiments
from experiments.cli.options import eval_parser, generate_parser
from experiments.data.tokenization import EncodedSplit, LMData, WordTokenizer
from experiments.training.config import parse_config
from experiments.training.metrics import EvalSettings, perplexity
from experiments.training.train import train
from neuralode_lm.models import ODELSTM
from odelm.decoding import generate
from odelm.invariance import rows_alone

TOKENIZER = WordTokenizer(["<eos>", *(f"w{i}" for i in range(22))])
SENTENCES = [[3, 4, 5, 6, 7, 8, 0], [9, 10, 0], [11, 12, 13, 14, 0]]
DOPRI5 = {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4}


def _data(sentences: list[list[int]]) -> LMData:
    ids = torch.tensor([i for sentence in sentences for i in sentence])
    split = EncodedSplit(ids, sentences, sum(map(len, sentences)))
    return LMData("text", "given texts", TOKENIZER, {"test": split})


def _model() -> ODELSTM:
    torch.manual_seed(0)
    model = ODELSTM(23, embed_dim=12, hidden_dim=12, field_hidden=8, dropout=0.0, solver=DOPRI5)
    return model.eval()


def _scored_logits(model: ODELSTM, sentences: list[list[int]], **options: bool) -> torch.Tensor:
    """The logits ``perplexity`` computes for ``sentences`` (one right-padded batch)."""
    seen: list[torch.Tensor] = []
    hook = model.register_forward_hook(lambda module, args, output: seen.append(output[0]))
    settings = EvalSettings(batching="sentences", eval_batch_size=len(sentences))
    try:
        perplexity(model, _data(sentences), "test", settings, **options)
    finally:
        hook.remove()
    (logits,) = seen
    return logits


def _largest_gap_to_alone(model: ODELSTM, **options: bool) -> float:
    batched = _scored_logits(model, SENTENCES, **options)
    gaps = []
    for i, sentence in enumerate(SENTENCES):
        alone = _scored_logits(model, [sentence], **options)[0]
        gaps.append(float((batched[i, : alone.shape[0]] - alone).abs().max()))
    return max(gaps)


def test_a_sentence_scores_the_same_in_a_right_padded_batch_as_alone_by_default():
    model = _model()
    assert _largest_gap_to_alone(model) <= 1e-4  # measured 6.7e-7
    # the shared solve (training's) lets the batch move the scores (measured 1.1e-4)
    assert _largest_gap_to_alone(model, batch_invariant=False) > 1e-5
    assert not model.head.solve_rows_alone  # the switch is restored after evaluation


def test_generation_solves_rows_alone_by_default_and_shared_when_asked():
    model = _model()
    switches: list[bool] = []
    hook = model.head.register_forward_hook(
        lambda module, args, output: switches.append(module.solve_rows_alone)
    )
    prompt = torch.tensor([[0, 3, 4], [0, 9, 10]])
    generate(model, prompt, 2)
    generate(model, prompt, 2, strategy="beam", num_beams=2, batch_invariant=False)
    hook.remove()
    assert switches == [True, True, False, False]
    with rows_alone(model):
        assert model.head.solve_rows_alone
    assert not model.head.solve_rows_alone


def test_the_commands_turn_it_off_with_one_flag():
    for parser, given in ((eval_parser(), ["RUN"]), (generate_parser(), ["RUN", "--prompt", "a"])):
        assert parser.parse_args(given).batch_invariant is True
        assert parser.parse_args([*given, "--no-batch-invariant"]).batch_invariant is False


@pytest.mark.slow  # trains a run
def test_a_runs_recorded_test_perplexity_is_the_shared_solve(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = ["the cat sat on the mat", "a dog sat on the cat", "the dog ran"]
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n")
    model = {"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8, "hidden_dim": 8}
    config = parse_config(
        {
            "name": "adaptive",
            "out_dir": str(tmp_path / "runs"),
            "model": model | {"solver": DOPRI5, "dropout": 0.0},
            "data": {"corpus": "text", "data_dir": str(corpus), "batch_size": 2, "bptt": 4}
            | {"batching": "sentences", "eval_batch_size": 3},
            "trainer": {"max_steps": 2, "val_every": 2, "progress_bar": False},
            "eval": {"bleu_sentences": 0},
        }
    )
    recorded = train(config)["test_ppl"]
    run = experiments.load_run(tmp_path / "runs" / "adaptive")
    shared = run.evaluate(bleu_sentences=0, batch_invariant=False)["ppl"]
    assert shared == pytest.approx(recorded, rel=1e-9)
    alone = run.evaluate(bleu_sentences=0)["ppl"]  # odelm eval's default: measured 2.6e-5 apart
    assert alone == pytest.approx(recorded, rel=1e-4)
    assert alone != pytest.approx(recorded, rel=1e-7)
