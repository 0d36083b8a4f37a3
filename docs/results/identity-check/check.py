"""Train one run of each published grid family for 20 steps and print its config hash and
losses (run under two code versions, compare the outputs)."""

import csv
import json
import sys
from pathlib import Path

from experiments.comparison.compare import expand_grid
from experiments.training.config import load_yaml, merge, parse_config
from experiments.training.runs import config_sha256
from experiments.training.train import train

CASES = [
    ("table5-field-2layer", "residual-seed1"),
    ("table5-field-2layer", "rk2-seed1"),
    ("node-lm-field-lr5", "lstm-tied-seed1"),
    ("continuous-field", "node-euler4-seed1"),
    ("macaron-field", "macaron-seed1"),
    ("node-lm-gpt2-field", "ode-gpt2-seed1"),
    ("study2-table5-2layer", "rk4-seed1"),
    ("study-grammar-d3", "node-weights4-seed1"),
    ("study-grammar-d3", "ode-lstm-seed1"),
]
out = {}
root = Path(sys.argv[1])
for grid_name, run in CASES:
    grid = load_yaml(f"experiments/configs/grids/{grid_name}.yaml")
    plan = next(p for p in expand_grid(grid, Path("/tmp/x"), {}) if p.run == run)
    full = parse_config(plan.values)
    values = merge(
        plan.values,
        {
            "out_dir": str(root),
            "name": f"{grid_name}-{run}",
            "trainer": {
                "max_steps": 20,
                "max_epochs": None,
                "val_every": 20,
                "log_every": 1,
                "checkpoint_every": 20,
                "logger": ["csv"],
                "num_threads": 1,
                "progress_bar": False,
            },
            "eval": {"bleu_sentences": 2, "continuation_sentences": 1},
        },
    )
    result = train(parse_config(values))
    with open(root / values["name"] / "logs" / "metrics.csv") as f:
        losses = [r["train/loss"] for r in csv.DictReader(f) if r.get("train/loss")]
    out[f"{grid_name}/{run}"] = {
        "sha": config_sha256(full),
        "losses": losses,
        "test_ppl": result["test_ppl"],
    }
    print(grid_name, run, config_sha256(full)[:12], losses[:3], result["test_ppl"], flush=True)
(root / "identity.json").write_text(json.dumps(out, indent=1))
