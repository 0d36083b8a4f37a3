"""Plots: the legend explains a marker only when a plotted run uses it."""

from __future__ import annotations

from experiments.plots import _params_figure


def _legend_texts(figure) -> list[str]:
    legends = [*figure.legends, *(axis.get_legend() for axis in figure.axes)]
    return [text.get_text() for legend in legends if legend for text in legend.get_texts()]


def _runs(parameters: int, ppl: float, causal: bool = True) -> list[dict]:
    return [
        {"parameters": parameters, "test_ppl": ppl + seed, "is_causal": causal} for seed in (0, 1)
    ]


def test_the_non_causal_marker_is_explained_only_when_drawn():
    causal = {"lstm": _runs(1_000_000, 100.0), "ode-lstm": _runs(1_500_000, 90.0)}
    texts = _legend_texts(_params_figure(causal, None))
    assert len(texts) == 2 and not any("non-causal" in text for text in texts)
    mixed = {**causal, "reconstruction": _runs(1_600_000, 2.0, causal=False)}
    texts = _legend_texts(_params_figure(mixed, None))
    assert sum("x: non-causal model" in text for text in texts) == 1
