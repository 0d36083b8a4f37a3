"""Excess loss: the true grammar, scored through the harness's own evaluation path, has
excess 0; the comparison tables show excess and the true grammar's row; ``data info``
prints the exact entropies."""

from __future__ import annotations

import math
from typing import Any

import pytest

from experiments.comparison.tables import markdown_table
from experiments.data.grammar import ProbabilisticGrammar, default_rules
from experiments.data.grammar_automaton import TokenAutomaton
from experiments.data.grammar_family import GRAMMAR_DEPTHS, family_automaton, family_grammar
from experiments.models.grammar_lm import GrammarLM
from experiments.training.config import DataConfig
from experiments.training.datamodule import EvalSettings, load_data
from experiments.training.metrics import CUT_SENTENCES_NOTE, evaluate

NO_BLEU: dict[str, Any] = {"bleu_sentences": 0}


@pytest.mark.parametrize("depth", GRAMMAR_DEPTHS)
def test_the_true_grammar_has_no_excess_through_the_harness(depth: int) -> None:
    data = load_data(DataConfig(grammar_depth=depth))
    model = GrammarLM(family_automaton(depth), data.tokenizer)
    tokens = data.split("test").ids.numel()
    sentences = EvalSettings(batching="sentences", eval_batch_size=64, **NO_BLEU)
    one_window = EvalSettings(eval_window=tokens, eval_batch_size=1, **NO_BLEU)
    for settings in (sentences, one_window):
        result = evaluate(model, data, "test", settings=settings)
        assert result["tokens"] == tokens
        assert abs(result["excess_nll_per_token"]) < 1e-6
        assert result["ppl_ratio"] == pytest.approx(1.0, abs=1e-6)
        assert result["true_nll_per_token"] == pytest.approx(data.reference_nll["test"] / tokens)
        assert "excess_note" not in result or settings is one_window


def test_windows_that_cut_sentences_leave_an_excess_and_say_so() -> None:
    data = load_data(DataConfig(grammar_depth=2))
    model = GrammarLM(family_automaton(2), data.tokenizer)
    result = evaluate(model, data, "valid", settings=EvalSettings(eval_window=128, **NO_BLEU))
    assert result["excess_nll_per_token"] > 0.05  # a window's first words lack their start
    assert result["excess_note"] == CUT_SENTENCES_NOTE


def test_the_embedded_grammar_has_no_excess_either() -> None:
    data = load_data(DataConfig())
    automaton = TokenAutomaton.compile(ProbabilisticGrammar(default_rules()))
    settings = EvalSettings(batching="sentences", **NO_BLEU)
    result = evaluate(GrammarLM(automaton, data.tokenizer), data, "test", settings=settings)
    assert abs(result["excess_nll_per_token"]) < 1e-6
    assert set(data.reference_nll) == {"train", "valid", "test"}


def test_tables_show_excess_and_the_true_grammar_row() -> None:
    runs: list[dict[str, Any]] = [
        {
            "name": name,
            "seed": seed,
            "parameters": 1000,
            "test_ppl": math.exp(2.25 + excess),
            "test_true_nll_per_token": 2.25,
            "test_excess_nll_per_token": excess,
            "test_ppl_ratio": math.exp(excess),
            "protocol": "grammar-depth 3 (streamed train, seed 0)",
        }
        for name, base in (("a", 0.1), ("b", 0.2))
        for seed, excess in ((1, base), (2, base + 0.01))
    ]
    table = markdown_table(runs, "a")
    assert "excess loss (nats/token)" in table and "perplexity ratio" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert "0.1050" in rows["a"] and "0.2050" in rows["b"]
    true_row = rows["true grammar"].strip("| ").split(" | ")
    assert true_row[2] == f"{math.exp(2.25):.2f} (exact)" and true_row[5:7] == ["0.0000", "1.0000"]
    other_splits = [{**r, "test_true_nll_per_token": 2.25 + int(r["seed"])} for r in runs]
    assert "| true grammar |" not in markdown_table(other_splits, "a")


def test_data_info_prints_the_exact_entropies(capsys) -> None:
    from experiments.cli.main import main

    assert main(["data", "info", "--corpus", "grammar", "--data.grammar_depth", "3"]) == 0
    out = capsys.readouterr().out
    data = load_data(DataConfig(grammar_depth=3))
    test_nll = data.reference_nll["test"] / data.split("test").ids.numel()
    assert f"true entropy rate {family_grammar(3).entropy_per_token:.6f} nats/token" in out
    assert f"NLL on this test split (seed 0) is {test_nll:.6f} nats/token" in out
    assert "train: streamed" in out


def test_plots_draw_the_family_grammars_perplexity() -> None:
    from experiments.comparison.plots import grammar_references

    data = load_data(DataConfig(grammar_depth=3, seed=1))
    tokens = data.split("test").ids.numel()
    label = [{"protocol": data.protocol}] * 2
    assert grammar_references(label) == {
        "expected": pytest.approx(math.exp(family_grammar(3).entropy_per_token)),
        "test_split": pytest.approx(math.exp(data.reference_nll["test"] / tokens)),
    }
    assert grammar_references([*label, {"protocol": "grammar (embedded, seed 1)"}]) is None
