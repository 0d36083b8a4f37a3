"""bf16 products on CPUs without native bf16 (``odelm.mixed_precision.emulated_products``):
fp32 products of bf16-rounded operands, rounded to bf16, equal the native bf16 product
wherever the fp32 sums are exact, forward and backward; nothing else changes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from odelm import mixed_precision
from odelm.mixed_precision import _EmulatedProducts, emulated_products


def dyadic(*shape: int, seed: int) -> torch.Tensor:
    """Values k/16, |k| <= 15: bf16 holds them, and fp32 sums of their products are exact."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(-15, 16, shape, generator=generator).float() / 16).requires_grad_()


PRODUCTS = {
    "linear": (lambda a, b, c: F.linear(a, b, c[0]), ((6, 32), (5, 32), (6, 5))),
    "matmul": (torch.matmul, ((2, 6, 32), (2, 32, 5))),
    "@": (lambda a, b: a @ b, ((6, 32), (32, 5))),
    "bmm": (torch.bmm, ((3, 6, 32), (3, 32, 5))),
    "addmm": (lambda a, b, c: torch.addmm(c, a, b), ((6, 32), (32, 5), (6, 5))),
    "baddbmm": (lambda a, b, c: torch.baddbmm(c, a, b), ((3, 6, 32), (3, 32, 5), (3, 6, 5))),
}


def operands(name: str) -> list[torch.Tensor]:
    return [dyadic(*shape, seed=seed) for seed, shape in enumerate(PRODUCTS[name][1])]


def run(name: str, emulated: bool, autocast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    product = PRODUCTS[name][0]
    leaves = operands(name)
    inputs = leaves if autocast else [x.bfloat16() for x in leaves]
    mode = _EmulatedProducts() if emulated else torch.autocast("cpu", enabled=True)
    with mode, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = product(*inputs)
    weights = dyadic(*out.shape, seed=9).detach()
    (out.float() * weights).sum().backward()
    return out, [x.grad for x in leaves]


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "bf16 operands"])
@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_emulated_product_is_the_native_bf16_product(name: str, autocast: bool) -> None:
    """Outputs and every operand's gradient equal the native product's bit for bit; the
    output is bf16 as the native one (sums of 32 products need more than bf16's 8 bits: both round once)."""
    native, native_grads = run(name, emulated=False, autocast=autocast)
    emulated, emulated_grads = run(name, emulated=True, autocast=autocast)
    assert native.dtype == emulated.dtype == torch.bfloat16
    assert torch.equal(native, emulated)
    assert all(torch.equal(a, b) for a, b in zip(native_grads, emulated_grads))
    exact = PRODUCTS[name][0](*[x.detach().double() for x in operands(name)])
    assert (emulated.double() - exact).abs().max() > 0  # the sums did need a rounding


def test_random_operands_stay_within_one_bf16_rounding_of_the_native_product() -> None:
    """On arbitrary values only the order of the fp32 sums differs from a native product."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 300, generator=generator), torch.randn(300, 30, generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = a @ b
        with _EmulatedProducts():
            emulated = a @ b
    assert torch.equal(emulated, (a.bfloat16().float() @ b.bfloat16().float()).bfloat16())
    assert not torch.equal(emulated, (a @ b).bfloat16())  # the operands are rounded first
    exact = a.bfloat16().double() @ b.bfloat16().double()
    ulp = exact.abs() * 2.0**-8
    assert ((emulated.double() - exact).abs() <= ulp).all()
    assert ((native.double() - emulated.double()).abs() <= 2 * ulp).all()


def test_fp32_products_and_other_functions_pass_through_untouched() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with _EmulatedProducts():
        assert torch.equal(a @ b, torch.mm(a, b)) and (a @ b).dtype == torch.float32
        assert torch.equal(torch.softmax(a, -1), a.softmax(-1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.exp(a).dtype == torch.float32  # not a product: autocast's own rule


@pytest.mark.parametrize(
    ("precision", "native", "active"),
    [
        ("bf16-mixed", False, True),
        ("bf16-true", False, True),
        ("bf16-mixed", True, False),
        ("32-true", False, False),
    ],
)
def test_the_mode_is_entered_only_for_bf16_on_cpus_without_native_products(
    monkeypatch, precision: str, native: bool, active: bool
) -> None:
    monkeypatch.setattr(mixed_precision, "_native_bf16_cpu", lambda: native)
    modes = torch.overrides._get_current_function_mode_stack
    with emulated_products(precision):
        assert any(isinstance(mode, _EmulatedProducts) for mode in modes()) is active
    assert not any(isinstance(mode, _EmulatedProducts) for mode in modes())


@pytest.mark.slow  # the native bf16 step takes seconds on a CPU without bf16 products
def test_a_bf16_mixed_training_step_under_emulation_matches_the_native_one() -> None:
    """The RK4 Transformer's loss and gradients: the same to bf16 precision."""
    from experiments.training.config import OptimConfig
    from experiments.training.task import LMTask
    from tests.support.families import tiny_ode_transformer

    torch.manual_seed(0)
    task = LMTask(tiny_ode_transformer(block="rk4"), OptimConfig()).eval()
    tokens = torch.randint(0, task.model.config.vocab_size, (4, 12))
    results = []
    for mode in (torch.autocast("cpu", enabled=True), _EmulatedProducts()):
        task.model.zero_grad()
        with mode, torch.autocast("cpu", dtype=torch.bfloat16):
            loss = task._loss(tokens)[0]
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in task.model.parameters()])
        results.append((loss.detach(), grads))
    (native, native_grads), (emulated, emulated_grads) = results
    assert torch.allclose(native, emulated, rtol=1e-3)
    assert F.cosine_similarity(native_grads, emulated_grads, 0) > 0.9999


def spied_mode(monkeypatch, native: bool) -> list:
    """Mark the CPU ``native`` or not, and record every function the emulation mode sees."""
    calls: list = []
    real = _EmulatedProducts.__torch_function__

    def spy(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return real(self, func, types, args, kwargs)

    monkeypatch.setattr(mixed_precision, "_native_bf16_cpu", lambda: native)
    monkeypatch.setattr(_EmulatedProducts, "__torch_function__", spy)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("native", [False, True])
def test_training_takes_the_emulated_products_only_where_bf16_is_not_native(
    tmp_path, monkeypatch, native: bool
) -> None:
    """``odelm train`` in bf16-mixed: the products of the forward, the backward and the
    validation run through the emulation on a CPU without native bf16 products, never on one
    with them; the run's config (and identity) is the same either way."""
    from experiments.training.config import parse_config
    from experiments.training.train import train
    from tests.support.runs import make_tiny_config

    calls = spied_mode(monkeypatch, native)
    trainer = {"max_steps": 4, "val_every": 2, "precision": "bf16-mixed"}
    config = parse_config(make_tiny_config(tmp_path, trainer=trainer, eval={"bleu_sentences": 0}))
    result = train(config)
    assert result["steps"] == 4
    assert bool([f for f in calls if f in mixed_precision.PRODUCTS]) is not native


def fused_loss_backward() -> tuple[list[torch.Tensor], Callable[[], torch.Tensor]]:
    """The fused loss of ``hidden [12, 32]`` against ``weight [7, 32]``: its leaves, and a
    function that runs its forward and returns the loss."""
    from experiments.training.losses import linear_cross_entropy

    hidden, weight = dyadic(12, 32, seed=0), dyadic(7, 32, seed=1)
    targets = torch.randint(0, 7, (12,), generator=torch.Generator().manual_seed(2))
    return [hidden, weight], lambda: linear_cross_entropy(hidden, weight, None, targets)


def attention_scores_backward() -> tuple[list[torch.Tensor], Callable[[], torch.Tensor]]:
    """The CPU attention's fp32 scores ``q k^T`` of bf16 ``q, k [1, 2, 6, 32]``: its leaves,
    and a function that runs its forward and returns a weighted sum of the scores."""
    q, k = dyadic(1, 2, 6, 32, seed=0), dyadic(1, 2, 6, 32, seed=1)
    weights = dyadic(1, 2, 6, 6, seed=2).detach()
    return [q, k], lambda: (
        mixed_precision._Scores.apply(q.bfloat16(), k.bfloat16()) * weights
    ).sum()


CUSTOM_BACKWARDS = {
    "fused loss": fused_loss_backward,
    "attention scores": attention_scores_backward,
}


@pytest.mark.parametrize("name", sorted(CUSTOM_BACKWARDS))
def test_custom_backward_products_take_the_emulated_path(monkeypatch, name: str) -> None:
    """The products of a custom backward (the fused loss's, the CPU attention scores'), which
    no torch-function mode sees, go through ``product``: without native bf16 they multiply in
    fp32, with it in bf16, and the two give the same gradients bit for bit where the sums are
    exact."""
    real_matmul = torch.matmul
    leaves, forward = CUSTOM_BACKWARDS[name]()
    grads, operand_dtypes = {}, {}
    for native in (True, False):
        monkeypatch.setattr(mixed_precision, "_native_bf16_cpu", lambda native=native: native)
        loss = forward()
        seen = operand_dtypes[native] = []

        def spy(a, b, seen=seen, **kwargs):
            seen.append((a.dtype, b.dtype))
            return real_matmul(a, b, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(torch, "matmul", spy)  # the backward's products, and only they
            for leaf in leaves:
                leaf.grad = None
            loss.backward()
        grads[native] = [leaf.grad.clone() for leaf in leaves]
        a, b = dyadic(6, 32, seed=3).bfloat16(), dyadic(32, 5, seed=4).bfloat16()
        assert torch.equal(mixed_precision.product(a, b), real_matmul(a, b))  # exact sums
    assert operand_dtypes[True] == [(torch.bfloat16, torch.bfloat16)] * 2
    assert operand_dtypes[False] == [(torch.float32, torch.float32)] * 2
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))
    assert all(g.abs().sum() > 0 for g in grads[False])


@pytest.mark.slow  # native bf16 generation takes seconds on such a CPU
def test_a_bf16_model_generates_with_emulated_products_on_such_a_cpu(monkeypatch) -> None:
    """``model.generate`` of a bf16 model (Hugging Face's and the library's spelling) takes
    the emulated products where bf16 is not native, and greedy decoding picks the same
    tokens as the native products."""
    from tests.support.families import tiny_ode_transformer

    torch.manual_seed(0)
    model = tiny_ode_transformer(block="rk4").eval().to(torch.bfloat16)
    ids = torch.tensor([[1, 5, 7, 2]])
    native = model.generate(ids, max_new_tokens=6, do_sample=False)
    native_library = model.generate(ids, 6)
    calls = spied_mode(monkeypatch, native=False)
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), native)
    assert torch.equal(model.generate(ids, 6), native_library)
    assert any(func in mixed_precision.PRODUCTS for func in calls)
    calls.clear()
    model.float().generate(ids, max_new_tokens=2, do_sample=False)
    assert not calls  # an fp32 model never enters the mode
