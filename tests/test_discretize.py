"""``odelm discretize``: one trained ODE Transformer's fields under many discretisations."""

from __future__ import annotations

import json

import pytest

from experiments.cli.main import main
from experiments.training.config import parse_config
from experiments.training.train import train

KEYS = {"method", "setting", "ppl", "nfe", "flops_per_token", "state_error"}


@pytest.mark.slow
def test_discretize_an_rk4_ode_transformer(tmp_path, capsys):
    values = {
        "name": "rk4",
        "out_dir": str(tmp_path),
        "seed": 1,
        "model": {
            "family": "ode_transformer",
            "preset": "small",
            "d_model": 16,
            "n_heads": 2,
            "d_ff": 32,
            "n_layers": 2,
            "max_positions": 64,
            "block": "rk4",
        },
        "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 32},
        "trainer": {"max_steps": 2, "val_every": 2, "val_batches": 1, "progress_bar": False},
        "eval": {"bleu_sentences": 0, "continuation_sentences": 0},
    }
    train(parse_config(values))
    run = tmp_path / "rk4"
    assert main(["discretize", str(run), "--json", "--max-batches", "1", "--steps", "1", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(KEYS <= set(row) for row in rows)
    by = {(row["method"], row["setting"]): row for row in rows}
    # The trained model is its fields solved by one classic RK4 step per block.
    trained, rk4 = by["rk4 (trained blocks)", "as trained"], by["rk4", "1 step"]
    assert trained["ppl"] == rk4["ppl"] and trained["state_error"] == rk4["state_error"]
    assert [r["setting"] for r in rows if r["ppl"] is None] == ["block 0", "block 1"]
    # Accuracy against the tight reference follows the order of the method.
    assert by["rk4", "2 steps"]["state_error"] < by["rk4", "1 step"]["state_error"]
    assert by["rk4", "1 step"]["state_error"] < by["euler", "1 step"]["state_error"]
    assert by["euler", "2 steps"]["nfe"] == 2 * 2 and by["rk3", "1 step"]["nfe"] == 2 * 3
    # Fixed grids are exactly causal; every row costs FLOPs in proportion to its NFE.
    assert all(r["causal_leak"] == 0.0 for r in rows if r["method"] in ("euler", "rk4"))
    assert by["rk4", "2 steps"]["flops_per_token"] > by["rk4", "1 step"]["flops_per_token"]
    assert (run / "discretize" / "discretize.png").stat().st_size > 0
    assert "| rk4 | 1 step |" in (run / "discretize" / "discretize.md").read_text()
