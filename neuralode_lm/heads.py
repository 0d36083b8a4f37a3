"""Continuous-depth heads: encoder states ``[B, T, D]`` -> logits ``[B, T, V]``.

* [`CausalODEHead`][neuralode_lm.CausalODEHead] (the default, a valid language model): every
  position's encoder state is an initial value ``z(0) = h_t``, ``dz/ds = f(s, z)`` on ``s in [0,
  S]`` and ``logits_t = W z(S)``. All ``B * T`` positions are one batch in one solve; with a shared
  adaptive step size it is causal within the solver tolerance (exactly causal settings
  in its docstring).
* [`ReconstructionODEDecoder`][neuralode_lm.ReconstructionODEDecoder] (the NODE-LM report's
  protocol, kept for reproduction): ``z(0)`` is the encoder state of the *last* token, the ODE is
  read out at ``T`` time points ``linspace(0, S, T)``, one per token. The encoder has read the whole
  sentence, so the head is not causal and its perplexity is not a language-model perplexity.

Both heads accept augmentation (Dupont et al. 2019; report section 3.8): the state is
``[z, a]`` with ``a(0)`` zeros or the encoder state at the first real token, and the optional
RNODE regularisers of Finlay et al. (2020), the kinetic energy ``int ||f||^2 ds`` and the
Jacobian Frobenius norm ``int ||df/dz||_F^2 ds`` (Hutchinson estimate), integrated alongside
the state and returned in ``aux["reg"]`` for the training loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from odelm.checkpointing import Checkpointable

from .configs import ODEHeadConfig
from .errors import ModelConfigError
from .fields import as_field, make_field
from .solvers import SolverConfig, solve
from .stats import ForwardStats

__all__ = ["CausalODEHead", "ReconstructionODEDecoder", "RegularizedField"]


class RegularizedField(nn.Module):
    """``[z, e_k, e_j]`` with ``dz = f``, ``de_k = ||f||^2``, ``de_j = ||eps^T df/dz||^2``.

    ``noise`` (``eps``, the state's shape without accumulators) is drawn once per solve, as
    in Finlay et al.; with it ``E[e_j(S)] = int ||df/dz||_F^2 ds``.
    """

    def __init__(self, field: nn.Module, width: int, *, kinetic: bool, jacobian: bool) -> None:
        super().__init__()
        self.field, self.width = field, width
        self.kinetic, self.jacobian = kinetic, jacobian
        self.noise: torch.Tensor | None = None

    @property
    def extra(self) -> int:
        """How many accumulator columns follow the state."""
        return int(self.kinetic) + int(self.jacobian)

    def forward(self, s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        z = x[..., : self.width]
        if not self.jacobian:
            f = self.field(s, z)
            return torch.cat([f, (f * f).sum(-1, keepdim=True)], dim=-1)
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            zz = z if z.requires_grad else z.detach().requires_grad_()
            f = self.field(s, zz)
            (vjp,) = torch.autograd.grad(
                f, zz, self.noise, create_graph=create_graph, allow_unused=True
            )
        if vjp is None:
            vjp = torch.zeros_like(z)
        if not create_graph:
            f, vjp = f.detach(), vjp.detach()
        parts = [f]
        if self.kinetic:
            parts.append((f * f).sum(-1, keepdim=True))
        parts.append((vjp * vjp).sum(-1, keepdim=True))
        return torch.cat(parts, dim=-1)


class _ODEHead(Checkpointable, nn.Module):
    """What both heads share: the field, the solver, augmentation, regularisers, readout."""

    is_causal: bool

    def __init__(
        self,
        dim: int,
        vocab_size: int,
        *,
        field: nn.Module | str = "mlp",
        field_hidden: int | None = None,
        integration_time: float = 1.0,
        solver: SolverConfig | dict[str, Any] | None = None,
        augment_dim: int = 0,
        augment_init: str = "zeros",
        kinetic_weight: float = 0.0,
        jacobian_weight: float = 0.0,
        exact_causal_eval: bool = False,
    ) -> None:
        super().__init__()
        if dim <= 0 or vocab_size <= 0:
            raise ModelConfigError(f"dim and vocab_size must be positive, got {dim}, {vocab_size}")
        ODEHeadConfig(  # the head's options are checked where they are defined, once
            field=field,  # type: ignore[arg-type]  # a FIELDS name or a module
            integration_time=integration_time,
            solver=solver,  # type: ignore[arg-type]  # a SolverConfig too
            augment_dim=augment_dim,
            augment_init=augment_init,  # type: ignore[arg-type]  # checked against the Literal
            kinetic_weight=kinetic_weight,
            jacobian_weight=jacobian_weight,
            exact_causal_eval=exact_causal_eval,
            reconstruction=not self.is_causal,
        )
        self.solver = SolverConfig.coerce(solver)
        self.dim = dim
        self.augment_dim, self.augment_init = augment_dim, augment_init
        self.width = dim + augment_dim
        self.integration_time = float(integration_time)
        self.kinetic_weight, self.jacobian_weight = float(kinetic_weight), float(jacobian_weight)
        self.field = (
            make_field(field, self.width, field_hidden)
            if isinstance(field, str)
            else as_field(field)
        )
        if augment_init == "first" and augment_dim not in (0, dim):
            self.augment_proj: nn.Module = nn.Linear(dim, augment_dim, bias=False)
        else:
            self.augment_proj = nn.Identity()
        self.proj = nn.Linear(self.width, vocab_size)
        self.last_stats = ForwardStats()

    @property
    def vocab_size(self) -> int:
        """The output layer's size, so a resized vocabulary (``resize_token_embeddings``
        replaces ``proj``) reaches the logits."""
        return int(self.proj.out_features)

    def _augment(
        self, z: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append ``a(0)`` to states ``z`` (``[B, ..., D]``) of the sequences in ``hidden``;
        ``"first"`` reads each row's first real token (the first True of ``mask``)."""
        if self.augment_dim == 0:
            return z
        if self.augment_init == "zeros":
            a = z.new_zeros(*z.shape[:-1], self.augment_dim)
        else:
            first = self.augment_proj(_row_states(hidden, mask, last=False))
            a = first.view(first.shape[0], *([1] * (z.dim() - 2)), -1).expand(
                *z.shape[:-1], self.augment_dim
            )
        return torch.cat([z, a], dim=-1)

    def _field(self) -> nn.Module:
        """The vector field, each evaluation recomputed in the backward pass under gradient
        checkpointing."""
        if not self.gradient_checkpointing:
            return self.field
        return _PerEvaluation(self.field, self.checkpointed)

    def _integrate(
        self, z0: torch.Tensor, times: torch.Tensor | float, solver: SolverConfig | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Solve from ``z0`` ``[N, width]``; states ``[len(times), N, width]`` and the reg."""
        kinetic, jacobian = self.kinetic_weight > 0, self.jacobian_weight > 0
        if not (self.training and (kinetic or jacobian)):
            states, stats = solve(self._field(), z0, times, solver or self.solver)
            self.last_stats = ForwardStats((stats,))
            return states, None
        regularized = RegularizedField(
            self._field(), self.width, kinetic=kinetic, jacobian=jacobian
        )
        regularized.noise = torch.randn_like(z0) if jacobian else None
        x0 = torch.cat([z0, z0.new_zeros(z0.shape[0], regularized.extra)], dim=-1)
        states, stats = solve(regularized, x0, times, self.solver)
        self.last_stats = ForwardStats((stats,))
        totals = states[-1, :, self.width :].mean(0)
        weights = [w for w in (self.kinetic_weight, self.jacobian_weight) if w > 0]
        reg = sum(w * total for w, total in zip(weights, totals))
        return states[..., : self.width], reg

    def _aux(self, reg: torch.Tensor | None) -> dict[str, Any]:
        stats = self.last_stats
        aux: dict[str, Any] = {"nfe": stats.nfe_forward}
        if stats.accepted_steps is not None:
            aux["accepted_steps"] = stats.accepted_steps
            aux["rejected_steps"] = stats.rejected_steps
        if reg is not None:
            aux["reg"] = reg
        return aux

    def _check(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> None:
        if hidden.dim() != 3 or hidden.shape[-1] != self.dim:
            raise ModelConfigError(
                f"{type(self).__name__} expects encoder states [B, T, {self.dim}], "
                f"got {tuple(hidden.shape)}"
            )
        if mask is not None and mask.shape != hidden.shape[:2]:
            raise ModelConfigError(
                f"mask must be [B, T] = {tuple(hidden.shape[:2])}, got {tuple(mask.shape)}"
            )


class _PerEvaluation(nn.Module):
    """``field(s, z)`` through ``run`` (``Checkpointable.checkpointed``)."""

    def __init__(self, field: nn.Module, run: Any) -> None:
        super().__init__()
        self.field = field
        self.__dict__["run"] = run  # a bound method of the head: not a submodule

    def forward(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.run(self.field, s, z)  # type: ignore[no-any-return]


def _row_states(hidden: torch.Tensor, mask: torch.Tensor | None, *, last: bool) -> torch.Tensor:
    """Each row's state ``[B, D]`` at its first (or last) real token; without a mask, at
    position 0 (or ``T - 1``)."""
    length = hidden.shape[1]
    if mask is None:
        return hidden[:, length - 1 if last else 0]
    real = mask.bool()
    index = length - 1 - real.flip(-1).int().argmax(-1) if last else real.int().argmax(-1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


class CausalODEHead(_ODEHead):
    """``z(0) = h_t``, integrate ``s in [0, S]``, ``logits_t = W z(S)``; one solve per batch.

    Each position evolves from its own encoder state (with ``"first"`` augmentation, also
    from the first token's, which precedes every position). With an adaptive method on
    torchdiffeq or TorchDyn all ``B * T`` positions share one step size, chosen from the
    error of every position: a later token can change the steps, and so the logits of an
    earlier one (and of other sentences in the batch), by up to about the solver
    tolerance. The head is causal within that tolerance, not exactly. Exactly causal
    settings: a fixed-grid method, ``backend="torchode"`` (step control per position), or
    ``exact_causal_eval=True``, which evaluates (``model.eval()``) with torchode's
    per-position step control at the same method and tolerances while training keeps the
    configured solver.
    """

    is_causal = True
    solve_rows_alone = False
    """Set (by a model's ``batch_invariant`` option, [`odelm.hf`][odelm.hf]): evaluation
    solves with torchode's per-position step control, so a position's logits do not depend
    on the batch around it (as ``exact_causal_eval``; training keeps the shared steps)."""

    def __init__(
        self, dim: int, vocab_size: int, *, exact_causal_eval: bool = False, **options: Any
    ) -> None:
        super().__init__(dim, vocab_size, exact_causal_eval=exact_causal_eval, **options)
        self.exact_causal_eval = bool(exact_causal_eval)
        self.eval_solver = self.solver
        self.per_row_solver = self.solver  # batch-invariant: each position's own steps
        if not self.solver.fixed:
            self.per_row_solver = SolverConfig.coerce(
                self.solver,
                backend="torchode",
                adjoint=False,
                adjoint_method=None,
                adjoint_rtol=None,
                adjoint_atol=None,
            )
        if self.exact_causal_eval:
            self.eval_solver = self.per_row_solver

    @property
    def active_solver(self) -> SolverConfig:
        """The solver of the next forward: the configured one in training; in evaluation
        ``eval_solver``, or each position's own steps when told to solve rows alone."""
        if self.training:
            return self.solver
        return self.per_row_solver if self.solve_rows_alone else self.eval_solver

    @property
    def exactly_causal(self) -> bool:
        """Whether no position's logits depend on a later one in the next forward: the
        active solver steps on a fixed grid or controls each position's steps (torchode)."""
        return self.active_solver.fixed or self.active_solver.backend == "torchode"

    def forward(
        self, hidden: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Logits ``[B, T, V]``; ``mask`` (True on real tokens) only tells ``"first"``
        augmentation where each row's first real token is."""
        self._check(hidden, mask)
        batch, length, _ = hidden.shape
        z0 = self._augment(hidden, hidden, mask).reshape(batch * length, self.width)
        # [0, T] as a number: the facade makes it on the device and grids it on the host,
        # with no copy from the host and no read back (issue 30)
        states, reg = self._integrate(z0, self.integration_time, self.active_solver)
        logits = self.proj(states[-1]).view(batch, length, self.vocab_size)
        return logits, self._aux(reg)


class ReconstructionODEDecoder(_ODEHead):
    """The report's decoder: ``z(0) = h_{T-1}``, read out at ``linspace(0, S, T)``.

    Faithful to sections 3.6-3.8: the encoder (LSTM or GPT-2 layer 12) reads the whole
    sentence, its last state starts the ODE, and a linear layer maps the state at the
    ``k``-th time point to the logits for token ``k + 1``. Not causal.
    """

    is_causal = False

    def forward(
        self, hidden: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Logits ``[B, T, V]``; with ``mask`` the ODE starts from each row's last real token."""
        self._check(hidden, mask)
        length = hidden.shape[1]
        z0 = self._augment(_row_states(hidden, mask, last=True), hidden, mask)
        if length == 1:
            self.last_stats = ForwardStats()
            return self.proj(z0)[:, None], self._aux(None)
        dtype = torch.promote_types(z0.dtype, torch.float32)  # bf16 states: fp32 times
        times = torch.linspace(0.0, self.integration_time, length, dtype=dtype, device=z0.device)
        states, reg = self._integrate(z0, times)
        return self.proj(states.transpose(0, 1)), self._aux(reg)
