"""The solver statistics of one forward pass, one type for every continuous-depth model.

An ODE head makes one solve per forward pass, the continuous-depth Transformer one per
block (and one per block and prefix in exact prefix evaluation); both keep them as a
[`ForwardStats`][neuralode_lm.ForwardStats] in ``last_stats`` and show it as ``model.solver_stats``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .solvers import SolverStats

__all__ = ["ForwardStats"]


@dataclass(frozen=True)
class ForwardStats:
    """The solves of one forward pass, summed.

    The sums are read when asked: each solve's ``nfe_backward`` grows while the backward
    pass runs, so read it after ``loss.backward()``. ``accepted_steps`` and
    ``rejected_steps`` are None when a solve does not count them (or there was none).
    """

    solves: tuple[SolverStats, ...] = ()

    def _sum(self, name: str) -> int | None:
        values = [getattr(solve, name) for solve in self.solves]
        return None if not values or None in values else sum(values)

    @property
    def adjoint(self) -> str:
        """How the solves backpropagate (their ``SolverStats.adjoint``; ``"direct"`` for none)."""
        return self.solves[0].adjoint if self.solves else "direct"

    @property
    def nfe_forward(self) -> int:
        """Evaluations of the field in the forward solves."""
        return sum(solve.nfe_forward for solve in self.solves)

    @property
    def nfe_backward(self) -> int:
        """Evaluations in the backward pass (adjoint solves or vector-Jacobian products)."""
        return sum(solve.nfe_backward for solve in self.solves)

    @property
    def accepted_steps(self) -> int | None:
        """Accepted forward steps over all solves."""
        return self._sum("accepted_steps")

    @property
    def rejected_steps(self) -> int | None:
        """Rejected forward steps over all solves."""
        return self._sum("rejected_steps")
