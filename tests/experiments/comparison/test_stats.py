"""Seed statistics against hand-computed numbers: mean, sample sd, paired t-interval."""

import math

import numpy as np
import pytest

from experiments.comparison.stats import (
    detectable_difference,
    paired_difference,
    summarize,
    t_quantile_975,
)
from experiments.comparison.tables import markdown_table


def test_t_quantiles_are_exact():
    """Against the table's 3 decimals and the normal limit; exact, not interpolated."""
    assert t_quantile_975(1) == pytest.approx(12.706, abs=5e-4)
    assert t_quantile_975(4) == pytest.approx(2.776445105, abs=1e-9)
    assert t_quantile_975(9) == pytest.approx(2.262, abs=5e-4)
    assert t_quantile_975(10**9) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError, match=">= 1"):
        t_quantile_975(0)


def test_paired_intervals_equal_scipys_exact_t_intervals():
    """The interval and p-value of every n from 2 to 12 equal scipy's paired t-test's to
    1e-9 (an independent implementation: ``scipy.stats.ttest_rel``)."""
    from scipy.stats import ttest_rel

    rng = np.random.default_rng(7)
    for n in range(2, 13):
        model, baseline = rng.normal(300, 10, n), rng.normal(305, 10, n)
        d = paired_difference(dict(enumerate(model)), dict(enumerate(baseline)))
        exact = ttest_rel(model, baseline)
        low, high = exact.confidence_interval(0.95)
        assert d.ci_low == pytest.approx(low, abs=1e-9)
        assert d.ci_high == pytest.approx(high, abs=1e-9)
        assert d.p_value == pytest.approx(exact.pvalue, abs=1e-9)


def test_detectable_difference_has_the_stated_power():
    """At the detectable difference a simulated paired t-test rejects 80% of the time; the
    figure grows as the level tightens and falls as 1/sqrt(n) for large n."""
    from scipy.stats import t as student_t

    sd, n = 10.0, 5
    effect = detectable_difference(sd, n, alpha=0.05)
    rng = np.random.default_rng(0)
    diffs = rng.normal(effect, sd, size=(40000, n))
    t = diffs.mean(1) / (diffs.std(1, ddof=1) / math.sqrt(n))
    rejected = np.mean(np.abs(t) > student_t.ppf(0.975, n - 1))
    assert rejected == pytest.approx(0.8, abs=0.01)
    assert detectable_difference(sd, n, alpha=0.05 / 6) > effect
    # large n: the normal approximation (z_0.975 + z_0.8) sd / sqrt(n)
    assert detectable_difference(1.0, 10**4) == pytest.approx((1.959964 + 0.841621) / 100, rel=1e-3)
    assert detectable_difference(sd, 1) == math.inf


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
    half = 4.302652730 * math.sqrt(0.43) / math.sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(0.9)
    assert (d.ci_low, d.ci_high) == (pytest.approx(0.9 - half), pytest.approx(0.9 + half))
    assert d.significant is False  # the interval [-0.73, 2.53] holds 0
    shifted = paired_difference({0: 11.0, 1: 12.1, 2: 13.0}, {0: 10.0, 1: 11.0, 2: 12.1})
    # differences 1.0, 1.1, 0.9: mean 1.0, sd 0.1, half-width 4.303 * 0.1 / sqrt(3)
    assert shifted.ci_low == pytest.approx(1.0 - 4.302652730 * 0.1 / math.sqrt(3))
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


def test_paired_p_value_matches_the_t_distribution():
    """Diffs 1, 2, 3: t = 2 / (1 / sqrt 3) = 3.4641 with 2 df; two-sided p = 0.07418
    (tables of Student's t); the 95% interval contains 0 exactly when p > 0.05."""
    paired = paired_difference({1: 11.0, 2: 12.0, 3: 13.0}, {1: 10.0, 2: 10.0, 3: 10.0})
    assert paired.p_value == pytest.approx(0.074180, abs=1e-5)
    assert not paired.significant and paired.p_value > 0.05


def test_holm_adjustment():
    """Holm (1979): sorted p 0.01, 0.02, 0.04 of m = 3 -> 0.03, 0.04, 0.04 (monotone);
    None stays None and does not count in m."""
    from experiments.comparison.stats import holm

    assert holm([0.04, None, 0.01, 0.02]) == pytest.approx([0.04, None, 0.03, 0.04])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_seed_noise_row_pairs_with_the_baseline_and_stays_out_of_holm(tmp_path):
    """The seed-noise row is paired by ``pair`` (the baseline seed it stands beside), shown
    as a control, and left out of the Holm family; results.csv carries p, p_holm and
    cap_bound (a run whose best step is its last validation at the budget)."""
    import csv

    from experiments.comparison.tables import adjusted_p_values, write_tables

    base = [_row("base", s, 100.0 + s) for s in (1, 2, 3)]
    better = [_row("rk2", s, 90.0 + s + 0.1 * s * s) for s in (1, 2, 3)]
    noise = [
        {**_row("seed-noise", s + 100, 100.0 + s + d), "pair": s}
        for s, d in ((1, 0.5), (2, -0.2), (3, 0.1))
    ]
    for run in base:
        run.update(best_step=1900, steps=1900, val_every=95, max_steps=1900)
    better[0].update(best_step=1805, steps=1900, val_every=95, max_steps=1900)
    results = base + better + noise
    assert set(adjusted_p_values(results, "base")) == {"rk2"}
    write_tables(results, tmp_path, "base")
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [r["cap_bound"] for r in rows[:4]] == ["True", "True", "True", "False"]
    rk2 = [r for r in rows if r["name"] == "rk2"]
    assert float(rk2[0]["p_holm"]) == pytest.approx(float(rk2[0]["p_value"]))  # m = 1
    assert next(r for r in rows if r["name"] == "seed-noise")["p_holm"] == ""
    table = (tmp_path / "results.md").read_text()
    assert "+0.13 [" in table and "(A/A control)" in table and "3 cap-bound" in table


def test_a_fixed_budget_grid_calls_no_run_cap_bound(tmp_path):
    """With warm-up + cosine to 0 (``optim.schedule: cosine`` in every run) a best at the
    last validation is the end of the decay: results.md counts no cap-bound run and says
    why, a grid file says the same of its runs, and results.csv keeps the raw flag."""
    import csv

    from experiments.comparison.tables import (
        FIXED_BUDGET_NOTE,
        grid_has_fixed_budget,
        runs_have_fixed_budget,
        write_tables,
    )

    base = [_row("base", s, 100.0 + s) for s in (1, 2, 3)]
    noise = [{**_row("seed-noise", s + 100, 101.0 + s), "pair": s} for s in (1, 2, 3)]
    for run in base + noise:
        run.update(best_step=1900, steps=1900, val_every=95, max_steps=1900)
    write_tables(base + noise, tmp_path, "base", fixed_budget=True)
    table = (tmp_path / "results.md").read_text()
    assert "cap-bound)" not in table and FIXED_BUDGET_NOTE in table
    assert {r["cap_bound"] for r in csv.DictReader((tmp_path / "results.csv").open())} == {"True"}
    write_tables(base + noise, tmp_path, "base")
    assert "(3 cap-bound)" in (tmp_path / "results.md").read_text()
    cosine = {"optim": {"schedule": "cosine"}}
    assert grid_has_fixed_budget({"shared": cosine, "runs": [{"name": "a"}, {"name": "b"}]})
    assert not grid_has_fixed_budget(
        {"shared": cosine, "runs": [{"optim": {"schedule": "plateau"}}]}
    )
    assert not runs_have_fixed_budget([])
