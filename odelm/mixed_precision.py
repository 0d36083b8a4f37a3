"""What a model runs differently under CPU mixed precision (``bf16-mixed``): dropout
masks that are cheap to draw, and attention with low-precision products.

**Dropout.** ``torch.nn.Dropout`` on a CPU draws its mask with ``bernoulli_``, one call of
the random generator per element: about 1 ms for a 20 x 36 x 200 activation on one core,
14% of a bf16 training step of the RK4 Transformer (25 such masks a step), where the matrix
products have become cheap. Inside a CPU autocast region, [`Dropout`][odelm.mixed_precision.Dropout]
instead takes 16 random bits per element from 64-bit draws of the same generator (four elements per
call), keeps an element when its bits fall below ``round(keep * 2**16)``, and scales the kept ones
by the inverse of that quantised keep probability, so the output is unbiased as before;
the keep probability moves by at most ``2**-17`` (0.8 becomes 0.8000031). The mask is
built directly in the activation's dtype and applied as ``x * mask * scale`` (the products
``native_dropout`` computes), in backward ``grad * mask * scale``.

**Attention** ([`attention`][odelm.mixed_precision.attention]): the scores ``q k^T`` in fp32
(bf16-rounded scores made the gradient's error against fp32 a quarter larger), the mask, softmax and
dropout in fp32, the weights' product with ``v`` and the backward products in the low precision, as
FlashAttention does; forward and backward 1.5x faster on a CPU than
``scaled_dot_product_attention`` in fp32 at d_head 100, T 35 (which draws its dropout mask
with ``bernoulli_`` and gathers strided q, k, v), and several times faster than its bf16
kernels.

**Recurrent layers** ([`recurrent_in_fp32`][odelm.mixed_precision.recurrent_in_fp32]): an LSTM under
autocast runs in fp32 on CUDA (autocast would cast cuDNN's LSTM to float16 whatever the autocast
dtype, with no loss scaler under ``bf16-mixed``) and on CPUs without native bf16 products (oneDNN
has no bf16 LSTM there and refuses the call); on CPUs with them it runs in bf16 as before.

**Products on CPUs without native bf16** ([`emulated_products`][odelm.mixed_precision.emulated_products]):
where oneDNN has no bf16 products (no AVX-512 BF16 or AMX), PyTorch multiplies bf16 matrices
in a generic loop, 15-25x slower than fp32. Inside ``emulated_products`` a matrix product
(``linear``, ``matmul``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``) that would run in bf16 (an
autocast region of bf16, or operands all bf16) instead rounds its operands to bf16, multiplies
them in fp32 and rounds the result to bf16: what a native bf16 product computes (exact
products, fp32 sums, one rounding), up to the order of the sums, as another CPU type would
move it. Autograd goes through the roundings, so the backward products are rounded where a
native backward rounds them; the products of a custom ``backward`` (which no torch-function
mode sees) call [`product`][odelm.mixed_precision.product]. Runs on a CPU with native bf16
products are untouched.

Outside autocast (full-precision training, evaluation) and off the CPU,
[`Dropout`][odelm.mixed_precision.Dropout] is ``torch.nn.Dropout`` bit for bit, and the models call
``scaled_dot_product_attention`` as before: fp32 runs draw the same masks from the same generator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

BITS = 16
"""Random bits per element: the keep probability is quantised to ``2**-16``."""


def cpu_mixed_precision(x: torch.Tensor) -> bool:
    """True for a CPU tensor inside an autocast region of a low-precision dtype
    (mixed-precision training), where this module's versions run."""
    if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return False
    return torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16)


def keep_mask(shape: torch.Size, keep: float, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """A mask of ones (kept, with probability ``round(keep * 2**16) / 2**16``) and zeros in
    ``dtype``, from the default CPU generator, and the scale that makes it unbiased."""
    threshold = round(keep * (1 << BITS))
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
    bits = words.view(torch.int16)[:count].view(shape)  # uniform over the 2**16 patterns
    mask = torch.lt(bits, threshold - (1 << (BITS - 1)), out=torch.empty(shape, dtype=dtype))
    return mask, (1 << BITS) / threshold if threshold else 0.0


def masked_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of a CPU tensor with a mask of
    [`keep_mask`][odelm.mixed_precision.keep_mask]."""
    if p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    mask, scale = keep_mask(x.shape, 1.0 - p, x.dtype)
    return x.mul(mask).mul_(scale)  # autograd: grad * mask * scale


def dropout(
    x: torch.Tensor, p: float, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """``F.dropout(x, p, training, inplace)``, with cheaply drawn masks inside a CPU
    mixed-precision region (see the module docstring; there it never works in place)."""
    if not training or p == 0.0 or not cpu_mixed_precision(x):
        return F.dropout(x, p, training, inplace)
    return masked_dropout(x, p)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose masks are cheap to draw under CPU mixed precision
    ([`dropout`][odelm.mixed_precision.dropout]); the same module otherwise, with the same
    ``state_dict``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return dropout(input, self.p, self.training, self.inplace)


class _Scores(torch.autograd.Function):
    """``q k^T`` in fp32 from low-precision ``q, k`` (exact products, fp32 sums: what a
    low-precision product computes before it rounds its output); in backward the two
    products in the inputs' dtype, as every other product of mixed precision."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, k)
        return torch.matmul(q.float(), k.float().transpose(-2, -1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k = ctx.saved_tensors
        grad = grad.to(q.dtype)
        return product(grad, k), product(grad.transpose(-2, -1), q)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float = 0.0, causal: bool = False
) -> torch.Tensor:
    """Scaled dot-product attention of ``q, k, v [B, H, T, d]`` (low precision) under CPU
    mixed precision: the scores ``q k^T`` (as ``scaled_dot_product_attention`` in fp32 had
    them), the causal mask, the softmax and dropout ``p`` on the weights
    ([`masked_dropout`][odelm.mixed_precision.masked_dropout]) in fp32; the weights times ``v``, and
    the backward products, in ``v``'s dtype."""
    with torch.autocast("cpu", enabled=False):
        scores = _Scores.apply(q, k).mul(q.shape[-1] ** -0.5)  # not in place: dynamo refuses that
        if causal:
            length, keys = scores.shape[-2:]
            future = torch.ones(length, keys, dtype=torch.bool, device=q.device).triu_(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = masked_dropout(torch.softmax(scores, -1), p)
        return torch.matmul(weights.to(v.dtype), v)


NATIVE_BF16_CPU = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
"""Whether this CPU multiplies bf16 natively (oneDNN: AVX-512 BF16 or AMX); read once, so
that compiled code sees a constant."""


def _native_bf16_cpu() -> bool:
    return NATIVE_BF16_CPU


def recurrent_in_fp32(x: torch.Tensor) -> bool:
    """Whether a recurrent layer fed ``x`` inside an autocast region should run in fp32
    with autocast off (see the module docstring); False outside autocast."""
    device = x.device.type
    if device not in ("cpu", "cuda") or not torch.is_autocast_enabled(device):
        return False
    return device == "cuda" or not _native_bf16_cpu()


PRODUCTS = frozenset(
    {
        F.linear,
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.baddbmm,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.Tensor.__rmatmul__,
        torch.Tensor.mm,
        torch.Tensor.bmm,
        torch.Tensor.addmm,
        torch.Tensor.baddbmm,
    }
)
"""The matrix products [`emulated_products`][odelm.mixed_precision.emulated_products] computes in fp32."""


def _floats(values: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda x: found.append(x) if _is_float(x) else None, values)
    return found


def _is_float(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _runs_in_bf16(operands: list[torch.Tensor]) -> bool:
    """Whether a product of ``operands`` runs in bf16 on the CPU: under a bf16 autocast
    region (which casts them), or with every operand bf16."""
    if not operands or any(x.device.type != "cpu" for x in operands):
        return False
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        return all(x.dtype in (torch.float32, torch.bfloat16) for x in operands)
    return all(x.dtype == torch.bfloat16 for x in operands)


class _EmulatedProducts(TorchFunctionMode):
    """The torch-function mode of [`emulated_products`][odelm.mixed_precision.emulated_products]."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in PRODUCTS or "out" in kwargs or not _runs_in_bf16(_floats((args, kwargs))):
            return func(*args, **kwargs)

        def widened(x: Any) -> Any:  # rounded to bf16 (autograd keeps the rounding), held in fp32
            return x.to(torch.bfloat16).float() if _is_float(x) else x

        with torch.autocast("cpu", enabled=False):
            return func(*tree_map(widened, args), **tree_map(widened, kwargs)).to(torch.bfloat16)


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)``, emulated as in [`emulated_products`][odelm.mixed_precision.emulated_products]
    for bf16 CPU operands on a CPU without native bf16 products: for the products of a custom
    ``backward``, which the autograd engine runs where no torch-function mode sees it."""
    if a.dtype == b.dtype == torch.bfloat16 and a.device.type == "cpu" and not _native_bf16_cpu():
        return torch.matmul(a.float(), b.float()).to(torch.bfloat16)
    return torch.matmul(a, b)


@contextlib.contextmanager
def emulated_products(precision: str) -> Iterator[None]:
    """Inside it, on a CPU without native bf16 products and for a bf16 ``precision``
    (``bf16-mixed``, ``bf16-true``), bf16 matrix products run as fp32 products of bf16-rounded
    operands, rounded to bf16 (see the module docstring); elsewhere it does nothing."""
    if "bf16" not in str(precision) or _native_bf16_cpu():
        yield
        return
    with _EmulatedProducts():
        yield
