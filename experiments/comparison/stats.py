"""Seed statistics for comparisons: mean, sample standard deviation, a seed-paired
difference to a baseline with a two-sided 95% Student-t confidence interval and p-value,
and Holm's step-down adjustment of a family of p-values.

Pairing by seed removes what two models share at one seed (data order, initialisation
stream), so the interval is over the differences ``model(seed) - baseline(seed)`` for the
seeds both ran. With fewer than two pairs no interval exists and it is reported as n/a.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

# Two-sided 95% quantiles t_{0.975, df} of Student's t for df = 1..30 (standard tables).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
# Beyond the table: known anchors, interpolated linearly in 1/df (exact to 3 decimals).
_T975_TAIL = ((30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980), (math.inf, 1.960))


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    (df_lo, t_lo), (df_hi, t_hi) = next(pair for pair in pairwise(_T975_TAIL) if df <= pair[1][0])
    weight = (1 / df_lo - 1 / df) / (1 / df_lo - 1 / df_hi)
    return t_lo + weight * (t_hi - t_lo)


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation (n - 1 in the denominator) of ``n`` values."""

    n: int
    mean: float
    sd: float | None  # None when n < 2
    low: float
    high: float


def summarize(values: Sequence[float]) -> Summary:
    """Mean, sample standard deviation, minimum and maximum of finite values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return Summary(0, math.nan, None, math.nan, math.nan)
    n = len(finite)
    mean = sum(finite) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else None
    return Summary(n, mean, sd, min(finite), max(finite))


@dataclass(frozen=True)
class PairedDifference:
    """``model - baseline`` over seeds both ran: mean, 95% interval, significance."""

    n: int
    mean: float
    ci_low: float | None  # None when n < 2 (no interval: "n/a")
    ci_high: float | None
    p_value: float | None = None  # two-sided paired t-test of mean 0 (None when n < 2)

    @property
    def significant(self) -> bool | None:
        """Whether the 95% interval excludes zero (None when there is no interval)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low > 0 or self.ci_high < 0


def paired_difference(
    model: dict[int, float], baseline: dict[int, float]
) -> PairedDifference | None:
    """Seed-paired ``model[s] - baseline[s]`` with a Student-t 95% interval.

    ``model`` and ``baseline`` map seed to value; seeds missing on either side, and
    non-finite values, are left out. None when no seed pairs up.
    """
    diffs = [
        model[s] - baseline[s]
        for s in sorted(set(model) & set(baseline))
        if math.isfinite(model[s]) and math.isfinite(baseline[s])
    ]
    if not diffs:
        return None
    summary = summarize(diffs)
    if summary.sd is None:
        return PairedDifference(summary.n, summary.mean, None, None)
    error = summary.sd / math.sqrt(summary.n)
    half = t_quantile_975(summary.n - 1) * error
    return PairedDifference(
        summary.n,
        summary.mean,
        summary.mean - half,
        summary.mean + half,
        t_p_value(
            summary.mean / error if error else math.copysign(math.inf, summary.mean), summary.n - 1
        ),
    )


def t_p_value(t: float, df: int) -> float:
    """Two-sided p-value of Student's t statistic ``t`` with ``df`` degrees of freedom."""
    from scipy.stats import t as student_t

    if math.isnan(t):
        return 1.0
    return float(2 * student_t.sf(abs(t), df))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error control over the finite ones,
    in their given order; None stays None): the i-th smallest of m is multiplied by
    m - i + 1, made monotone, capped at 1."""
    ranked = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running, m = 0.0, len(ranked)
    for rank, (p, index) in enumerate(ranked):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted
