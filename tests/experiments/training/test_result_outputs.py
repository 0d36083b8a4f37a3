"""What people read: per-token and per-word perplexity of a run, ``odelm eval``'s rounded
lines (full precision under ``--json``), the narrow results.md, markers that do not hide."""

from __future__ import annotations

import json
import re

import pytest

import experiments
from experiments.cli.main import main
from experiments.comparison.plots import _cost_figure
from experiments.comparison.tables import markdown_table
from experiments.data.corpora import load_corpus
from experiments.training.config import parse_config
from experiments.training.train import train


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, tiny_config):
    """A two-step run with a BPE vocabulary: tokens and words differ."""
    folder = tmp_path_factory.mktemp("bpe-run")
    values = tiny_config(
        folder,
        "bpe",
        data={"tokenizer": "bpe", "bpe_vocab_size": 300},
        trainer={"max_steps": 2, "val_every": 2, "checkpoint_every": 2},
        eval={"bleu_sentences": 0, "continuation_sentences": 0},
    )
    result = train(parse_config(values))
    return folder / "bpe", result


@pytest.mark.slow
def test_run_perplexity_per_word_and_per_token(bpe_run) -> None:
    run_dir, result = bpe_run
    run = experiments.load_run(run_dir)
    lines = [" ".join(line[:-1]) for line in load_corpus("grammar").split("test")]
    per_word = run.perplexity(lines)
    per_token = run.perplexity(lines, per="token")
    assert per_word == pytest.approx(result["test_ppl_per_word"], rel=1e-9)
    assert per_token == pytest.approx(result["test_ppl"], rel=1e-9)
    assert run.perplexity(lines, per="word") == per_word
    # the same total NLL over more tokens than words: per token is the smaller
    assert result["test_tokens"] > result["test_words"] and per_token < per_word
    with pytest.raises(ValueError, match="per must be 'word' or 'token', got 'char'"):
        run.perplexity(lines, per="char")


@pytest.mark.slow
def test_eval_rounds_for_people_and_keeps_full_precision_in_json(bpe_run, capsys) -> None:
    run_dir, _ = bpe_run
    assert main(["eval", str(run_dir), "--num-threads", "1", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run_dir), "--num-threads", "1"]) == 0
    printed = dict(
        line.strip().split("  (")[0].split(": ", 1)  # a perplexity's label after its value
        for line in capsys.readouterr().out.strip().splitlines()
    )
    assert printed["ppl"] == f"{full['ppl']:.2f}" and printed["ppl"] != str(full["ppl"])
    assert printed["ppl_per_word"] == f"{full['ppl_per_word']:.2f}"
    assert printed["nll"] == f"{full['nll']:.2f}"  # >= 100: 2 decimals
    assert re.fullmatch(r"[0-9.e+-]{1,10}", printed["seconds"])  # 4 significant digits
    assert printed["tokens"] == str(full["tokens"]) and printed["split"] == "test"
    assert len(str(full["ppl"]).split(".")[1]) > 2


@pytest.mark.slow
def test_eval_leads_with_the_labelled_per_token_perplexity_of_the_tables(bpe_run, capsys):
    # On a BPE run the per-word perplexity is far larger; the first one printed,
    # by odelm eval and by run.evaluate, is the per-token one the tables use, labelled.
    run_dir, result = bpe_run
    assert main(["eval", str(run_dir), "--num-threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()  # the first two lines of all
    per_token, per_word = result["test_ppl"], result["test_ppl_per_word"]
    assert lines[0] == f"           ppl: {per_token:.2f}  (per token: the perplexity of the tables)"
    assert lines[1] == (
        f"  ppl_per_word: {per_word:.2f}  (per word: total NLL / words, line ends counted as words)"
    )
    assert per_word > per_token  # on BPE the two differ: which comes first matters
    evaluated = experiments.load_run(run_dir).evaluate()
    assert list(evaluated)[:2] == ["ppl", "ppl_per_word"]
    assert evaluated["ppl"] == pytest.approx(result["test_ppl"], rel=1e-9)


def _result(name: str, seed: int, ppl: float, parameters: int) -> dict:
    return {
        "name": name,
        "seed": seed,
        "test_ppl": ppl,
        "test_ppl_per_word": ppl,
        "test_bleu_tf": 0.1,
        "valid_ppl": ppl + 0.5,
        "test_nfe": 2.0,
        "test_flops_per_token": 2e5,
        "train_tokens_per_s": 12345.6,
        "peak_memory_mb": 500.0,
        "steps": 800,
        "depth": "discrete depth",
        "parameters": parameters,
        "protocol": "P",
        "model": "small block=rk2",
    }


def test_results_md_has_the_headline_columns_only() -> None:
    results = [_result("base", s, 10.0 + s, 120_000) for s in (0, 1)]
    results += [_result("rk2", s, 9.0 + s, 120_000) for s in (0, 1)]
    table = markdown_table(results, "base").splitlines()
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == [
        "model",
        "parameters",
        "test perplexity (mean ± sd, n seeds)",
        "Δ vs base [95% CI]",
        "p (Holm)",
        "valid perplexity",
        "NFE",
        "forward FLOPs/token",
        "train tokens/s",
    ]
    assert table[3].startswith("| rk2 | 0.12M | 9.50 ± 0.71 (2) | -1.00 [")
    assert table[3].endswith("| 10.00 | 2.00 | 0.20M | 12346 |")


def test_equal_parameter_counts_are_drawn_side_by_side() -> None:
    groups = {
        "residual": [_result("residual", s, 14.5, 123_520) for s in (0, 1, 2)],
        "rk2": [_result("rk2", s, 14.5, 123_520) for s in (0, 1, 2)],
        "macaron": [_result("macaron", s, 14.6, 123_904) for s in (0, 1, 2)],
        "lstm": [_result("lstm", s, 12.0, 47_470) for s in (0, 1, 2)],
    }
    figure = _cost_figure(groups, None, "parameters", "parameters")
    axis = figure.axes[0]
    xs = [float(container.lines[0].get_xdata()[0]) for container in axis.containers]
    assert len(set(xs)) == 4
    gap = 0.03 * (123_904 - 47_470)
    assert xs[1] - xs[0] == pytest.approx(gap, rel=0.01)  # residual and rk2 apart
    assert xs[3] == 47_470  # alone at its count
    assert "side by side" in axis.get_xlabel()
