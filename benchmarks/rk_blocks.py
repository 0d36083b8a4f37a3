"""The discrete-depth family's benchmarks: ``odelm bench rk-overhead`` and ``generate-cache``.

Each function returns a list of records (``bench``, ``metric``, ``value``, ``target``,
``unit``, ``better`` plus raw timings); the variants are timed by
[`odelm.timing.alternating`][odelm.timing.alternating] and their medians compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from ode_transformer.blocks import RKBlock
from ode_transformer.config import ODETransformerConfig
from ode_transformer.layers import PreNormAttentionFFN
from ode_transformer.lm import ODETransformerLM
from odelm.timing import alternating


def rk_overhead(
    d_model: int = 256,
    seq_len: int = 64,
    batch: int = 16,
    repeats: int = 15,
    budget_s: float = 40.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Forward+backward time of one RK-k block / (k x that of one residual block), k = 2, 3, 4.

    All blocks share one ``F`` (pre-norm attention + FFN, d_ff = 4 d, dropout 0.1, causal),
    so the ratio isolates the RK bookkeeping; the ideal is 1.00 and the target 1.10. Stops
    repeating (after at least 3 rounds) once ``budget_s`` seconds have passed.
    """
    torch.manual_seed(seed)
    f = PreNormAttentionFFN(
        d_model,
        n_heads=max(1, d_model // 64),
        d_ff=4 * d_model,
        dropout=0.1,
        attention_dropout=0.1,
        relu_dropout=0.1,
        causal=True,
    )
    blocks = {name: RKBlock(f, name) for name in ("residual", "rk2", "rk3", "rk4")}
    y = torch.randn(batch, seq_len, d_model)
    seed_grad = torch.randn(batch, seq_len, d_model)

    def step(block: RKBlock) -> None:
        f.zero_grad(set_to_none=True)
        x = y.detach().requires_grad_(True)
        block(x).backward(seed_grad)

    calls = {name: lambda block=block: step(block) for name, block in blocks.items()}
    # one untimed warm-up call each: allocator and kernels
    times = alternating(calls, repeats, warmup=1, budget_s=budget_s, min_rounds=3)
    residual = statistics.median(times["residual"])
    records = []
    for k, name in ((2, "rk2"), (3, "rk3"), (4, "rk4")):
        median = statistics.median(times[name])
        records.append(
            {
                "bench": "rk-overhead",
                "metric": f"time(RK{k}) / ({k} x time(residual)), forward+backward",
                "value": median / (k * residual),
                "target": 1.10,
                "unit": "ratio",
                "better": "lower",
                "k": k,
                "seconds_rk": median,
                "seconds_residual": residual,
                "shape": [batch, seq_len, d_model],
                "repeats": len(times[name]),
                "threads": torch.get_num_threads(),
            }
        )
    return records


def _decoder(
    model: ODETransformerLM,
    prompt: torch.Tensor,
    new_tokens: int,
    use_cache: bool,
    outputs: dict[bool, torch.Tensor],
) -> Callable[[], None]:
    """A call that decodes ``new_tokens`` greedily and keeps the tokens in ``outputs``."""

    def decode() -> None:
        outputs[use_cache] = model.generate(prompt, new_tokens, use_cache=use_cache)

    return decode


def generate_cache(
    new_tokens: int = 256,
    prompt_len: int = 16,
    widths: tuple[int, ...] = (512, 128),
    repeats: int = 3,
    budget_s: float = 40.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """New tokens per second with the per-stage KV cache / without, 6-layer RK2 LM, greedy.

    Batch 1 (single-stream latency), PTB's vocabulary, one record per width: d 512 is the
    paper's base model (FFN 2048, 8 heads); d 128 (FFN 512, 4 heads) is CPU-sized, where
    the cached step is bound by per-op overhead on a CPU and the ratio is lower. Both paths
    must produce the same tokens (``tokens_match``). Each width stops repeating (after at
    least one round) once its share of ``budget_s`` has passed.
    """
    records = []
    for width in widths:
        torch.manual_seed(seed)
        config = ODETransformerConfig(
            vocab_size=10000,
            d_model=width,
            n_heads=8 if width >= 512 else 4,
            d_ff=4 * width,
            n_layers=6,
            max_positions=prompt_len + new_tokens,
            block="rk2",
        )
        model = ODETransformerLM(config).eval()
        model.generate(torch.zeros(1, prompt_len, dtype=torch.long), 8)  # warm-up
        prompt = torch.randint(0, config.vocab_size, (1, prompt_len))
        outputs: dict[bool, torch.Tensor] = {}

        calls = {
            use_cache: _decoder(model, prompt, new_tokens, use_cache, outputs)
            for use_cache in (True, False)
        }
        times = alternating(calls, repeats, budget_s=budget_s / len(widths))
        cached, uncached = statistics.median(times[True]), statistics.median(times[False])
        records.append(
            {
                "bench": "generate-cache",
                "metric": f"new tokens/s with KV cache / without, batch 1, d_model {width}",
                "value": uncached / cached,
                "target": 5.0,
                "unit": "ratio",
                "better": "higher",
                "tokens_per_s_cached": new_tokens / cached,
                "tokens_per_s_uncached": new_tokens / uncached,
                "tokens_match": bool(torch.equal(outputs[True], outputs[False])),
                "new_tokens": new_tokens,
                "prompt_len": prompt_len,
                "repeats": len(times[True]),
                "n_layers": config.n_layers,
                "block": config.block,
                "d_model": config.d_model,
                "threads": torch.get_num_threads(),
            }
        )
    return records
