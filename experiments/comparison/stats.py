"""Seed statistics for comparisons: mean, sample standard deviation, a seed-paired
difference to a baseline with a two-sided 95% Student-t confidence interval and p-value
(exact quantiles, scipy), the difference such a test could detect, and Holm's step-down
adjustment of a family of p-values.

Pairing by seed removes what two models share at one seed (data order, initialisation
stream), so the interval is over the differences ``model(seed) - baseline(seed)`` for the
seeds both ran. With fewer than two pairs no interval exists and it is reported as n/a.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (df >= 1), exact."""
    from scipy.stats import t as student_t

    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return float(student_t.ppf(0.975, df))


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
    sd: float | None = None  # sample standard deviation of the paired differences

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
        summary.sd,
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


def detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired t-test of ``n`` pairs at level
    ``alpha`` detects with probability ``power``, were the paired differences' standard
    deviation ``sd`` (the noncentral t: the figure a "no significant difference" is read
    against). Infinite when ``n < 2``; 0 when ``sd`` is 0."""
    from scipy.optimize import brentq
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if n < 2 or not math.isfinite(sd):
        return math.inf
    if sd == 0:
        return 0.0
    df = n - 1
    critical = float(student_t.ppf(1 - alpha / 2, df))

    def shortfall(effect: float) -> float:
        shift = effect * math.sqrt(n) / sd
        wrong_side = float(nct.cdf(-critical, df, shift))  # NaN where it underflows
        return float(nct.sf(critical, df, shift)) + (wrong_side if wrong_side > 0 else 0.0) - power

    high = sd
    while shortfall(high) < 0:
        high *= 2
    return float(brentq(shortfall, 0.0, high, xtol=1e-10 * sd))
