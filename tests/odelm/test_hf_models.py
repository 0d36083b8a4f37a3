"""Every causal LM of the library is a ``transformers`` model: the HF forward and
loss, ``AutoModelForCausalLM`` loading, HF generation equal to the library's, cached equal to
uncached, embeddings, and the library contract unchanged on the same objects."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationMixin,
    PreTrainedModel,
)

from experiments.training.task import LMTask
from ode_transformer import ODETransformerLM
from odelm.hf import MODEL_TYPES, CausalLMOutput, HuggingFaceLM, LMOutput, OdelmCache
from odelm.pretrained import ARCHITECTURES
from tests.support.families import FAMILIES, V

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not


def _model(name: str) -> PreTrainedModel:
    torch.manual_seed(0)
    return FAMILIES[name]().eval()


def _ids(rows: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_every_library_lm_is_registered():
    causal = {a for a in ARCHITECTURES if not a.endswith("ODETransformerEncoder")}
    assert causal <= set(MODEL_TYPES)
    assert len(set(MODEL_TYPES.values())) == len(MODEL_TYPES)


@pytest.mark.parametrize("name", FAMILIES)
def test_same_object_both_contracts_and_loss(name):
    model = _model(name)
    assert isinstance(model, PreTrainedModel) and isinstance(model, GenerationMixin)
    assert model.can_generate()
    config = model.config
    assert config.model_type == MODEL_TYPES[model.model_spec()["architecture"]]
    assert AutoConfig.for_model(config.model_type).__class__ is type(config)
    ids = _ids()
    # the library forward solves a batch together; so do Hugging Face calls when told to
    # (by default an adaptive evaluation there solves each row alone: test_hf_padding.py)
    model.batch_invariant = False
    library = model(ids)  # the library contract, unchanged
    assert isinstance(library, tuple) and isinstance(library, LMOutput)
    logits, aux = library
    assert logits.shape == (2, 7, V) and isinstance(aux, dict)
    assert library.logits is logits
    out = model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids))
    assert isinstance(out, CausalLMOutput)
    torch.testing.assert_close(out.logits, logits, rtol=0, atol=1e-6)
    if "nfe" in aux:
        assert out.nfe == float(aux["nfe"]) and out.nfe > 0
    # the HF loss (label shift, mean over tokens) is the library's training loss on the batch
    task = LMTask(model, {"lr": 1e-3})
    library_loss, _ = task._loss(ids)
    assert out.loss.item() == pytest.approx(library_loss.item(), abs=1e-5)
    manual = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)
    )
    assert out.loss.item() == pytest.approx(manual.item(), abs=1e-6)
    # -100 is ignored, as in transformers
    labels = ids.clone()
    labels[:, :4] = -100
    part = model(input_ids=ids, labels=labels).loss
    expected = torch.nn.functional.cross_entropy(
        logits[:, 3:-1].reshape(-1, V), ids[:, 4:].reshape(-1)
    )
    assert part.item() == pytest.approx(expected.item(), abs=1e-6)
    assert model(input_ids=ids, return_dict=False)[0].shape == (2, 7, V)
    assert model(ids, labels=ids).loss.item() == out.loss.item()  # positional ids, HF keywords


@pytest.mark.parametrize("name", FAMILIES)
def test_auto_model_for_causal_lm_loads_a_saved_model(name, tmp_path):
    model = _model(name)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == model.config.model_type
    assert AutoConfig.from_pretrained(tmp_path).architecture == saved["architecture"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is type(model) and not loaded.training
    ids = _ids()
    torch.testing.assert_close(loaded(ids)[0], model(ids)[0], rtol=0, atol=0)
    # the class's own from_pretrained with transformers' options
    again = type(model).from_pretrained(tmp_path, dtype=torch.float64, trust_remote_code=False)
    assert next(again.parameters()).dtype == torch.float64


def test_model_type_does_not_change_what_loads(tmp_path):
    """A config.json written before model_type existed loads as before (both ways)."""
    model = _model("ode_transformer-rk4")
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    del saved["model_type"]
    path.write_text(json.dumps(saved))
    loaded = ODETransformerLM.from_pretrained(tmp_path)
    assert isinstance(loaded, PreTrainedModel)
    torch.testing.assert_close(loaded(_ids())[0], model(_ids())[0], rtol=0, atol=0)


GENERATING = list(FAMILIES)


def _hf_generate(model, prompt, **options):
    return model.generate(prompt, max_new_tokens=6, pad_token_id=0, **options)


@pytest.mark.parametrize("name", GENERATING)
def test_hf_generate_equals_library_generate(name):
    model = _model(name)
    prompt = _ids(2, 3, seed=5)
    greedy = _hf_generate(model, prompt, do_sample=False)
    assert greedy.shape == (2, 9)
    assert torch.equal(greedy, model.generate(prompt, 6))  # the library's spelling
    assert torch.equal(greedy, model.generate(prompt, 6, strategy="greedy", use_cache=False))
    beam = _hf_generate(model, prompt, num_beams=3, do_sample=False, length_penalty=1.0)
    library_beam = model.generate(prompt, 6, strategy="beam", num_beams=3)
    assert torch.equal(beam, library_beam)
    # sampling with top_k=1 is the argmax, in both spellings
    assert torch.equal(_hf_generate(model, prompt, do_sample=True, top_k=1), greedy)
    sampled = _hf_generate(model, prompt, do_sample=True, top_k=10, top_p=0.9, temperature=0.7)
    assert sampled.shape == (2, 9) and torch.equal(sampled[:, :3], prompt)


@pytest.mark.parametrize("name", FAMILIES)
def test_cached_equals_uncached(name):
    model = _model(name)
    prompt = _ids(2, 3, seed=7)
    runs = {}
    for use_cache in (True, False):
        for beams in (1, 3):
            runs[use_cache, beams] = model.generate(
                prompt,
                max_new_tokens=6,
                num_beams=beams,
                do_sample=False,
                use_cache=use_cache,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
    for beams in (1, 3):
        cached, uncached = runs[True, beams], runs[False, beams]
        assert torch.equal(cached.sequences, uncached.sequences)
        for a, b in zip(cached.scores, uncached.scores):
            finite = torch.isfinite(a)
            assert torch.equal(finite, torch.isfinite(b))
            torch.testing.assert_close(a[finite], b[finite], rtol=0, atol=1e-5)
    # the cache is the model's own per-stage key/value cache where the model has one
    ids = _ids(2, 5)
    out = model(input_ids=ids[:, :4], use_cache=True)
    if callable(getattr(model, "next_token_logits", None)) and callable(
        getattr(model, "init_cache", None)
    ):
        assert isinstance(out.past_key_values, OdelmCache)
        step = model(input_ids=ids[:, 4:], past_key_values=out.past_key_values)
        torch.testing.assert_close(step.logits[:, -1], model(ids)[0][:, -1], rtol=0, atol=1e-5)
        assert out.past_key_values.get_seq_length() == 5


def test_per_stage_cache_is_used_by_hf_generate():
    model = _model("ode_transformer-rk4")
    out = model.generate(_ids(1, 4), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 7)
    cache = model(input_ids=_ids(1, 4), use_cache=True).past_key_values
    leaves = []

    def walk(node):
        if node._keys is not None:
            leaves.append(node.cached_length)
        for child in node._children.values():
            walk(child)

    walk(cache.tree)
    assert len(leaves) == 2 * 4 and set(leaves) == {4}  # 2 layers x 4 RK4 stages


@pytest.mark.parametrize("name", ["ode_transformer-rk4", "lstm", "reference-transformer", "gpt2"])
def test_embeddings_and_resize(name):
    model = _model(name)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, torch.nn.Embedding) and embedding.num_embeddings == V
    ids = _ids()
    before = model(ids)[0]
    tied = model._tied_weights_keys
    model.resize_token_embeddings(V + 5)
    assert model.get_input_embeddings().num_embeddings == V + 5
    assert model.config.vocab_size == V + 5 and model.vocab_size == V + 5
    after = model(ids)[0]
    assert after.shape == (2, 7, V + 5)
    torch.testing.assert_close(after[..., :V], before, rtol=0, atol=1e-6)
    assert model._tied_weights_keys == tied
    if tied:
        output = model.get_output_embeddings()
        assert output.weight is model.get_input_embeddings().weight
    bigger = torch.full((1, 2), V + 4)
    assert model(input_ids=bigger).logits.shape == (1, 2, V + 5)


def test_tied_weights_keys():
    assert _model("ode_transformer-rk4")._tied_weights_keys == {
        "head.weight": "token_embedding.weight"
    }
    assert _model("ode_transformer-rk2-untied")._tied_weights_keys == {}
    assert _model("node-transformer-grid")._tied_weights_keys == {
        "head.weight": "token_embedding.weight"
    }


def test_config_reads_through_to_the_library_config():
    model = _model("ode_transformer-rk4")
    assert model.config.block == "rk4" and model.config.d_model == 16
    assert model.library_config is model.config.library_config
    assert model.config.library_config.vocab_size == V
    assert "odelm-ode-transformer" in repr(model.config)
    assert model.config.to_dict()["odelm_config"]["block"] == "rk4"


class _NoMask(HuggingFaceLM):
    """A model whose forward takes no padding mask (none of the library's is one)."""

    is_causal = True
    output_embeddings_name = None

    def __init__(self) -> None:
        super().__init__()
        self.vocab_size = V
        self.token_embedding = torch.nn.Embedding(V, V)

    def forward(self, tokens):
        return self.token_embedding(tokens), {}


def test_left_padding_is_refused_where_no_mask_is_taken():
    from odelm.hf import HuggingFaceError

    model = _NoMask()
    ids = _ids()
    right = torch.ones_like(ids)
    right[0, -2:] = 0
    model(input_ids=ids, attention_mask=right)  # right padding: fine for a causal model
    left = torch.ones_like(ids)
    left[0, :2] = 0
    with pytest.raises(HuggingFaceError, match="right padding"):
        model(input_ids=ids, attention_mask=left)
    # the library's models take the mask: padded rows score as unpadded ones
    for name in ("gpt2", "ode_transformer-rk4"):
        padded = _model(name)
        out = padded(input_ids=ids, attention_mask=left)
        alone = padded(ids[:1, 2:])[0]
        torch.testing.assert_close(out.logits[0, 2:], alone[0], rtol=0, atol=1e-5)


def test_generate_with_a_padding_mask():
    prompt = _ids(2, 4, seed=3)
    left = torch.ones_like(prompt)
    left[0, :2] = 0
    for name in ("gpt2", "ode_transformer-rk4"):  # a left-padded row continues as alone
        model = _model(name)
        both = model.generate(prompt, attention_mask=left, max_new_tokens=3, do_sample=False)
        alone = model.generate(prompt[:1, 2:], max_new_tokens=3, do_sample=False)
        assert torch.equal(both[0, 4:], alone[0, 2:])


def test_auto_loading_runs_no_code_from_the_folder(tmp_path):
    """An ``auto_map`` naming code beside the weights is never imported, even with
    ``trust_remote_code=True`` (odelm's registered classes take precedence), and the
    architecture must still be one of the library's."""
    from odelm.pretrained import PretrainedError

    model = _model("ode_transformer-rk4")
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"}
    path.write_text(json.dumps({**saved, "auto_map": auto_map}))
    (tmp_path / "evil.py").write_text("raise SystemExit('code from the model folder ran')\n")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(loaded) is ODETransformerLM
    torch.testing.assert_close(loaded(_ids())[0], model(_ids())[0], rtol=0, atol=0)
    path.write_text(json.dumps({**saved, "architecture": "os:system"}))
    with pytest.raises(PretrainedError, match="not one of the library's models"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
