"""bf16 mixed precision on CPU (``trainer.precision: bf16-mixed``): every family trains under
autocast with finite gradients and a loss close to fp32's, the ODE solvers keep their state,
step-size control and adjoint in fp32, and the trainer option reaches Lightning."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from experiments.models.build import build_model
from experiments.training.config import parse_config
from experiments.training.train import train
from neuralode_lm.solvers import solve

V = 50
TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32}
DOPRI5 = {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4}
NODE = {"name": "node-transformer", "d_model": 32, "n_heads": 2, "d_ff": 64}
LSTM = {"embed_dim": 32, "hidden_dim": 32}
FAMILIES = {
    "reference transformer": {"family": "reference", "name": "transformer", "d_model": 32},
    "ode_transformer rk4": {
        "family": "ode_transformer",
        "d_model": 32,
        "n_heads": 2,
        "d_ff": 64,
        "n_layers": 2,
        "block": "rk4",
    },
    "node-transformer rk4 grid": {
        "family": "neuralode_lm",
        **NODE,
        "solver": {"method": "rk4"},
        "steps": 2,
    },
    "node-transformer dopri5 adjoint": {
        "family": "neuralode_lm",
        **NODE,
        "solver": {**DOPRI5, "adjoint": True},
    },
    "lstm": {"family": "neuralode_lm", "name": "lstm", **LSTM},
    "ode-lstm dopri5": {"family": "neuralode_lm", "name": "ode-lstm", **LSTM, "solver": DOPRI5},
    "ode-lstm reconstruction adjoint": {
        "family": "neuralode_lm",
        "name": "ode-lstm",
        **LSTM,
        "solver": {**DOPRI5, "adjoint": True},
        "reconstruction": True,
    },
    "gpt2": {"family": "neuralode_lm", "name": "gpt2", "config": TINY_GPT2},
    "ode-gpt2 dopri5": {
        "family": "neuralode_lm",
        "name": "ode-gpt2",
        "config": TINY_GPT2,
        "solver": DOPRI5,
    },
}


def _loss_and_grads(
    spec: dict, tokens: torch.Tensor, bf16: bool
) -> tuple[float, torch.Tensor, dict, nn.Module]:
    """Loss, flattened gradients, aux and model of one forward/backward (dropout off)."""
    torch.manual_seed(0)
    model = build_model(spec, V).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits, aux = model(tokens)
        loss = nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, V), tokens[:, 1:].reshape(-1)
        )
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.item(), grads, aux, model


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_bf16_forward_backward_is_finite_and_close_to_fp32(family: str) -> None:
    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(1))
    loss32, grads32, aux32, _ = _loss_and_grads(FAMILIES[family], tokens, bf16=False)
    loss16, grads16, aux16, model = _loss_and_grads(FAMILIES[family], tokens, bf16=True)
    assert torch.isfinite(grads16).all()
    assert abs(loss16 - loss32) < 5e-3 * loss32
    assert nn.functional.cosine_similarity(grads16, grads32, 0) > 0.99
    if "nfe" in aux32:  # the adaptive solvers' step-size control barely notices bf16
        assert abs(aux16["nfe"] - aux32["nfe"]) <= 0.35 * aux32["nfe"]
    stats = getattr(model, "solver_stats", None)
    if stats is not None and stats.nfe_backward:
        assert stats.nfe_backward > 0


class _Linear(nn.Module):
    """``dz/ds = W z``: a field whose matrix product autocast runs in bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8, bias=False)
        nn.init.normal_(self.linear.weight, std=0.5, generator=torch.Generator().manual_seed(0))
        self.dtypes: list[torch.dtype] = []

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        self.dtypes.append(z.dtype)
        return self.linear(z)


@pytest.mark.parametrize("adjoint", [False, True])
def test_solver_state_stays_fp32_under_autocast(adjoint: bool) -> None:
    field = _Linear()
    y0 = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        states, stats = solve(field, y0.bfloat16(), 1.0, method="dopri5", adjoint=adjoint)
        inside = field.linear(y0).dtype
    assert inside == torch.bfloat16  # the field itself ran under autocast
    assert states.dtype == torch.float32 and set(field.dtypes) == {torch.float32}
    exact = torch.linalg.matrix_exp(field.linear.weight.detach()) @ y0.bfloat16().float().T
    assert torch.allclose(states[-1], exact.T, rtol=0.05, atol=0.05)
    states[-1].square().sum().backward()
    assert torch.isfinite(field.linear.weight.grad).all() and stats.nfe_backward > 0


@pytest.mark.slow
def test_bf16_adjoint_gradient_matches_direct_backpropagation() -> None:
    """The adjoint solves the same (autocast) field backwards: its gradient agrees with
    backpropagation through the forward solve's own operations."""
    y0 = torch.randn(16, 8, generator=torch.Generator().manual_seed(3))
    grads = []
    for adjoint in (False, True):
        field = _Linear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            states, _ = solve(
                field, y0, 1.0, method="dopri5", rtol=1e-5, atol=1e-6, adjoint=adjoint
            )
        states[-1].square().sum().backward()
        grads.append(field.linear.weight.grad)
    assert torch.allclose(grads[0], grads[1], rtol=0.03, atol=0.03 * grads[0].abs().max())


@pytest.mark.slow
def test_bf16_mixed_reaches_the_lightning_trainer(tmp_path, tiny_config) -> None:
    seen: list[tuple[bool, torch.dtype]] = []
    config = parse_config(
        tiny_config(
            tmp_path,
            trainer={
                "precision": "bf16-mixed",
                "max_steps": 4,
                "val_every": 4,
                "log_every": 1,
                "logger": ["csv"],
            },
        )
    )
    from experiments.models.build import build_model as build

    hook_model: list[nn.Module] = []

    def capture(spec: dict, vocab_size: int) -> nn.Module:
        model = build(spec, vocab_size)
        # a linear layer inside the stack (training fuses the softmax layer with the loss)
        inner = next(m for m in model.modules() if isinstance(m, nn.Linear) and m is not model.head)
        inner.register_forward_hook(lambda m, i, out: seen.append((m.training, out.dtype)))
        hook_model.append(model)
        return model

    import experiments.training.trainer as trainer_module

    original, trainer_module.build_model = trainer_module.build_model, capture
    try:
        result = train(config)
    finally:
        trainer_module.build_model = original
    training = [dtype for in_training, dtype in seen if in_training]
    assert training and set(training) == {torch.bfloat16}  # training ran under autocast
    assert result["steps"] == 4 and 1.0 < result["test_ppl"] < float("inf")
    assert next(hook_model[0].parameters()).dtype == torch.float32  # fp32 master weights
    # utilisation beside throughput: forward + backward FLOPs per second over the bf16 peak
    assert 0.0 < result["train_mfu"] < 1.0
    with (tmp_path / "run" / "logs" / "metrics.csv").open() as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("train/mfu")]
    assert logged and all(0.0 < float(row["train/mfu"]) < 1.0 for row in logged)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_training_loss_gradients_equal_lm_nll_bit_for_bit(label_smoothing: float) -> None:
    """The training loss ignores the last position instead of copying the logits without
    it: fp32 training takes exactly the steps it took with ``lm_nll``."""
    from experiments.data.batching import lm_nll
    from experiments.training.losses import training_nll

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 17, 97, generator=generator, requires_grad=True)
    tokens = torch.randint(0, 97, (6, 17), generator=generator)
    grads, losses = [], []
    for loss_of in (
        lambda: lm_nll(logits, tokens, reduction="mean", label_smoothing=label_smoothing)[0],
        lambda: training_nll(logits, tokens, None, label_smoothing),
    ):
        loss = loss_of()
        loss.backward()
        grads.append(logits.grad)
        losses.append(loss.detach())
        logits.grad = None
    assert torch.equal(grads[0], grads[1])
    assert torch.allclose(losses[0], losses[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("rows", [5, 64, 150])
def test_chunked_cross_entropy_matches_fp32_cross_entropy_of_bf16_logits(rows: int) -> None:
    from experiments.training.losses import chunked_cross_entropy

    generator = torch.Generator().manual_seed(rows)
    logits = (3 * torch.randn(rows, 300, generator=generator)).bfloat16().requires_grad_()
    targets = torch.randint(0, 300, (rows,), generator=generator)
    targets[::4] = -100  # not scored
    expected = nn.functional.cross_entropy(logits.float(), targets)
    expected.backward()
    expected_grad, logits.grad = logits.grad, None
    loss = chunked_cross_entropy(logits, targets)
    loss.backward()
    assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-6)
    assert logits.grad.dtype == torch.bfloat16
    assert torch.allclose(logits.grad.float(), expected_grad.float(), rtol=0.01, atol=1e-7)


def test_chunked_cross_entropy_gradient_from_forward_equals_the_recomputed_one() -> None:
    # The forward pass computes the gradient for an upstream gradient of 1; any other
    # upstream gradient recomputes it in backward. Doubling is exact in binary floating
    # point (and in bf16 rounding), so the two paths must agree bit for bit.
    from experiments.training.losses import chunked_cross_entropy

    generator = torch.Generator().manual_seed(0)
    base = (3 * torch.randn(150, 300, generator=generator)).bfloat16()
    targets = torch.randint(0, 300, (150,), generator=generator)
    targets[::5] = -100
    grads = []
    for upstream in (1.0, 2.0):
        logits = base.clone().requires_grad_()
        chunked_cross_entropy(logits, targets).backward(torch.tensor(upstream))
        grads.append(logits.grad)
    assert torch.equal(2 * grads[0], grads[1])
    assert grads[0][targets == -100].abs().sum() == 0 and grads[0].abs().sum() > 0


@pytest.mark.parametrize(("bias", "spread"), [(True, 1.0), (False, 1.0), (True, 30.0)])
def test_linear_cross_entropy_matches_cross_entropy_of_bf16_products(
    bias: bool, spread: float
) -> None:
    """The fused output layer + loss: bf16 matrix products, fp32 softmax and bias; the
    gradients of an fp32 cross-entropy of the same bf16 operands (logits of std 2.5, or 75:
    stable), and exactly linear in the upstream gradient."""
    from experiments.training.losses import linear_cross_entropy

    generator = torch.Generator().manual_seed(0)
    hidden = spread * torch.randn(150, 24, generator=generator)
    weight = 0.5 * torch.randn(300, 24, generator=generator)
    offsets = 0.5 * torch.randn(300, generator=generator) if bias else None
    targets = torch.randint(0, 300, (150,), generator=generator)
    inputs = [t.clone().requires_grad_() for t in (hidden, weight, offsets) if t is not None]
    expected = nn.functional.cross_entropy(
        nn.functional.linear(
            inputs[0].bfloat16().float(), inputs[1].bfloat16().float(), *inputs[2:]
        ),
        targets,
    )
    expected.backward()
    results = []
    for upstream in (1.0, 2.0):
        fused = [t.clone().requires_grad_() for t in (hidden, weight, offsets) if t is not None]
        loss = linear_cross_entropy(fused[0], fused[1], fused[2] if bias else None, targets)
        loss.backward(torch.tensor(upstream))
        results.append((loss, [t.grad for t in fused]))
    loss, grads = results[0]
    assert torch.allclose(loss, expected, rtol=2e-3)
    for grad, reference in zip(grads, [t.grad for t in inputs]):
        assert grad.dtype == torch.float32
        assert nn.functional.cosine_similarity(grad.flatten(), reference.flatten(), 0) > 0.999
    # exactly linear, up to one rounding of subnormal gradients (1e-41 at spread 30), which
    # CPUs without native bf16 products produce
    subnormal = torch.finfo(torch.float32).tiny
    assert all(
        torch.allclose(2 * a, b, rtol=0, atol=subnormal) for a, b in zip(grads, results[1][1])
    )
    assert all(
        torch.equal(2 * a, b) for a, b in zip(grads, results[1][1]) if a.abs().min() > subnormal
    )


@pytest.mark.parametrize(
    "family", ["reference transformer", "ode_transformer rk4", "node-transformer rk4 grid", "lstm"]
)
def test_training_loss_fuses_the_output_layer_only_under_mixed_precision(family: str) -> None:
    """``LMTask._loss``: in fp32 exactly the cross-entropy of the logits of the step's inputs
    (``forward`` is the output layer of ``features``, bit for bit); under bf16 autocast the
    fused loss, close to it."""
    from experiments.training.config import OptimConfig
    from experiments.training.losses import fused_loss_dtype, training_inputs, training_nll
    from experiments.training.task import LMTask
    from odelm.contract import call_model

    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    task = LMTask(build_model(FAMILIES[family], V), OptimConfig()).eval()  # dropout off
    model = task.model
    assert fused_loss_dtype(model, tokens, None, 0.0) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_loss_dtype(model, tokens, None, 0.0) == torch.bfloat16
        assert fused_loss_dtype(model, tokens, None, 0.1) is None  # label smoothing
    hidden, _ = model.features(tokens)
    assert torch.equal(model.output_layer(hidden), model(tokens)[0])
    losses, grads = {}, {}
    for name, bf16 in (("fp32", False), ("plain", True), ("fused", True)):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if name == "plain":
                loss = training_nll(call_model(model, tokens)[0], tokens, None, 0.0)
            else:
                loss = task._loss(tokens)[0]
        loss.backward()
        losses[name] = loss.detach()
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
    inputs = training_inputs(model, tokens, None)  # the step's own inputs: the same shapes
    fp32 = training_nll(call_model(model, inputs)[0], tokens, None, 0.0)
    assert torch.equal(losses["fp32"], fp32.detach())
    assert torch.allclose(losses["fused"], losses["plain"], rtol=2e-3)
    assert nn.functional.cosine_similarity(grads["fused"], grads["plain"], 0) > 0.999


@pytest.mark.parametrize("native", [False, True])
def test_lstm_under_autocast_runs_in_fp32_where_bf16_lstms_do_not_exist(monkeypatch, native):
    """On a CPU without native bf16 products oneDNN refuses a bf16 LSTM: the encoder runs it
    in fp32 with autocast off (its output and carried state are fp32); on a CPU with them the
    decision is bf16, as published bf16 runs trained."""
    from neuralode_lm.encoders import LSTMEncoder
    from odelm import mixed_precision

    monkeypatch.setattr(mixed_precision, "_native_bf16_cpu", lambda: native)
    x = torch.zeros(2, 3)
    assert not mixed_precision.recurrent_in_fp32(x)  # outside autocast: untouched
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mixed_precision.recurrent_in_fp32(x) is (not native)
        if not native:
            encoder = LSTMEncoder(50, embed_dim=8, hidden_dim=8)
            out, (h, c) = encoder.forward_with_state(torch.randint(0, 50, (2, 5)))
            assert out.dtype == h.dtype == c.dtype == torch.float32
            out.float().sum().backward()
            assert encoder.lstm.weight_hh_l0.grad is not None
