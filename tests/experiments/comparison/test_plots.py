"""Plots: the legend explains a marker only when a plotted run uses it; seeds of unequal
length keep their tails."""

from __future__ import annotations

import matplotlib.pyplot as plt

from experiments.comparison.plots import _cost_figure, _draw


def _legend_texts(figure) -> list[str]:
    legends = [*figure.legends, *(axis.get_legend() for axis in figure.axes)]
    return [text.get_text() for legend in legends if legend for text in legend.get_texts()]


def _runs(parameters: int, ppl: float, causal: bool = True) -> list[dict]:
    return [
        {"parameters": parameters, "test_ppl": ppl + seed, "is_causal": causal} for seed in (0, 1)
    ]


def test_the_non_causal_marker_is_explained_only_when_drawn():
    causal = {"lstm": _runs(1_000_000, 100.0), "ode-lstm": _runs(1_500_000, 90.0)}
    texts = _legend_texts(_cost_figure(causal, None, "parameters", "parameters"))
    assert len(texts) == 2 and not any("non-causal" in text for text in texts)
    mixed = {**causal, "reconstruction": _runs(1_600_000, 2.0, causal=False)}
    texts = _legend_texts(_cost_figure(mixed, None, "parameters", "parameters"))
    assert sum("x: non-causal model" in text for text in texts) == 1


def test_perplexity_against_flops_places_each_model_at_its_mean_cost():
    """ppl_vs_flops: a model's x is its FLOPs per token (mean over seeds), its y the mean
    test perplexity with the seeds' min-max as error bars; a model without a FLOPs count
    (a lookup table) is left out rather than put at 0."""
    groups = {
        "residual": [{"test_flops_per_token": 2e6, "test_ppl": p} for p in (300.0, 310.0)],
        "rk4": [{"test_flops_per_token": 5e6, "test_ppl": p} for p in (320.0, 340.0)],
        "bigram": [{"test_flops_per_token": 0.0, "test_ppl": 500.0}],
    }
    figure = _cost_figure(groups, None, "test_flops_per_token", "forward FLOPs per token")
    axis = figure.axes[0]
    assert axis.get_xlabel() == "forward FLOPs per token"
    data_lines = [container.lines[0] for container in axis.containers]  # errorbar's points
    points = sorted((float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in data_lines)
    assert points == [(2e6, 305.0), (5e6, 330.0)]


def test_a_seed_that_trains_on_after_another_stopped_keeps_its_own_line():
    """The mean is drawn where every seed has a value; a seed that stopped later goes on as
    a thin line from the mean's last point, in wall time at its own x."""
    short = [(100, 400.0), (200, 300.0)]
    long = [(100, 420.0), (200, 320.0), (300, 290.0), (400, 280.0)]
    _, axis = plt.subplots()
    _draw(axis, 0, "rk4", [short, long])
    mean, tail = axis.get_lines()
    assert list(mean.get_xdata()) == [100, 200] and list(mean.get_ydata()) == [410.0, 310.0]
    assert list(tail.get_xdata()) == [200, 300, 400]
    assert list(tail.get_ydata()) == [310.0, 290.0, 280.0]
    _, axis = plt.subplots()
    walls = [{100: 10.0, 200: 20.0}, {100: 12.0, 200: 22.0, 300: 33.0, 400: 44.0}]
    _draw(axis, 0, "rk4", [short, long], walls)
    mean, tail = axis.get_lines()
    assert list(mean.get_xdata()) == [11.0, 21.0] and list(tail.get_xdata()) == [21.0, 33.0, 44.0]
    plt.close("all")
