"""Depth-dependent weights of the depth field: every linear map of ``F`` is a function of ``s``.

Two parameterisations of the field's four linear maps (attention ``qkv`` and ``out``, FFN
``fc1`` and ``fc2``), as in DiffEqFormer (Tong et al., ICLR 2025):

* ``weights`` (``BasisLinear``): ``W(s) = sum_k phi_k(s) W_k`` (and the bias alike)
  over ``K`` shifted Legendre polynomials ``phi_k(s) = P_k(2 s / S - 1)`` on ``[0, S]``.
  ``phi_0 = 1``, so ``W_0`` is the ``nn.Linear``'s own weight (initialised as today's) and
  ``W_1 .. W_{K-1}`` start at zero: ``K = 1`` *is* the shared field (the maps are not even
  replaced), and an untrained ``K > 1`` field equals it;
* ``hypernetwork`` (``LowRankLinear``): ``W(s) = W + A diag(g(s)) B`` with rank-``r``
  factors ``A``, ``B`` per map and ``g = L2 tanh(L1 (s / S))`` one small network of the
  field (``HIDDEN`` units, every map's ``r`` gates at once); ``L2`` starts at zero, so the
  update starts at exactly zero and the field equals the shared one.

The effective weight is formed once per evaluation of ``F`` (matrix products the FLOPs
counter sees: ``2 (K - 1)`` or ``2 r`` times the map's size per evaluation, shared by every
token of the batch) and applied by one ``F.linear``. New parameters are drawn from a fork of
the global RNG, so the shared weights are the ones ``time_conditioning: none`` draws.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["HIDDEN", "BasisLinear", "DepthWeights", "LowRankLinear", "legendre"]

HIDDEN = 32
"""Hidden units of the hypernetwork ``g(s)``."""


def legendre(s: torch.Tensor, count: int, length: float) -> torch.Tensor:
    """``[P_0(x), ..., P_{count-1}(x)]`` at ``x = 2 s / length - 1`` (Bonnet's recurrence),
    on the device and in the dtype of ``s``."""
    x = 2.0 * s / length - 1.0
    values = [torch.ones_like(x), x]
    for k in range(1, count - 1):
        values.append(((2 * k + 1) * x * values[k] - k * values[k - 1]) / (k + 1))
    return torch.stack(values[:count])


def _adopt(cls: type[nn.Linear], linear: nn.Linear) -> nn.Linear:
    """An instance of ``cls`` holding ``linear``'s own parameters (no RNG drawn)."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.in_features, new.out_features = linear.in_features, linear.out_features
    new.weight, new.bias = linear.weight, linear.bias
    return new


class BasisLinear(nn.Linear):
    """``x W(s)^T + b(s)`` with ``W(s) = W + sum_{k>=1} c_k W_k``; the field sets the
    coefficients ``c = [phi_1(s), ..., phi_{K-1}(s)]`` before each evaluation."""

    coefficients: torch.Tensor | None

    @classmethod
    def from_linear(cls, linear: nn.Linear, count: int) -> BasisLinear:
        """``linear`` (its weight and bias as ``W_0``, ``b_0``) with ``count - 1`` more terms,
        zero at first."""
        new = _adopt(cls, linear)
        weight = linear.weight
        new.basis_weight = nn.Parameter(weight.new_zeros(count - 1, *weight.shape))
        new.basis_bias = nn.Parameter(weight.new_zeros(count - 1, weight.shape[0]))
        new.coefficients = None
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.coefficients.to(self.weight.dtype)[None]
        weight = self.weight + (c @ self.basis_weight.flatten(1)).view_as(self.weight)
        bias = self.bias + (c @ self.basis_bias).view_as(self.bias)
        return F.linear(x, weight, bias)


class LowRankLinear(nn.Linear):
    """``x (W + A diag(g) B)^T + b``; the field sets the gates ``g`` (``[rank]``) before each
    evaluation."""

    gates: torch.Tensor | None

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int) -> LowRankLinear:
        """``linear`` with rank-``rank`` factors drawn so that ``A diag(g) B`` has entries of
        the base weights' scale (0.02) where the gates are of order one."""
        new = _adopt(cls, linear)
        out_features, in_features = linear.weight.shape
        std = (0.02 / rank**0.5) ** 0.5
        new.lora_left = nn.Parameter(torch.randn(out_features, rank) * std)
        new.lora_right = nn.Parameter(torch.randn(rank, in_features) * std)
        new.gates = None
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = (self.lora_left * self.gates.to(self.weight.dtype)) @ self.lora_right
        return F.linear(x, self.weight + update, self.bias)


class DepthWeights(nn.Module):
    """The depth dependence of one field's linear maps (``weights`` or ``hypernetwork``):
    ``set_time`` gives every map its coefficients or gates for the depth ``s``.

    The maps are replaced in place in their parents (same parameter names as the shared
    field's, plus ``basis_*`` or ``lora_*``); this module holds only the hypernetwork.
    """

    def __init__(
        self, parents: list[tuple[nn.Module, str]], mode: str, size: int, length: float
    ) -> None:
        super().__init__()
        self.mode, self.size, self.length = mode, size, float(length)
        maps: list[nn.Linear] = []
        with torch.random.fork_rng(devices=[]):
            for parent, name in parents:
                linear = getattr(parent, name)
                if mode == "weights":
                    new = BasisLinear.from_linear(linear, size)
                else:
                    new = LowRankLinear.from_linear(linear, size)
                setattr(parent, name, new)
                maps.append(new)
            if mode == "hypernetwork":
                self.hidden_weight = nn.Parameter(torch.randn(HIDDEN) * 2.0)
                self.hidden_bias = nn.Parameter(torch.randn(HIDDEN))
                self.gate_weight = nn.Parameter(torch.zeros(len(maps) * size, HIDDEN))
                self.gate_bias = nn.Parameter(torch.zeros(len(maps) * size))
        self.maps = tuple(maps)  # not registered again: they live in their parents

    def set_time(self, s: torch.Tensor) -> None:
        """Coefficients (``weights``) or gates (``hypernetwork``) of every map at depth ``s``."""
        if self.mode == "weights":
            coefficients = legendre(s, self.size, self.length)[1:]
            for linear in self.maps:
                linear.coefficients = coefficients
            return
        u = (s / self.length).to(self.hidden_weight.dtype)
        hidden = torch.tanh(u * self.hidden_weight + self.hidden_bias)
        gates = F.linear(hidden[None], self.gate_weight, self.gate_bias).view(len(self.maps), -1)
        for linear, row in zip(self.maps, gates):
            linear.gates = row


def extra_parameters(mode: str, size: int, d_model: int, d_ff: int) -> int:
    """Parameters ``weights`` (``size = K``) or ``hypernetwork`` (``size = r``) add to one
    field of width ``d_model`` and FFN ``d_ff`` (0 for the other modes)."""
    shapes = [(3 * d_model, d_model), (d_model, d_model), (d_ff, d_model), (d_model, d_ff)]
    if mode == "weights":
        return (size - 1) * sum(o * i + o for o, i in shapes)
    if mode == "hypernetwork":
        return (
            sum(size * (o + i) for o, i in shapes) + 2 * HIDDEN + len(shapes) * size * (HIDDEN + 1)
        )
    return 0
