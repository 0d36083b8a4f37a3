"""A continuous-depth Transformer LM: one causal attention + FFN vector field, solved as an ODE.

The depth field ``F_theta(s, y)`` (the ODE Transformer's pre-norm attention + FFN function,
optionally conditioned on ``s``) and the fixed-grid integrator driven by Butcher tableaux
live in ``neuralode_lm.depth_field``. This module is the model: token + position
embeddings, ``n_layers`` depth ODEs ``dy/ds = F_k(s, y)`` on ``s in [0, S]``, final
LayerNorm, tied softmax.

Two ways to solve each block:

* an adaptive method of the solver facade (dopri5, bosh3, ...; adjoint or direct). All
  positions of a batch share one step size, so later tokens influence the step sizes and
  hence (within the tolerance) earlier logits; ``causal_mode="prefix"`` solves every prefix
  alone in evaluation, which is exactly causal at ``T`` solves per sequence;
* a fixed grid (``steps`` per block, or ``solver.step_size``) of a tableau: ``euler``,
  ``midpoint``, ``rk2``, ``rk3``, ``rk4`` (the classic RK4, as everywhere in the library),
  ``rk4_38`` (the 3/8 rule). Exactly causal; generation keeps a cache per (step, stage).

With ``rk4``, one step and ``S = 1`` a block *is* an ODE Transformer RK4 block (tested).
"""

from __future__ import annotations

import typing
from typing import Any

import torch
from torch import nn

from ode_transformer.backbone import init_weights
from ode_transformer.layers import NO_CONTEXT, AttentionContext, KVCache, padded_positions
from odelm.hf import HuggingFaceLM
from odelm.mixed_precision import Dropout
from odelm.pretrained import PretrainedMixin

from .configs import RENAMED, CausalMode, NODETransformerConfig, from_options
from .depth_field import GRID_TABLEAUX, DepthField, FixedGrid, MaskedField
from .encoders import check_token_batch
from .errors import ModelConfigError
from .heads import RegularizedField
from .solvers import FIXED_METHODS, SolverConfig, SolverStats, solve
from .solvers.config import grid_steps
from .stats import ForwardStats

__all__ = ["CAUSAL_MODES", "NODETransformerLM", "looped"]

CAUSAL_MODES = typing.get_args(CausalMode)
DEFAULT_BASIS, DEFAULT_RANK = 4, 4
"""``weight_basis`` and ``hypernetwork_rank`` when the config leaves them null."""


def looped(loops: int) -> dict[str, Any]:
    """The ``model:`` keys of a looped (weight-tied, recurrent-depth) block applied ``loops``
    times: ``integration_time = loops`` solved by ``loops`` Euler steps of size 1, each step
    ``y + F(y)`` being one pre-norm block with its full residual (``F`` never includes it)."""
    if isinstance(loops, bool) or not isinstance(loops, int) or loops < 1:
        raise ModelConfigError(f"loops must be a positive integer, got {loops!r}")
    return {"integration_time": float(loops), "solver": {"method": "euler"}, "steps": loops}


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _integration(
    solver: SolverConfig | dict[str, Any] | None, steps: int | None, length: float
) -> SolverConfig | FixedGrid:
    """A ``FixedGrid`` for the grid methods (``GRID_TABLEAUX``), else the facade's config
    (whose default step cap makes a runaway solve raise). A grid takes ``steps`` per block or,
    as an ODE head does, ``solver.step_size``: the fewest equal steps no longer than it."""
    if isinstance(solver, FixedGrid):
        return solver
    options = dict(solver or {}) if not isinstance(solver, SolverConfig) else None
    method = solver.method if options is None else options.get("method", "dopri5")
    if method in GRID_TABLEAUX:
        extra = sorted(set(options or {}) - {"method", "step_size"})
        if options is None or extra:
            raise ModelConfigError(
                f"the fixed-grid method {method!r} is integrated by the model itself and takes "
                f"only `steps` (a model key) or solver.step_size; drop solver options {extra}"
            )
        step_size = options.get("step_size")
        if step_size is not None:
            if steps is not None:
                raise ModelConfigError("give steps or solver.step_size, not both")
            if not (isinstance(step_size, (int, float)) and step_size > 0):
                raise ModelConfigError(f"step_size must be positive, got {step_size!r}")
            steps = grid_steps(torch.tensor([0.0, length], dtype=torch.float64), step_size)
        return FixedGrid(method, 1 if steps is None else steps)
    if steps is not None:
        raise ModelConfigError(
            f"steps applies to fixed-grid methods ({', '.join(GRID_TABLEAUX)}), not to the "
            f"adaptive {method!r}; set solver.rtol/atol instead"
        )
    config = SolverConfig.coerce(options if options is not None else solver)
    if config.method in FIXED_METHODS:
        raise ModelConfigError(
            f"fixed-grid methods are run by the model: solver: {{method: {method}}}"
        )
    if config.backend == "torchode":
        raise ModelConfigError(
            "the depth field mixes positions through attention, but torchode controls each "
            "row's step separately; use backend torchdiffeq or torchdyn"
        )
    return config


class NODETransformerLM(PretrainedMixin, HuggingFaceLM):
    """Causal LM whose depth is ``n_layers`` ODEs ``dy/ds = F_k(s, y)``, ``s in [0, S]``.

    ``solver``: a facade config or dict for adaptive solves (e.g. ``{"method": "dopri5",
    "rtol": 1e-3, "adjoint": True}``), or ``{"method": "rk4"}`` with ``steps`` for a fixed
    grid. ``kinetic_weight``/``jacobian_weight``: the RNODE regularisers, added to the loss
    through ``aux["reg"]`` in training. ``causal_mode``: ``"shared"`` (one solve per batch)
    or ``"prefix"`` (evaluation solves every prefix alone: exactly causal, adaptive only).
    ``dropout`` acts on the embeddings, ``field_dropout`` inside ``F`` (keep it 0 for
    adaptive solvers: a new mask per evaluation makes the field random).
    """

    is_causal = True
    solve_rows_alone = False
    """Set (by the ``batch_invariant`` option, [`odelm.hf`][odelm.hf]): an adaptive evaluation
    solves each sequence alone, so its logits do not depend on the batch (training keeps
    one solve per batch)."""

    config_class = NODETransformerConfig
    renamed_keys = RENAMED

    def __init__(
        self, vocab_size: int, config: NODETransformerConfig | None = None, **options: Any
    ) -> None:
        """Options are [`NODETransformerConfig`][neuralode_lm.NODETransformerConfig] fields (or
        ``config=``, with options replacing its fields)."""
        super().__init__()
        config = from_options(NODETransformerConfig, options, config)
        self.config = config
        d_model, n_heads, d_ff = config.d_model, config.n_heads, config.d_ff
        max_positions, integration_time = config.max_positions, config.integration_time
        kinetic_weight, jacobian_weight = config.kinetic_weight, config.jacobian_weight
        causal_mode, layer_norm_eps = config.causal_mode, config.layer_norm_eps
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ModelConfigError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.vocab_size, self.max_positions = vocab_size, max_positions
        self.integration_time = float(integration_time)
        self.kinetic_weight, self.jacobian_weight = float(kinetic_weight), float(jacobian_weight)
        self.causal_mode = causal_mode
        self.integration = _integration(config.solver, config.steps, self.integration_time)
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_positions, d_model)
        self.dropout = Dropout(config.dropout)
        self.fields = nn.ModuleList(
            DepthField(
                d_model,
                n_heads,
                d_ff,
                dropout=config.field_dropout,
                time_conditioning=config.time_conditioning,
                eps=layer_norm_eps,
                weight_basis=_or(config.weight_basis, DEFAULT_BASIS),
                hypernetwork_rank=_or(config.hypernetwork_rank, DEFAULT_RANK),
                length=self.integration_time,
            )
            for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(init_weights)
        self.head.weight = self.token_embedding.weight
        self.last_stats = ForwardStats()

    @property
    def solver_stats(self) -> ForwardStats:
        """Statistics of the latest forward pass, one solve per block."""
        return self.last_stats

    @property
    def exactly_causal(self) -> bool:
        """True on a fixed grid or with per-prefix evaluation solves."""
        return isinstance(self.integration, FixedGrid) or (
            self.causal_mode == "prefix" and not self.training
        )

    def block_modules(self) -> list[nn.Module]:
        return list(self.fields)

    def set_integration(
        self, solver: SolverConfig | dict[str, Any] | FixedGrid, steps: int | None = None
    ) -> None:
        """Solve the same trained fields another way (``odelm discretize`` uses this)."""
        self.integration = _integration(solver, steps, self.integration_time)

    # -------------------------------------------------------------------------------------

    def _solve_block(
        self, field: nn.Module, y: torch.Tensor, context: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor | None, SolverStats]:
        """``y(S)`` of one block, in training with weights its RNODE regulariser (the
        kinetic / Jacobian integrals ride along as extra state columns), and its solve;
        ``context``: the block's key/value cache and the padding mask."""
        kinetic, jacobian = self.kinetic_weight > 0, self.jacobian_weight > 0
        regularized = None
        wrapped = self.training and (kinetic or jacobian)
        if context.attention_mask is not None and context.cache is None:
            # a solver (or the regulariser) calls F(s, y): the mask is bound to the field
            field, context = MaskedField(field, context), NO_CONTEXT
        cache = context if not context.is_empty else None
        if wrapped:
            regularized = RegularizedField(field, y.shape[-1], kinetic=kinetic, jacobian=jacobian)
            regularized.noise = torch.randn_like(y) if jacobian else None
            x0 = torch.cat([y, y.new_zeros(*y.shape[:-1], regularized.extra)], dim=-1)
        target, x0 = (field, y) if regularized is None else (regularized, x0)
        if isinstance(self.integration, FixedGrid):
            nfe = self.integration.nfe
            steps = self.integration.steps
            stats = SolverStats("model", self.integration.method, "direct", nfe, 0, steps, 0)
            final = self.integration.integrate(target, x0, self.integration_time, cache)
        else:
            if cache is not None:
                raise ModelConfigError(
                    "a key/value cache needs a fixed grid (its stages sit at fixed depths); "
                    "adaptive solves generate by recomputing the prefix"
                )
            times = torch.linspace(0.0, self.integration_time, 2, dtype=y.dtype, device=y.device)
            states, stats = solve(target, x0, times, self.integration)
            final = states[-1]
        if regularized is None:
            return final, None, stats
        width = y.shape[-1]
        totals = final[..., width:].reshape(-1, regularized.extra).mean(0)
        weights = [w for w in (self.kinetic_weight, self.jacobian_weight) if w > 0]
        return final[..., :width], sum(w * t for w, t in zip(weights, totals)), stats

    def final_state(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The state after the last block (before the final LayerNorm) and the regulariser;
        with a ``cache`` the tokens continue the cached sequence; ``attention_mask`` (True on
        real tokens, over the cached tokens and these) hides padding from attention and
        counts each row's positions over its real tokens."""
        start = 0 if cache is None else cache.position
        check_token_batch(tokens, self.vocab_size, self.max_positions, offset=start)
        positions = padded_positions(attention_mask, start, tokens.shape[1], tokens.device)
        y = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        reg, solves = None, []
        context = AttentionContext(cache, attention_mask)
        for index, field in enumerate(self.fields):
            y, block_reg, stats = self._solve_block(field, y, context.child(index))
            solves.append(stats)
            if block_reg is not None:
                reg = block_reg if reg is None else reg + block_reg
        if cache is not None:
            cache.position += tokens.shape[1]
        self.last_stats = ForwardStats(tuple(solves))
        return y, reg

    def _alone_states(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None, prefixes: bool
    ) -> torch.Tensor:
        """Final states with every sequence solved alone, on its real tokens only (padding's
        states are zeros): batch-invariant; with ``prefixes`` every prefix alone too (exactly
        causal)."""
        rows, stats = [], []
        for b in range(tokens.shape[0]):
            real = tokens[b] if attention_mask is None else tokens[b][attention_mask[b].bool()]
            if prefixes:
                row = []
                for t in range(real.shape[0]):
                    y, _ = self.final_state(real[None, : t + 1])
                    row.append(y[0, -1])
                    stats.extend(self.last_stats.solves)
                states = torch.stack(row)
            else:
                states = self.final_state(real[None])[0][0]
                stats.extend(self.last_stats.solves)
            if attention_mask is not None:
                states = states.new_zeros(tokens.shape[1], states.shape[-1]).masked_scatter(
                    attention_mask[b, :, None].bool(), states
                )
            rows.append(states)
        self.last_stats = ForwardStats(tuple(stats))
        return torch.stack(rows)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Logits ``[B, T, V]``; ``aux``: ``nfe`` (evaluations of ``F`` per forward pass,
        summed over blocks; per prefix solve on average in prefix mode), accepted/rejected
        steps, ``exactly_causal`` and, in training with regularisers, ``reg``;
        ``attention_mask``: see [`final_state`][neuralode_lm.NODETransformerLM.final_state]."""
        hidden, aux = self.features(tokens, cache, attention_mask)
        return self.head(hidden), aux

    @property
    def output_layer(self) -> nn.Linear:
        """The tied softmax layer: ``forward(tokens)`` is ``(output_layer(hidden), aux)`` of
        [`features`][neuralode_lm.NODETransformerLM.features]."""
        return self.head

    def features(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The final LayerNorm's states ``[B, T, d_model]`` and
        [`forward`][neuralode_lm.NODETransformerLM.forward]'s ``aux``."""
        adaptive = not isinstance(self.integration, FixedGrid) and not self.training
        prefix = adaptive and self.causal_mode == "prefix" and cache is None
        alone = adaptive and self.solve_rows_alone and cache is None and tokens.shape[0] > 1
        if prefix or alone:
            y, reg = self._alone_states(tokens, attention_mask, prefixes=prefix), None
        else:
            y, reg = self.final_state(tokens, cache, attention_mask)
        stats = self.solver_stats
        solves = max(1, len(stats.solves) // len(self.fields))
        aux: dict[str, Any] = {
            "nfe": stats.nfe_forward if solves == 1 else stats.nfe_forward / solves,
            "accepted_steps": stats.accepted_steps,
            "rejected_steps": stats.rejected_steps,
            "exactly_causal": self.exactly_causal,
        }
        if reg is not None:
            aux["reg"] = reg
        return self.norm(y), aux

    def next_token_logits(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` at the last position (a cache needs a fixed grid)."""
        return self(tokens, cache)[0][:, -1]

    @property
    def init_cache(self) -> type[KVCache] | None:
        """On a fixed grid, the factory of an empty cache (one key/value leaf per block,
        step and stage), which the shared decoding in [`odelm.decoding`][odelm.decoding]
        feeds incrementally; None for adaptive solves, whose steps depend on the whole
        prefix, so decoding recomputes it at every token."""
        return KVCache if isinstance(self.integration, FixedGrid) else None

    def generate(self, *args: Any, **options: Any) -> Any:
        """Continue ``tokens`` with [`odelm.decoding.generate`][odelm.decoding.generate]
        (``generate(tokens, max_new_tokens, strategy=...)``) or Hugging Face's ``generate``
        ([`odelm.hf.HuggingFaceLM.generate`][odelm.hf.model.HuggingFaceLM.generate])."""
        return super().generate(*args, **options)

    # -------------------------------------------------------------------------------------

    @classmethod
    def from_ode_transformer(cls, lm: nn.Module) -> NODETransformerLM:
        """A model sharing the modules of a trained ``ODETransformerLM`` (plain stack,
        ``sublayer="both"``): block ``k`` becomes the field ``F_k`` over ``[0, 1]``, solved
        with the block's own tableau and one step (so it computes what ``lm`` computes when
        the block's coefficients are fixed), or any other way through
        [`set_integration`][neuralode_lm.NODETransformerLM.set_integration]."""
        config = lm.config
        if config.stack != "plain" or config.sublayer != "both":
            raise ModelConfigError(
                "only plain stacks with sublayer='both' have one field per block; got "
                f"stack={config.stack!r}, sublayer={config.sublayer!r}"
            )
        tableau = lm.stack.layers[0].blocks[0].tableau
        method = next((n for n, t in GRID_TABLEAUX.items() if t == tableau), "rk4")
        model = cls(
            config.vocab_size,
            d_model=config.d_model,
            n_heads=config.n_heads,
            d_ff=config.d_ff,
            n_layers=config.n_layers,
            max_positions=config.max_positions,
            solver={"method": method},
            steps=1,
            dropout=config.dropout,
            layer_norm_eps=config.layer_norm_eps,
        )
        model.token_embedding, model.position_embedding = lm.token_embedding, lm.position_embedding
        model.norm, model.head = lm.norm, lm.head
        for field, layer in zip(model.fields, lm.stack.layers):
            field.layer = layer.blocks[0].f
        return model.train(lm.training)
