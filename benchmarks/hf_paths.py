"""Benchmarks of the Hugging Face paths of issue 47: what gradient checkpointing saves, and
what batch-invariant adaptive solves cost.

``checkpoint-memory``: peak CPU memory of a forward + backward pass with and without
``gradient_checkpointing_enable()`` (an RK4 ODE Transformer, per layer; a fixed-grid
node-transformer, per RK stage; a 4-layer LSTM, per layer). ``batch-invariant-cost``: evaluation time of a left-padded
batch with one shared adaptive solve (``batch_invariant=False``) and with batch-invariant
solves (the default in evaluation), and how far each is from scoring every row alone.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from benchmarks.ode_heads import _peak_bytes
from neuralode_lm.models import LSTMLM, ODELSTM
from neuralode_lm.transformer import NODETransformerLM
from ode_transformer import ODETransformerConfig, ODETransformerLM
from odelm.timing import alternating, medians

VOCAB = 50


def _checkpoint_models() -> dict[str, torch.nn.Module]:
    width = {"d_model": 64, "n_heads": 4, "d_ff": 256, "max_positions": 128}
    rk4 = ODETransformerLM(
        ODETransformerConfig(vocab_size=VOCAB, n_layers=4, block="rk4", dropout=0.0, **width)
    )
    node = NODETransformerLM(
        VOCAB, n_layers=2, solver={"method": "rk4"}, steps=2, dropout=0.0, **width
    )
    lstm = LSTMLM(VOCAB, embed_dim=64, hidden_dim=256, n_layers=4, dropout=0.0)
    return {"rk4-transformer": rk4, "node-transformer-rk4": node, "lstm-4layer": lstm}


def checkpoint_memory() -> list[dict[str, Any]]:
    """Peak memory of forward + backward, checkpointed over plain, per model (batch 8 x 128
    tokens)."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, 128))
    records = []
    for name, model in _checkpoint_models().items():
        model.train()

        def step(model: torch.nn.Module = model) -> None:
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()

        step()  # warm-up
        plain = _peak_bytes(step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable()
        checkpointed = _peak_bytes(step)
        print(
            f"checkpoint-memory {name}: plain {plain / 2**20:.1f} MiB, "
            f"checkpointed {checkpointed / 2**20:.1f} MiB"
        )
        records.append(
            {
                "bench": "checkpoint-memory",
                "metric": f"{name}_checkpointed_over_plain_peak",
                "value": checkpointed / plain,
                "target": 0.8,
                "unit": "x",
                "better": "lower",
                "plain_peak_mib": plain / 2**20,
                "checkpointed_peak_mib": checkpointed / 2**20,
            }
        )
    return records


def batch_invariant_cost() -> list[dict[str, Any]]:
    """Evaluation seconds of a left-padded batch (8 rows of 8..32 tokens), batch-invariant
    over one shared adaptive solve, and each way's largest logit difference to the rows
    scored alone."""
    torch.manual_seed(0)
    dopri5 = {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4}
    models = {
        "ode-lstm-dopri5": ODELSTM(
            VOCAB, embed_dim=64, hidden_dim=64, field_hidden=64, dropout=0.0, solver=dopri5
        ),
        "node-transformer-dopri5": NODETransformerLM(
            VOCAB, d_model=64, n_heads=4, d_ff=128, n_layers=1, dropout=0.0, solver=dopri5
        ),
    }
    lengths = [8 + 3 * i for i in range(8)]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows = [torch.randint(1, VOCAB, (n,)) for n in lengths]
    for i, row in enumerate(rows):
        ids[i, -len(row) :], mask[i, -len(row) :] = row, 1
    records = []
    for name, model in models.items():
        model.eval()

        def score(invariant: bool, model: torch.nn.Module = model) -> torch.Tensor:
            model.batch_invariant = invariant
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask).logits  # type: ignore[no-any-return]

        with torch.no_grad():
            alone = [model(input_ids=row[None]).logits[0] for row in rows]
        gaps = {}
        for invariant in (False, True):
            logits = score(invariant)
            gaps[invariant] = max(
                float((logits[i, -len(row) :] - alone[i]).abs().max()) for i, row in enumerate(rows)
            )
        seconds = medians(
            alternating({False: lambda: score(False), True: lambda: score(True)}, 5, warmup=1)
        )
        print(
            f"batch-invariant-cost {name}: shared {seconds[False] * 1e3:.0f} ms "
            f"(gap {gaps[False]:.1e}), batch-invariant {seconds[True] * 1e3:.0f} ms "
            f"(gap {gaps[True]:.1e})"
        )
        records.append(
            {
                "bench": "batch-invariant-cost",
                "metric": f"{name}_invariant_over_shared_seconds",
                "value": seconds[True] / seconds[False],
                "target": float(len(rows)),
                "unit": "x",
                "better": "lower",
                "shared_ms": seconds[False] * 1e3,
                "invariant_ms": seconds[True] * 1e3,
                "shared_gap_to_alone": gaps[False],
                "invariant_gap_to_alone": gaps[True],
            }
        )
    return records
