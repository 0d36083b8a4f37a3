"""The library's one Runge-Kutta core: Butcher tableaux as validated data, one registry of
named methods ([`TABLEAUX`][ode_transformer.TABLEAUX]) and one explicit stage loop
([`rk_stage_values`][ode_transformer.rk_stage_values]).

An explicit s-stage method is a strictly lower-triangular ``A`` (s x s) and weights ``b``
(length s): ``F_i = F(y + h sum_j A[i][j] F_j)``, ``y_next = y + h sum_i b_i F_i``. The RK
blocks of ``ode_transformer.blocks``, the fixed grids of ``node-transformer``
(``neuralode_lm.depth_field``) and the solver facade's fixed-grid methods all step through
[`rk_stage_values`][ode_transformer.rk_stage_values], so a new method is a new tableau, not a new
code path (every list of method names is computed from ``TABLEAUX``: ``METHODS``, ``BLOCKS``),
and one name means one method everywhere: ``rk4`` is the classic RK4, ``rk4_38`` Kutta's
3/8 rule (torchdiffeq's ``rk4``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .errors import ODETransformerConfigError


@dataclass(frozen=True)
class Tableau:
    """An explicit Runge-Kutta method: strictly lower-triangular ``A`` and weights ``b``."""

    A: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    name: str = "custom"

    def __post_init__(self) -> None:
        A = _as_matrix(self.A)
        b = _as_vector(self.b, "b")
        s = len(b)
        if s == 0:
            raise ODETransformerConfigError(
                "a tableau needs at least one stage: b must not be empty"
            )
        if len(A) != s or any(len(row) != s for row in A):
            shape = f"{len(A)} x {[len(row) for row in A]}"
            raise ODETransformerConfigError(
                f"tableau shapes do not match: b has {s} entries so A must be {s} x {s}, "
                f"got rows of lengths {shape}"
            )
        for i in range(s):
            for j in range(i, s):
                if A[i][j] != 0.0:
                    raise ODETransformerConfigError(
                        f"tableau A must be strictly lower-triangular (explicit method), but "
                        f"A[{i}][{j}] = {A[i][j]}; stage {i} may only use stages 0..{i - 1}"
                    )
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "b", b)

    @property
    def stages(self) -> int:
        """Number of stages s (evaluations of F per block)."""
        return len(self.b)

    @property
    def c(self) -> tuple[float, ...]:
        """Stage times ``c_i = sum_j A[i][j]``."""
        return tuple(sum(row) for row in self.A)

    def stability_polynomial(self) -> list[float]:
        """Coefficients ``[r_0, ..., r_s]`` of ``R(z) = 1 + z b^T (I - zA)^{-1} 1``.

        For ``F(y) = M y`` one block maps ``y`` to ``R(M) y``; as ``A`` is nilpotent,
        ``r_0 = 1`` and ``r_{k+1} = b^T A^k 1``.
        """
        s = self.stages
        coeffs = [1.0]
        power = [1.0] * s  # A^k 1, starting at k = 0
        for _ in range(s):
            coeffs.append(sum(bi * pi for bi, pi in zip(self.b, power)))
            power = [sum(self.A[i][j] * power[j] for j in range(s)) for i in range(s)]
        return coeffs

    def order(self, tol: float = 1e-12) -> int:
        """Classical order of accuracy (0 to 4) from the rooted-tree order conditions."""
        s, A, b, c = self.stages, self.A, self.b, self.c

        def mat(v: Sequence[float]) -> list[float]:
            return [sum(A[i][j] * v[j] for j in range(s)) for i in range(s)]

        def dot(u: Sequence[float], v: Sequence[float]) -> float:
            return sum(x * y for x, y in zip(u, v))

        ones = [1.0] * s
        c2 = [x * x for x in c]
        conditions = [
            [(dot(b, ones), 1.0)],
            [(dot(b, c), 1 / 2)],
            [(dot(b, c2), 1 / 3), (dot(b, mat(c)), 1 / 6)],
            [
                (dot(b, [x**3 for x in c]), 1 / 4),
                (dot(b, [x * y for x, y in zip(c, mat(c))]), 1 / 8),
                (dot(b, mat(c2)), 1 / 12),
                (dot(b, mat(mat(c))), 1 / 24),
            ],
        ]
        order = 0
        for level in conditions:
            if all(abs(value - exact) <= tol for value, exact in level):
                order += 1
            else:
                break
        return order


def _as_vector(values: Sequence[float], what: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError) as err:
        raise ODETransformerConfigError(
            f"tableau {what} must be a sequence of numbers, got {values!r}"
        ) from err
    if not all(math.isfinite(v) for v in out):
        raise ODETransformerConfigError(f"tableau {what} must be finite, got {out}")
    return out


def _as_matrix(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    try:
        return tuple(_as_vector(row, "A row") for row in rows)
    except TypeError as err:
        raise ODETransformerConfigError(
            f"tableau A must be a list of rows of numbers, got {rows!r}"
        ) from err


TABLEAUX: dict[str, Tableau] = {
    "residual": Tableau(A=((0.0,),), b=(1.0,), name="residual"),
    "rk2": Tableau(A=((0.0, 0.0), (1.0, 0.0)), b=(0.5, 0.5), name="rk2"),
    "rk2_gamma1": Tableau(A=((0.0, 0.0), (1.0, 0.0)), b=(1.0, 1.0), name="rk2_gamma1"),
    "rk3": Tableau(
        A=((0.0, 0.0, 0.0), (0.5, 0.0, 0.0), (-1.0, 2.0, 0.0)),
        b=(1 / 6, 4 / 6, 1 / 6),
        name="rk3",
    ),
    "rk4": Tableau(
        A=((0.0, 0.0, 0.0, 0.0), (0.5, 0.0, 0.0, 0.0), (0.0, 0.5, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0)),
        b=(1 / 6, 2 / 6, 2 / 6, 1 / 6),
        name="rk4",
    ),
    "rk4_38": Tableau(
        A=(
            (0.0, 0.0, 0.0, 0.0),
            (1 / 3, 0.0, 0.0, 0.0),
            (-1 / 3, 1.0, 0.0, 0.0),
            (1.0, -1.0, 1.0, 0.0),
        ),
        b=(1 / 8, 3 / 8, 3 / 8, 1 / 8),
        name="rk4_38",
    ),
    "midpoint": Tableau(A=((0.0, 0.0), (0.5, 0.0)), b=(0.0, 1.0), name="midpoint"),
}
"""The library's one registry of named explicit methods (DESIGN.md's table; ``euler`` is an
alias of ``residual``). ``rk4`` is the classic RK4, ``rk4_38`` the 3/8 rule."""
TABLEAUX["euler"] = TABLEAUX["residual"]


def solver_methods() -> tuple[str, ...]:
    """The names of [`TABLEAUX`][ode_transformer.TABLEAUX] that are methods for ``dy/dt = f(t, y)``:
    every consistent tableau (order at least 1; ``rk2_gamma1``, whose weights sum to 2, is a
    block only), in name order, an alias (a second name of the same tableau: ``residual`` is
    ``euler``) left out. Every list of fixed-grid method names in the library is computed
    from this one (solver facade, ``node-transformer`` grids, ``odelm discretize``), so a new
    method is one new entry of ``TABLEAUX``."""
    names: list[str] = []
    for name in sorted(TABLEAUX):
        tableau = TABLEAUX[name]
        if tableau.order() >= 1 and all(TABLEAUX[other] != tableau for other in names):
            names.append(name)
    return tuple(names)


METHODS: tuple[str, ...] = solver_methods()
"""Fixed-grid method names, computed from ``TABLEAUX``: euler, midpoint, rk2, rk3, rk4, rk4_38."""


def get_tableau(spec: str | Tableau | tuple) -> Tableau:
    """A [`Tableau`][ode_transformer.Tableau] from a name in [`TABLEAUX`][ode_transformer.TABLEAUX],
    a ``Tableau`` or a pair ``(A, b)``."""
    if isinstance(spec, Tableau):
        return spec
    if isinstance(spec, str):
        if spec not in TABLEAUX:
            raise ODETransformerConfigError(
                f"unknown tableau {spec!r}; valid: {', '.join(sorted(TABLEAUX))}"
            )
        return TABLEAUX[spec]
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return Tableau(A=spec[0], b=spec[1])
    raise ODETransformerConfigError(
        f"a tableau is a name, a Tableau or a pair (A, b); got {spec!r}"
    )


Stage = Callable[[int, torch.Tensor], torch.Tensor]
"""``f(i, y_i) -> F_i``: the field evaluated for stage ``i`` (the caller knows its time
``t + c_i h`` and, for attention, the stage's own key/value cache)."""


def rk_stage_values(
    tableau: Tableau, f: Stage, y: torch.Tensor, h: float | torch.Tensor = 1.0
) -> list[torch.Tensor]:
    """The stage derivatives ``F_i = f(i, y + h sum_j A[i][j] F_j)`` of one explicit step."""
    values: list[torch.Tensor] = []
    for i, row in enumerate(tableau.A):
        value = f(i, weighted_sum(y, row[:i], values, h))
        values.append(value.to(y.dtype))  # under autocast: a bf16 F, an fp32 state
    return values


def rk_step(
    tableau: Tableau, f: Stage, y: torch.Tensor, h: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """One explicit Runge-Kutta step ``y + h sum_i b_i F_i`` of step size ``h``."""
    return weighted_sum(y, tableau.b, rk_stage_values(tableau, f, y, h), h)


def weighted_sum(
    start: torch.Tensor | None,
    weights: Sequence[float],
    values: Sequence[torch.Tensor],
    h: float | torch.Tensor = 1.0,
) -> torch.Tensor | None:
    """``start + h sum_i w_i v_i`` with one fused multiply-add per nonzero weight (a tensor
    ``h``, as torchdiffeq passes, is multiplied in instead)."""
    total = start
    for weight, value in zip(weights, values):
        if weight == 0.0:
            continue
        if isinstance(h, torch.Tensor):
            term = (weight * h) * value
            total = term if total is None else total + term
            continue
        weight = weight * h
        if total is None:
            total = value if weight == 1.0 else weight * value
        else:
            total = torch.add(total, value, alpha=weight)
    return total
