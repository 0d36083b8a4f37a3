"""Padding masks for every family: batched generation and batched scoring with left
padding (and right padding in the forward) equal generating / scoring each row alone, and a
batched ``pipeline`` equals ``odelm generate`` prompt by prompt."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import FAMILIES

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not

ROWS = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14]]
ADAPTIVE = {"node-transformer-adaptive", "ode-lstm-dopri5"}
"""Shared-step adaptive solves: a row's score depends on its batch (see test_hf_batch_invariance)."""


def _padded(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, ROWS))
    ids = torch.zeros(len(ROWS), width, dtype=torch.long)
    mask = torch.zeros(len(ROWS), width, dtype=torch.long)
    for i, row in enumerate(ROWS):
        where = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, where], mask[i, where] = torch.tensor(row), 1
    return ids, mask


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return FAMILIES[name]().eval()


@pytest.mark.parametrize("beams", [1, 3], ids=["greedy", "beam"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_left_padded_batched_generation_equals_each_row_alone(name, beams):
    model = _model(name)
    ids, mask = _padded("left")
    options = {"max_new_tokens": 4, "do_sample": False, "num_beams": beams}
    batched = model.generate(ids, attention_mask=mask, **options)
    for i, row in enumerate(ROWS):
        alone = model.generate(torch.tensor([row]), **options)
        assert batched[i, ids.shape[1] :].tolist() == alone[0, len(row) :].tolist()


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(set(FAMILIES) - ADAPTIVE))
def test_padded_batched_scores_equal_each_row_alone(name, side):
    model = _model(name)
    ids, mask = _padded(side)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        for i, row in enumerate(ROWS):
            alone = model(input_ids=torch.tensor([row])).logits[0]
            real = logits[i][mask[i].bool()]
            torch.testing.assert_close(real, alone, rtol=0, atol=1e-5)


def test_batched_pipeline_equals_odelm_generate_prompt_by_prompt(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from experiments.evaluation.trained import load_run

    run = load_run(trained)
    tokenizer = AutoTokenizer.from_pretrained(trained)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(trained / "model")
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompts = ["a dog", "every small bird sleeps", "this cat sees", "some cats"]
    outputs = generator(prompts, max_new_tokens=5, do_sample=False, batch_size=4)
    for prompt, output in zip(prompts, outputs):
        assert output[0]["generated_text"] == run.generate(prompt, 5, stop_at_eos=True)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(ADAPTIVE))
def test_adaptive_batched_scores_equal_each_row_alone_with_batch_invariant_solves(name, side):
    model = _model(name)
    assert model.batch_invariant is None  # on in evaluation by default
    ids, mask = _padded(side)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        for i, row in enumerate(ROWS):
            alone = model(input_ids=torch.tensor([row])).logits[0]
            torch.testing.assert_close(logits[i][mask[i].bool()], alone, rtol=0, atol=1e-4)
        model.batch_invariant = False  # one shared solve: the batch moves the scores
        shared = model(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(shared, logits, rtol=0, atol=1e-6)
