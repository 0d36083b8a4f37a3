"""Forward FLOPs per token of a grid's runs, recomputed from their configs alone.

A model whose depth is fixed (residual and RK blocks, LSTMs, GPT-2, fixed-grid ODE solves)
costs the same for any weights, so a freshly built model scored on the run's own test
batches (``evaluate``'s perplexity pass: same windows, padding and state) reports exactly
the ``test_flops_per_token`` a trained run reports. An adaptive solve (dopri5, ...) costs
what its trained field makes it take: those runs are returned with ``None`` (they need the
trained weights, i.e. a re-run). Used to re-derive published FLOPs columns::

    from experiments.comparison.config_flops import grid_flops
    grid_flops("experiments/configs/grids/table5-seeds.yaml")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from experiments.comparison.compare import expand_grid
from experiments.data.tokenization import LMData
from experiments.models.build import build_model
from experiments.models.flops import is_adaptive
from experiments.training.config import RunConfig, load_yaml, parse_config
from experiments.training.metrics import EvalSettings, perplexity
from experiments.training.train import prepare_data


@torch.no_grad()
def run_flops(config: RunConfig, data: LMData, split: str = "test") -> dict[str, Any]:
    """``{"flops_per_token", "flops_batches", "adaptive"}`` of ``config``'s model, built
    afresh, over ``split`` batched as the run evaluates it (``None`` FLOPs when adaptive)."""
    torch.manual_seed(config.seed)
    model = build_model(config.model, data.tokenizer.vocab_size).eval()
    if is_adaptive(model):
        return {"flops_per_token": None, "flops_batches": None, "adaptive": True}
    scored = perplexity(model, data, split, EvalSettings.from_config(config))
    return {
        "flops_per_token": scored["flops_per_token"],
        "flops_batches": scored["flops_batches"],
        "adaptive": False,
    }


def grid_flops(grid_file: str | Path, shared_override: dict[str, Any] | None = None) -> list[dict]:
    """One row per run of the grid (model x seed): ``name``, ``seed``, ``run`` and
    ``run_flops``'s keys; runs that share a model and data config are scored once."""
    grid = load_yaml(grid_file)
    plans = expand_grid(grid, Path("unused"), shared_override or {})
    datasets: dict[str, LMData] = {}
    scored: dict[str, dict[str, Any]] = {}
    rows = []
    for plan in plans:
        config = parse_config(plan.values)
        data_key = json.dumps(config.to_dict()["data"], sort_keys=True, default=str)
        key = json.dumps([config.model, data_key], sort_keys=True, default=str)
        if key not in scored:
            if data_key not in datasets:
                datasets[data_key] = prepare_data(config)
            scored[key] = run_flops(config, datasets[data_key])
        rows.append({"name": plan.name, "seed": plan.seed, "run": plan.run, **scored[key]})
    return rows
