"""Seed statistics against hand-computed numbers: mean, sample sd, paired t-interval."""

import math

import pytest

from experiments.comparison.stats import paired_difference, summarize, t_quantile_975
from experiments.comparison.tables import markdown_table


def test_t_quantiles_match_the_standard_table():
    assert t_quantile_975(1) == 12.706
    assert t_quantile_975(2) == 4.303
    assert t_quantile_975(9) == 2.262
    assert t_quantile_975(60) == pytest.approx(2.000)
    assert t_quantile_975(10**9) == pytest.approx(1.960, abs=1e-6)
    assert 2.021 > t_quantile_975(50) > 2.000
    with pytest.raises(ValueError, match=">= 1"):
        t_quantile_975(0)


def test_summary_is_mean_and_sample_standard_deviation():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    # sum of squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, over n - 1 = 3
    assert (s.n, s.mean, s.low, s.high) == (4, 2.5, 1.0, 4.0)
    assert s.sd == pytest.approx(math.sqrt(5 / 3))
    assert summarize([7.0]).sd is None
    assert summarize([2.0, math.nan, None]).n == 1


def test_paired_difference_is_a_t_interval_over_seed_pairs():
    model = {0: 10.0, 1: 12.0, 2: 11.0, 9: 50.0}  # seed 9 has no baseline: left out
    baseline = {0: 9.0, 1: 10.5, 2: 10.8}
    d = paired_difference(model, baseline)
    # differences 1.0, 1.5, 0.2: mean 0.9, sd sqrt((0.01 + 0.36 + 0.49) / 2) = sqrt(0.43)
    half = 4.303 * math.sqrt(0.43) / math.sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(0.9)
    assert (d.ci_low, d.ci_high) == (pytest.approx(0.9 - half), pytest.approx(0.9 + half))
    assert d.significant is False  # the interval [-0.73, 2.53] holds 0
    shifted = paired_difference({0: 11.0, 1: 12.1, 2: 13.0}, {0: 10.0, 1: 11.0, 2: 12.1})
    # differences 1.0, 1.1, 0.9: mean 1.0, sd 0.1, half-width 4.303 * 0.1 / sqrt(3)
    assert shifted.ci_low == pytest.approx(1.0 - 4.303 * 0.1 / math.sqrt(3))
    assert shifted.significant is True
    single = paired_difference({0: 3.0}, {0: 2.0})
    assert (single.mean, single.ci_low, single.significant) == (1.0, None, None)
    assert paired_difference({1: 3.0}, {0: 2.0}) is None


def _row(name, seed, ppl, **extra):
    return {"name": name, "seed": seed, "run": f"{name}-seed{seed}", "test_ppl": ppl,
            "family": "discrete depth", "parameters": 120_000, "protocol": "P", **extra}  # fmt: skip


def test_markdown_table_aggregates_seeds_against_the_baseline():
    results = [
        _row("base", 0, 10.0), _row("base", 1, 10.5), _row("base", 2, 12.0),
        _row("rk", 0, 11.0), _row("rk", 1, 12.0), _row("rk", 2, 13.0),
        _row("solo", 0, 9.0, is_causal=False),
    ]  # fmt: skip
    table = markdown_table(results, "base")
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    # base: mean 10.833, sd sqrt((0.694 + 0.111 + 1.361) / 2) = 1.041
    assert "| 0.12M | 10.83 ± 1.04 (3) | baseline |" in rows["base"]
    # rk - base: 1.0, 1.5, 1.0 -> mean 1.1667, sd 0.2887, half 4.303 * 0.2887 / sqrt(3) = 0.717
    assert "| 12.00 ± 1.00 (3) | +1.17 [+0.45, +1.88], significant |" in rows["rk"]
    assert "| 9.00 ± n/a (1) (non-causal: not an LM perplexity) | -1.00 [n/a] |" in rows["solo"]
    assert "Data protocol: P." in table and "seeds 0, 1, 2" in table
