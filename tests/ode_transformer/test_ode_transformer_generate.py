"""ode_transformer generation: per-stage KV cache equals recomputation; decoding strategies."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from ode_transformer import KVCache, ODETransformerConfig, ODETransformerLM
from odelm.decoding import filter_logits


def make_model(vocab: int = 29, seed: int = 0, **overrides: object) -> ODETransformerLM:
    torch.manual_seed(seed)
    fields = {
        "vocab_size": vocab,
        "d_model": 32,
        "n_heads": 4,
        "d_ff": 64,
        "n_layers": 3,
        "max_positions": 40,
        "dropout": 0.1,  # generate() must switch dropout off itself
        "attention_dropout": 0.1,
        "relu_dropout": 0.1,
    }
    return ODETransformerLM(ODETransformerConfig(**{**fields, **overrides}))


CACHED_ARCHITECTURES = {
    "rk2": {"block": "rk2"},
    "rk4": {"block": "rk4"},
    "macaron": {"stack": "macaron"},
    "dlcl": {"stack": "dlcl", "block": "rk2"},
    "rk2_gate-leapfrog": {"block": "rk2_gate", "stack": "leapfrog"},
    "rk3-multistep": {"block": "rk3", "stack": "multistep"},
    "rk2_learnable-polynet": {"block": "rk2_learnable", "stack": "polynet"},
    "rk4-attention": {"block": "rk4", "sublayer": "attention"},
    "rk2-ffn": {"block": "rk2", "sublayer": "ffn"},
}


@pytest.mark.parametrize("name", list(CACHED_ARCHITECTURES))
def test_cached_logits_equal_full_recomputation(name: str) -> None:
    model = make_model(**CACHED_ARCHITECTURES[name]).eval()
    if name == "rk2_gate-leapfrog":  # move off the symmetric initial gate
        for layer in model.block_modules():
            torch.nn.init.normal_(layer.blocks[0].gate.weight, std=0.5)
    tokens = torch.randint(0, model.vocab_size, (2, 14))
    with torch.no_grad():
        full, _ = model(tokens)
        cache = KVCache()
        pieces = [model(tokens[:, :5], cache)[0]]  # prompt
        pieces += [model(tokens[:, t : t + 1], cache)[0] for t in range(5, 10)]  # one by one
        pieces.append(model(tokens[:, 10:], cache)[0])  # a chunk after a cached past
    assert cache.position == 14
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["rk2", "rk4", "macaron", "dlcl"])
@pytest.mark.slow
def test_cached_generation_gives_identical_tokens(name: str) -> None:
    model = make_model(**CACHED_ARCHITECTURES[name])
    prompt = torch.randint(0, model.vocab_size, (3, 4))
    for kwargs in (
        {"strategy": "greedy"},
        {"strategy": "beam", "num_beams": 3},
    ):
        cached = model.generate(prompt, 12, use_cache=True, **kwargs)
        uncached = model.generate(prompt, 12, use_cache=False, **kwargs)
        assert cached.shape == (3, 16) and torch.equal(cached[:, :4], prompt)
        assert torch.equal(cached, uncached), kwargs
    sampled = [
        model.generate(
            prompt,
            12,
            strategy="sample",
            temperature=0.8,
            top_k=10,
            top_p=0.9,
            use_cache=use_cache,
            generator=torch.Generator().manual_seed(7),
        )
        for use_cache in (True, False)
    ]
    assert torch.equal(sampled[0], sampled[1])
    assert model.training  # generate() restores the training mode


def test_greedy_is_argmax_of_full_recomputation() -> None:
    model = make_model(block="rk2").eval()
    prompt = torch.randint(0, model.vocab_size, (2, 3))
    out = model.generate(prompt, 6)
    with torch.no_grad():
        logits, _ = model(out)
    torch.testing.assert_close(out[:, 3:], logits[:, 2:-1].argmax(-1), rtol=0, atol=0)


def test_beam_search_is_exact_when_beams_cover_all_prefixes() -> None:
    vocab, new = 5, 3
    model = make_model(vocab=vocab, block="rk4", seed=3).eval()
    prompt = torch.randint(0, vocab, (2, 3))
    found = model.generate(prompt, new, strategy="beam", num_beams=vocab ** (new - 1))
    with torch.no_grad():
        for row in range(2):
            candidates = torch.tensor(list(itertools.product(range(vocab), repeat=new)))
            sequences = torch.cat([prompt[row].expand(len(candidates), -1), candidates], dim=1)
            log_probs = model(sequences)[0].log_softmax(-1)
            scores = log_probs[:, 2:-1].gather(-1, sequences[:, 3:, None]).sum(dim=(1, 2))
            assert torch.equal(found[row], sequences[scores.argmax()])
    assert torch.equal(
        model.generate(prompt, 5, strategy="beam", num_beams=1), model.generate(prompt, 5)
    )


def test_eos_stops_and_pads() -> None:
    model = make_model(block="rk2").eval()
    prompt = torch.randint(0, model.vocab_size, (1, 3))
    free = model.generate(prompt, 8)
    eos = int(free[0, 5])  # the third generated token
    first = int((free[0, 3:] == eos).nonzero()[0])
    stopped = model.generate(prompt, 8, eos_id=eos)
    assert torch.equal(stopped, free[:, : 3 + first + 1])
    two = torch.cat([prompt, torch.randint(0, model.vocab_size, (1, 3))])
    out = model.generate(two, 8, eos_id=eos)
    for row in out:
        hits = (row[3:] == eos).nonzero()
        if len(hits):
            assert (row[3 + int(hits[0]) :] == eos).all()


def test_sampling_filters_and_limits() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))
    kept = torch.isfinite(filter_logits(logits, top_k=None, top_p=0.75))
    assert kept.tolist() == [[True, True, False, False], [False, False, True, True]]
    kept = torch.isfinite(filter_logits(logits, top_k=3, top_p=None))
    assert kept.tolist() == [[True, True, True, False], [False, True, True, True]]
    model = make_model(block="rk2")
    prompt = torch.randint(0, model.vocab_size, (2, 3))
    greedy = model.generate(prompt, 6)
    assert torch.equal(model.generate(prompt, 6, strategy="sample", top_k=1), greedy)
    assert torch.equal(model.generate(prompt, 6, strategy="sample", top_p=1e-6), greedy)
    # Sampled frequencies follow softmax(logits / T) on a 2-token vocabulary.
    biased = make_model(vocab=2, block="rk2", seed=5).eval()
    one = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        p1 = (biased(one)[0][0, -1] / 2.0).softmax(-1)[1].item()
    draws = biased.generate(
        one.expand(4000, 1),
        1,
        strategy="sample",
        temperature=2.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert abs(draws[:, 1].float().mean().item() - p1) < 4 * (p1 * (1 - p1) / 4000) ** 0.5


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_generation_past_max_positions_crops_the_context(strategy: str) -> None:
    """A prompt longer than the context, and a continuation that runs past it: the cached
    step recomputes the cropped window once the sequence no longer fits, exactly as the
    uncached path does, so both give the same tokens."""
    model = make_model(block="rk2", max_positions=10).eval()
    prompt = torch.randint(0, model.vocab_size, (2, 13))
    kwargs = {"strategy": strategy, "num_beams": 2}
    cached = model.generate(prompt, 6, **kwargs)
    assert cached.shape == (2, 19) and torch.equal(cached[:, :13], prompt)
    assert torch.equal(cached, model.generate(prompt, 6, use_cache=False, **kwargs))
    if strategy == "greedy":  # each token is the argmax after the last 10 tokens
        with torch.no_grad():
            for t in range(13, 19):
                logits, _ = model(cached[:, t - 10 : t])
                assert torch.equal(cached[:, t], logits[:, -1].argmax(-1))


def test_sampling_is_reproducible_with_a_seeded_generator() -> None:
    model = make_model(block="rk2")
    prompt = torch.randint(0, model.vocab_size, (2, 3))

    def draw(seed: int) -> torch.Tensor:
        options = {"temperature": 1.5, "top_p": 0.95, "generator": torch.Generator()}
        options["generator"].manual_seed(seed)
        return model.generate(prompt, 10, strategy="sample", **options)

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_generate_errors() -> None:
    model = make_model(block="rk2")
    prompt = torch.zeros(1, 30, dtype=torch.long)
    with pytest.raises(ValueError, match="beam"):
        model.generate(prompt, 2, strategy="nucleus")
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, strategy="sample", temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(prompt, 2, strategy="sample", top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 2, strategy="sample", top_k=0)


def test_save_and_load_roundtrip(tmp_path: Path) -> None:
    for overrides in (
        {"block": "rk2_gate", "stack": "dlcl"},
        {"tableau": ([[0, 0], [2 / 3, 0]], [0.25, 0.75])},
    ):
        model = make_model(**overrides).eval()
        with torch.no_grad():  # make the learnable pieces differ from their initial values
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        model.save_pretrained(tmp_path / "m")
        loaded = ODETransformerLM.from_pretrained(tmp_path / "m").eval()
        assert loaded.config == model.config
        assert loaded.head.weight is loaded.token_embedding.weight
        tokens = torch.randint(0, model.vocab_size, (2, 7))
        torch.testing.assert_close(loaded(tokens)[0], model(tokens)[0], rtol=0, atol=0)
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        ODETransformerLM.from_pretrained(tmp_path / "missing")
