"""A Hugging Face user's everyday paths on every family: half-precision generation
with the cache, ``resize_token_embeddings``, special tokens."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import FAMILIES, V

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not

IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return FAMILIES[name]().eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_half_precision_generation_with_the_cache_equals_without(name, dtype):
    model = _model(name).to(dtype)
    cached = model.generate(IDS, max_new_tokens=4, do_sample=False, use_cache=True)
    uncached = model.generate(IDS, max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    library = model.generate(IDS, 4)  # odelm.decoding.generate, the library's cache
    assert torch.equal(library, cached)
    logits = model(input_ids=IDS).logits
    assert logits.dtype == dtype and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_resize_token_embeddings_then_forward_and_reload(name, tmp_path):
    from transformers import AutoModelForCausalLM

    model = _model(name)
    model.resize_token_embeddings(V + 5)
    ids = torch.tensor([[1, V + 3, 2, V + 4]])  # new tokens read and predicted
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, V + 5)
    assert model.config.vocab_size == V + 5
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.vocab_size == V + 5
    torch.testing.assert_close(reloaded(input_ids=ids).logits, logits, rtol=0, atol=0)
    model.resize_token_embeddings(V - 3)  # and shrinks
    assert model(input_ids=ids[:, [0, 2]]).logits.shape == (1, 2, V - 3)


def test_special_tokens_make_pipeline_equal_odelm_generate(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from experiments.evaluation.trained import load_run

    run = load_run(trained)
    eos = run.tokenizer.eos_id
    model = AutoModelForCausalLM.from_pretrained(trained / "model")
    config = model.config
    assert config.bos_token_id == config.eos_token_id == config.pad_token_id == eos
    assert model.generation_config.eos_token_id == eos  # generation stops at <eos>
    assert model.generation_config.pad_token_id == eos
    tokenizer = AutoTokenizer.from_pretrained(trained)
    assert tokenizer.bos_token_id == tokenizer.pad_token_id == eos
    with pytest.raises(Exception, match="UNK"):  # no <unk> in the grammar vocabulary: refused
        tokenizer("a zebra")
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    for prompt in ["a dog", "every small bird", "this cat sees"]:
        text = generator(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"]
        assert text == run.generate(prompt, 6, stop_at_eos=True)


def test_a_model_saved_without_ids_takes_them_from_its_tokenizer_files(tmp_path):
    from transformers import AutoModelForCausalLM

    from experiments.data.hf_tokenizer import save_hf_tokenizer
    from experiments.data.tokenization import WordTokenizer

    model = _model("lstm")
    model.save_pretrained(tmp_path)  # told no ids: config.json carries none
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.eos_token_id is None
    save_hf_tokenizer(WordTokenizer(["<eos>", *(f"w{i}" for i in range(1, V))]), tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.eos_token_id == loaded.config.pad_token_id == 0
    assert loaded.generation_config.bos_token_id == 0
