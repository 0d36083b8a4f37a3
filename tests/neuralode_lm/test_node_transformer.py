"""The continuous-depth Transformer LM: its fixed grid is an ODE Transformer block, its
adaptive solves converge and backpropagate correctly, and causality holds where claimed."""

from __future__ import annotations

import itertools

import pytest
import torch

from neuralode_lm import MaxStepsExceeded, build_model
from neuralode_lm.depth_field import FixedGrid
from neuralode_lm.transformer import NODETransformerLM
from ode_transformer import KVCache
from odelm.decoding import StepFunction
from tests.support.families import V, tiny_ode_transformer

VOCAB = V
TINY = {"d_model": 16, "n_heads": 2, "d_ff": 32, "max_positions": 32, "dropout": 0.0}


def tiny(**options) -> NODETransformerLM:
    return build_model("node-transformer", VOCAB, **{**TINY, **options}).eval()


DEPTH_WEIGHTS = ("weights", "hypernetwork")
"""The depth-dependent weights, tested wherever the norm conditionings are."""
DEPTH_CODES = (".time.", "basis_", "gate_")
"""Parameter names of the time dependence (zero at first in every mode)."""


def randomize_time_codes(model: NODETransformerLM, weight_std: float = 0.3) -> None:
    """Time conditioning starts at zero; give it weights so that ``s`` matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(code in name for code in DEPTH_CODES):
                p.normal_(0.0, 0.3 if ".time." in name else weight_std)


def tokens(batch: int = 2, length: int = 9) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length))


def test_rk4_grid_one_step_per_unit_depth_is_an_ode_transformer_rk4_block():
    discrete = tiny_ode_transformer(block="rk4").eval()  # vocabulary V = VOCAB
    continuous = tiny(n_layers=2, solver={"method": "rk4"}, steps=1)
    state = {}
    for name, value in discrete.state_dict().items():
        if name.startswith("stack.layers."):
            layer, rest = name.removeprefix("stack.layers.").split(".blocks.0.f.")
            name = f"fields.{layer}.layer.{rest}"
        state[name] = value
    continuous.load_state_dict(state)
    x = tokens()
    expected, _ = discrete(x)
    logits, aux = continuous(x)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    assert aux["nfe"] == 2 * 4 and aux["exactly_causal"] is True
    # The shared-module view of the same trained model computes the same logits too.
    shared, _ = NODETransformerLM.from_ode_transformer(discrete).eval()(x)
    torch.testing.assert_close(shared, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("conditioning", ["film", *DEPTH_WEIGHTS])
@pytest.mark.slow
def test_adjoint_gradients_equal_direct_gradients_at_tight_tolerance(conditioning):
    """With every ReLU of the FFN kept in its linear piece (a large bias), the field is
    smooth and the adjoint's gradients match backpropagation through the solver. (Across
    ReLU kinks the backward solve needs far more steps and loses accuracy; see DESIGN.md.)"""
    torch.manual_seed(1)
    solver = {"method": "dopri5", "rtol": 1e-9, "atol": 1e-10}
    direct = tiny(solver=solver, time_conditioning=conditioning).double()
    randomize_time_codes(direct, weight_std=0.02)
    with torch.no_grad():
        direct.fields[0].layer.ffn.ffn.fc1.bias.fill_(3.0)
    adjoint = tiny(solver={**solver, "adjoint": True}, time_conditioning=conditioning).double()
    adjoint.load_state_dict(direct.state_dict())
    x = tokens(1, 6)
    grads = []
    for model in (direct, adjoint):
        logits, _ = model(x)
        loss = torch.nn.functional.cross_entropy(logits[0], x[0].roll(-1))
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert adjoint.solver_stats.nfe_backward > 0
    # the weights' own gradients are integrals over s of the solves' error, ~1e-9 here
    atol = 1e-9 if conditioning == "film" else 1e-8
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-6, atol=atol, msg=name)


@pytest.mark.parametrize("conditioning", ["concat", *DEPTH_WEIGHTS])
@pytest.mark.slow
def test_fixed_grid_converges_to_the_tight_dopri5_solution_with_rk4_order(conditioning):
    """Error of ``steps`` RK4 steps against dopri5 at rtol 1e-12 falls ~16x per halving.

    The field is made smooth and O(1): embeddings of unit scale (LayerNorm's curvature
    grows as the state shrinks) and every ReLU in its linear piece; with kinks the order
    drops to one, for every method."""
    torch.manual_seed(2)
    model = tiny(integration_time=2.0, time_conditioning=conditioning).double()
    # depth-dependent weights small enough for the grids to be in the asymptotic regime
    randomize_time_codes(
        model, weight_std={"weights": 0.005, "hypernetwork": 0.03}.get(conditioning, 0.3)
    )
    with torch.no_grad():
        model.token_embedding.weight.mul_(50.0)
        for p in model.fields.parameters():
            p.mul_(2.0 if p.dim() > 1 else 1.0)
        model.fields[0].layer.ffn.ffn.fc1.bias.fill_(3.0)
    x = tokens()
    model.set_integration({"method": "dopri5", "rtol": 1e-12, "atol": 1e-12})
    with torch.no_grad():
        reference, _ = model.final_state(x)
        errors = []
        for steps in (2, 4, 8, 16) if conditioning == "concat" else (4, 8, 16, 32):
            model.set_integration(FixedGrid("rk4", steps))
            state, _ = model.final_state(x)
            errors.append(float((state - reference).norm() / reference.norm()))
    ratios = [a / b for a, b in itertools.pairwise(errors)]
    assert errors[-1] < 1e-7, errors
    assert all(12.0 < r < 24.0 for r in ratios), (errors, ratios)


@pytest.mark.parametrize("conditioning", ["film", *DEPTH_WEIGHTS])
def test_fixed_grid_generation_with_a_per_stage_cache_equals_recomputation(conditioning):
    model = tiny(n_layers=2, solver={"method": "rk3"}, steps=2, time_conditioning=conditioning)
    randomize_time_codes(model)
    x = tokens(2, 8)
    cache = KVCache()
    cached = [model.next_token_logits(x[:, :3], cache)]
    for t in range(3, 8):
        cached.append(model.next_token_logits(x[:, t : t + 1], cache))
    full = [model.next_token_logits(x[:, : t + 1]) for t in range(2, 8)]
    for a, b in zip(cached, full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # every (block, step, stage) keeps its own keys and values
    assert len(cache.child(1)._children) == 2 * 3


def test_generation_cached_on_a_grid_equals_recomputation_and_adaptive_recomputes():
    grid = tiny(solver={"method": "midpoint"}, steps=2)
    prompt = tokens(2, 3)
    cached = grid.generate(prompt, 6, strategy="beam", num_beams=3)
    assert torch.equal(
        cached, grid.generate(prompt, 6, strategy="beam", num_beams=3, use_cache=False)
    )
    adaptive = tiny(solver={"method": "dopri5", "rtol": 1e-4})
    adaptive.load_state_dict(grid.state_dict())
    assert StepFunction(grid).cached and not StepFunction(adaptive).cached
    out = adaptive.generate(prompt, 4)
    assert out.shape == (2, 7) and torch.equal(out[:, :3], prompt)


def test_adaptive_solve_refuses_a_cache():
    with pytest.raises(ValueError, match="fixed grid"):
        tiny().next_token_logits(tokens(), KVCache())


def test_step_cap_raises_the_facades_named_error():
    model = tiny(solver={"method": "dopri5", "rtol": 1e-12, "atol": 1e-12, "max_num_steps": 3})
    with pytest.raises(MaxStepsExceeded, match="max_num_steps=3"):
        model(tokens())


@pytest.mark.parametrize("conditioning", ["film", *DEPTH_WEIGHTS])
@pytest.mark.slow
def test_fixed_grid_and_prefix_mode_are_exactly_causal(conditioning):
    x = tokens(2, 10)
    changed = x.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    prefix = {} if conditioning == "film" else {"time_conditioning": conditioning}
    for model in (
        tiny(solver={"method": "rk4"}, steps=3, time_conditioning=conditioning),
        tiny(solver={"method": "dopri5", "rtol": 1e-3}, causal_mode="prefix", **prefix),
    ):
        if prefix:
            randomize_time_codes(model, weight_std=0.005)
        before, aux = model(x)
        after, _ = model(changed)
        assert aux["exactly_causal"] is True
        assert torch.equal(before[:, :6], after[:, :6])
        assert not torch.equal(before[:, 6:], after[:, 6:])


def test_shared_adaptive_steps_say_they_are_not_exactly_causal():
    model = tiny(solver={"method": "bosh3", "rtol": 1e-3})
    _, aux = model(tokens())
    assert aux["exactly_causal"] is False and aux["accepted_steps"] >= 1


def test_regularisers_enter_the_loss_in_training_only():
    model = tiny(kinetic_weight=0.5, jacobian_weight=0.5, solver={"method": "rk4"}, steps=2)
    model.train()
    _, aux = model(tokens())
    assert aux["reg"].requires_grad and float(aux["reg"].detach()) > 0
    model.eval()
    assert "reg" not in model(tokens())[1]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"solver": {"method": "dopri5", "backend": "torchode"}}, "torchode"),
        ({"solver": {"method": "dopri5"}, "steps": 4}, "steps applies"),
        ({"solver": {"method": "rk4", "rtol": 1e-3}}, "takes only"),
        ({"time_conditioning": "sine"}, "time_conditioning"),
        ({"causal_mode": "future"}, "causal_mode"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        tiny(**options)
