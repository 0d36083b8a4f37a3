"""Heads, encoders and models: causality, batching invariance, regularisers, GPT-2 loading."""

from __future__ import annotations

import socket

import pytest
import torch
from torch import nn

from neuralode_lm import (
    MODELS,
    CausalODEHead,
    GPT2Encoder,
    LSTMEncoder,
    ReconstructionODEDecoder,
    RegularizedField,
    build_model,
    solve,
)

V = 40
TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32}
RK4 = {"method": "rk4", "step_size": 0.25}


def _model(name: str, solver: dict | None = None, **extra) -> nn.Module:
    options: dict = dict(extra)
    if name in ("lstm", "ode-lstm"):
        options.update(embed_dim=16, hidden_dim=16)
    elif name == "node-transformer":
        options.update(d_model=16, n_heads=2, d_ff=32)
    else:
        options.update(config=TINY_GPT2)
    if name.startswith(("ode", "aug")):
        options.update(field_hidden=24, solver=solver)
    torch.manual_seed(0)
    return build_model(name, V, **options).double().eval()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(
    ("name", "solver", "tolerance"),
    [
        ("lstm", None, 0.0),
        ("gpt2", None, 1e-12),
        ("ode-lstm", RK4, 1e-12),
        ("ode-gpt2", RK4, 1e-12),
        ("aug-ode-gpt2", RK4, 1e-12),
        ("ode-lstm", {"backend": "torchode", "rtol": 1e-6, "atol": 1e-6}, 1e-12),
        # one step size for the whole batch: positions couple through step control only, so
        # earlier logits move by the solver's error (~1e-5 here), not by O(1) as a leak would
        ("ode-gpt2", {"rtol": 1e-8, "atol": 1e-8}, 1e-4),
    ],
)
def test_causal_models_do_not_see_the_future(name: str, solver, tolerance: float) -> None:
    model = _model(name, solver)
    assert model.is_causal
    # exactly causal (a training step may leave out the last position) iff no earlier
    # logit moves by more than rounding
    assert getattr(model, "exactly_causal", True) is (tolerance <= 1e-12)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (3, 10), generator=gen)
    cut = 4
    changed = tokens.clone()
    changed[:, cut + 1 :] = torch.randint(0, V, (3, 10 - cut - 1), generator=gen)
    with torch.no_grad():
        before, aux = model(tokens)
        after, _ = model(changed)
    assert before.shape == (3, 10, V)
    assert (before[:, : cut + 1] - after[:, : cut + 1]).abs().max().item() <= tolerance
    assert (before[:, cut + 1 :] - after[:, cut + 1 :]).abs().max().item() > 1e-3
    if name != "lstm" and name != "gpt2":
        assert aux["nfe"] > 0


@pytest.mark.parametrize("name", ["ode-lstm", "ode-gpt2", "aug-ode-gpt2"])
def test_reconstruction_decoder_is_marked_and_really_non_causal(name: str) -> None:
    model = _model(name, reconstruction=True)
    assert model.is_causal is False and model.exactly_causal is False
    assert isinstance(model.head, ReconstructionODEDecoder)
    tokens = torch.randint(0, V, (2, 8))
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % V
    with torch.no_grad():
        a, aux = model(tokens)
        b, _ = model(changed)
    # the last token changes the prediction at position 0: the decoder sees the future
    assert (a[:, 0] - b[:, 0]).abs().max().item() > 1e-6
    assert aux["nfe"] > 0


def test_reconstruction_decoder_reads_the_ode_at_one_time_per_token() -> None:
    torch.manual_seed(0)
    head = ReconstructionODEDecoder(
        6, 11, integration_time=2.0, solver={"rtol": 1e-9, "atol": 1e-9}
    ).double()
    hidden = torch.randn(2, 5, 6, dtype=torch.float64)
    logits, _ = head(hidden)
    times = torch.linspace(0, 2.0, 5, dtype=torch.float64)
    states, _ = solve(head.field, hidden[:, -1], times, rtol=1e-9, atol=1e-9)
    assert torch.allclose(logits, head.proj(states.transpose(0, 1)), atol=1e-7)
    assert torch.allclose(logits[:, 0], head.proj(hidden[:, -1]))


def test_causal_head_is_batching_invariant() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(6, 7, 8, dtype=torch.float64) * 2
    tight = {"rtol": 1e-8, "atol": 1e-8}
    head = CausalODEHead(8, 13, field_hidden=16, solver=tight).double()
    alone, _ = head(hidden[2:3])
    batched, _ = head(hidden)
    # shared step size: equal within the solver's error (~1e-5 here), not bit for bit
    assert (alone[0] - batched[2]).abs().max().item() < 1e-4
    assert (alone[0] - batched[3]).abs().max().item() > 1e-2
    head.solver = head.solver.__class__(backend="torchode", **tight)
    alone, _ = head(hidden[2:3])
    batched, _ = head(hidden)
    # torchode: per-position step control, identical up to floating-point rounding
    assert (alone[0] - batched[2]).abs().max().item() < 1e-10


def test_augmentation_starts_from_the_first_token_state() -> None:
    torch.manual_seed(0)
    head = CausalODEHead(4, 9, augment_dim=4, augment_init="first").double()
    hidden = torch.randn(2, 3, 4, dtype=torch.float64)
    z0 = head._augment(hidden, hidden)
    assert z0.shape == (2, 3, 8)
    assert torch.equal(z0[:, :, 4:], hidden[:, :1].expand(2, 3, 4))
    zeros = CausalODEHead(4, 9, augment_dim=3)._augment(hidden, hidden)
    assert torch.equal(zeros[..., 4:], torch.zeros(2, 3, 3, dtype=torch.float64))
    projected = CausalODEHead(4, 9, augment_dim=2, augment_init="first")
    assert projected.width == 6 and isinstance(projected.augment_proj, nn.Linear)


class LinearField(nn.Module):
    def __init__(self, a: torch.Tensor) -> None:
        super().__init__()
        self.a = nn.Parameter(a)

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return z @ self.a.T


def test_regularisers_integrate_kinetic_energy_and_jacobian_norm() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=gen, dtype=torch.float64) * 0.5
    z0 = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    field = RegularizedField(LinearField(a), 3, kinetic=True, jacobian=True)
    field.noise = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    x0 = torch.cat([z0, torch.zeros(4, 2, dtype=torch.float64)], -1)
    states, _ = solve(field, x0, [0.0, 1.0], rtol=1e-10, atol=1e-10)
    final = states[-1]
    # kinetic: int_0^1 ||A expm(A s) z0||^2 ds by Simpson's rule on the exact solution
    grid = torch.linspace(0, 1, 401, dtype=torch.float64)
    speed = torch.stack(
        [((z0 @ torch.linalg.matrix_exp(a * s).T) @ a.T).pow(2).sum(-1) for s in grid]
    )
    weights = torch.ones(401, dtype=torch.float64)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    kinetic = (weights[:, None] * speed).sum(0) / (3 * 400)
    assert torch.allclose(final[:, 3], kinetic, rtol=1e-7)
    # Jacobian: df/dz = A is constant, so e_j(1) = ||eps^T A||^2 exactly
    assert torch.allclose(final[:, 4], (field.noise @ a).pow(2).sum(-1), rtol=1e-8)
    assert torch.allclose(final[:, :3], z0 @ torch.linalg.matrix_exp(a).T, atol=1e-8)


def test_regularised_training_reports_reg_and_its_gradient() -> None:
    model = _model("ode-lstm", kinetic_weight=0.5, jacobian_weight=0.5).train()
    tokens = torch.randint(0, V, (2, 6))
    _, aux = model(tokens)
    assert aux["reg"].requires_grad and aux["reg"].item() > 0
    aux["reg"].backward()
    assert model.head.field.net[0].weight.grad.abs().sum() > 0
    assert model.solver_stats.nfe_backward > 0
    _, eval_aux = model.eval()(tokens)
    assert "reg" not in eval_aux


def test_ode_lstm_trains_in_minibatches_and_reports_nfe() -> None:
    torch.manual_seed(0)
    model = build_model("ode-lstm", 12, embed_dim=16, hidden_dim=32, field_hidden=16)
    pattern = torch.arange(12).repeat(3)
    batch = torch.stack([pattern.roll(-k)[:16] for k in range(8)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, nfes = [], []
    for _ in range(15):
        logits, aux = model(batch)
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 12), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        nfes.append((aux["nfe"], model.solver_stats.nfe_backward))
    assert losses[-1] < 0.5 * losses[0]
    assert all(forward > 0 and backward > 0 for forward, backward in nfes)


def test_tiny_gpt2_round_trip_without_network(tmp_path, no_network) -> None:
    source = _model("ode-gpt2", RK4)
    source.encoder.save_pretrained(tmp_path / "gpt2")
    loaded = build_model(
        "ode-gpt2", V, pretrained=tmp_path / "gpt2", field_hidden=24, solver=RK4
    ).double()
    loaded.head.load_state_dict(source.head.state_dict())
    loaded.eval()
    tokens = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        assert torch.equal(source(tokens)[0], loaded(tokens)[0])
    baseline = build_model("gpt2", V, pretrained=str(tmp_path / "gpt2")).double().eval()
    with torch.no_grad():
        hidden = source.encoder(tokens)
        expected = hidden @ source.encoder.model.wte.weight.T
        assert torch.equal(baseline(tokens)[0], expected)
    augmented = build_model("aug-ode-gpt2", V, pretrained=tmp_path / "gpt2")
    assert augmented.head.augment_dim == TINY_GPT2["n_embd"]
    with pytest.raises(ValueError, match="vocab_size"):
        build_model("gpt2", V + 1, pretrained=tmp_path / "gpt2")


def test_missing_pretrained_path_fails_clearly_offline(tmp_path, no_network) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        GPT2Encoder.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="offline"):
        GPT2Encoder.from_pretrained("some-org/some-gpt2")
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT2Encoder.from_pretrained(tmp_path)


def test_encoders_and_presets() -> None:
    lstm = LSTMEncoder.report_preset(50)
    assert (lstm.lstm.input_size, lstm.lstm.hidden_size, lstm.dropout.p) == (300, 300, 0.1)
    encoder = GPT2Encoder.from_config(TINY_GPT2, vocab_size=V, layer=1, freeze=True)
    assert not any(p.requires_grad for p in encoder.parameters())
    encoder.train()
    assert not encoder.model.training  # frozen GPT-2 keeps dropout off
    tokens = torch.randint(0, V, (2, 5))
    hidden = encoder(tokens)
    full = encoder.model(tokens, output_hidden_states=True).hidden_states
    assert torch.equal(hidden, full[1]) and not torch.equal(hidden, full[2])
    with pytest.raises(ValueError, match="layer"):
        GPT2Encoder.from_config(TINY_GPT2, vocab_size=V, layer=3)


def test_build_model_names_and_contract_attributes() -> None:
    with pytest.raises(ValueError, match="ode-lstm"):
        build_model("ode-transformer", V)
    for name in MODELS:
        model = _model(name, RK4 if name.startswith(("ode", "aug")) else None)
        assert model.vocab_size == V and model.is_causal
        blocks = model.block_modules()
        assert blocks and all(isinstance(b, nn.Module) for b in blocks)
        assert all(any(True for _ in b.parameters()) for b in blocks)
    with pytest.raises(ValueError, match="augment_init"):
        CausalODEHead(4, 5, augment_init="last")
    with pytest.raises(ValueError, match="integration_time"):
        CausalODEHead(4, 5, integration_time=0.0)
    with pytest.raises(ValueError, match="field type"):
        CausalODEHead(4, 5, field="gru")
