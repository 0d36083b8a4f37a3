"""The subcommands of ``odelm`` on a finished run: ``eval`` and ``generate`` (their options:
``experiments.cli.options``).

``eval`` leads with the perplexity the README's tables and comparison tables use, per token
(``ppl``), with the per-word one (``ppl_per_word``) beside it, each labelled, whatever the
tokenizer (they are equal for a word vocabulary). ``--json`` prints the same keys.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import torch
from jsonargparse import Namespace

from experiments.training.config import EvalConfig
from experiments.training.threads import set_threads
from odelm.errors import OdelmError

PERPLEXITY_LABELS = {
    "ppl": "per token: the perplexity of the tables",
    "ppl_per_word": "per word: total NLL / words, line ends counted as words",
}
"""The label after each perplexity line of ``odelm eval``, in the order they lead."""


def eval_lines(result: dict[str, Any]) -> list[str]:
    """``odelm eval``'s lines: the per-token perplexity first, the per-word one next, both
    labelled, then every other value of ``result`` in its order."""
    keys = [key for key in PERPLEXITY_LABELS if key in result]
    keys += [key for key in result if key not in PERPLEXITY_LABELS]
    lines = []
    for key in keys:
        label = f"  ({PERPLEXITY_LABELS[key]})" if key in PERPLEXITY_LABELS else ""
        lines.append(f"{key:>14}: {rounded(key, result[key])}{label}")
    return lines


def rounded(key: str, value: Any) -> Any:
    """A result value for people: perplexities (and numbers >= 100) to 2 decimals, other
    floats to 4 significant digits (``--json`` keeps full precision)."""
    if not isinstance(value, float):
        return value
    return f"{value:.2f}" if "ppl" in key or abs(value) >= 100 else f"{value:.4g}"


def cmd_eval(args: Namespace) -> int:
    from experiments.evaluation.trained import load_run
    from experiments.training.metrics import EvalSettings

    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(EvalConfig)}
    EvalSettings().with_overrides(flags=True, **given)  # checked before the run loads
    run = load_run(args.run, device=args.device)
    overrides = {"data_dir": args.data_dir} if args.data_dir else {}
    data = run.data(allow_changed_data=args.allow_changed_data, **overrides)
    set_threads(args.num_threads)  # once the run and its data load: an error stays one line
    result = run.evaluate(
        args.split,
        **given,
        allow_noncausal=args.allow_noncausal,
        data=data,
        batch_invariant=args.batch_invariant,
    )
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(eval_lines(result)))
    return 0


GENERATE_FLOP_BUDGET = {"cpu": 1e13, "cuda": 1e15}
"""The most forward FLOPs ``odelm generate`` starts (about 5 minutes of one CPU, or of a
GPU): beyond it the command is refused before it runs (the library's ``generate`` has no
budget). Other devices get the CPU's."""
GENERATE_POSITION_BUDGET = {"cpu": 20_000_000, "cuda": 200_000_000}
"""The most token positions ``odelm generate`` reads (beams x positions per beam), whatever
the model's size: each costs time beyond its FLOPs (about 5 microseconds of one CPU for the
tiny test model: 64 beams x 10,000 tokens, 160 million positions, took 12 minutes)."""
PROGRESS_AFTER = 2_000
"""Generation of more token positions than this prints its progress on stderr."""


def generation_positions(model: Any, prompt: int, new: int, beams: int) -> int:
    """Token positions the model reads to generate ``new`` tokens after a ``prompt``-token
    prompt with ``beams`` rows: one per step with a cache, the whole window (cropped to
    ``max_positions``) without one or once the window slides."""
    limit = getattr(model, "max_positions", None) or prompt + new
    cached = all(callable(getattr(model, n, None)) for n in ("init_cache", "next_token_logits"))
    total = 0
    for step in range(new):
        length = prompt + step
        total += 1 if cached and 0 < step and length <= limit else min(length, limit)
    return beams * total


def check_generation_cost(model: Any, prompt: int, args: Namespace) -> int:
    """Refuse ``--max-new-tokens`` with ``--num-beams`` whose token positions exceed
    ``GENERATE_POSITION_BUDGET`` or whose forward FLOPs (at least 2 x parameters per position
    read) exceed ``GENERATE_FLOP_BUDGET`` here; returns the positions."""
    from odelm.contract import model_device

    beams = args.num_beams if args.strategy == "beam" else 1
    positions = generation_positions(model, prompt, args.max_new_tokens, beams)
    parameters = sum(p.numel() for p in model.parameters())
    flops, device = 2.0 * parameters * positions, model_device(model).type
    budget = GENERATE_FLOP_BUDGET.get(device, GENERATE_FLOP_BUDGET["cpu"])
    most = GENERATE_POSITION_BUDGET.get(device, GENERATE_POSITION_BUDGET["cpu"])
    request = f"--max-new-tokens {args.max_new_tokens} with {beams} beam(s)"
    if positions > most:
        raise GenerationBudgetError(
            f"{request} reads {positions:,} token positions, over odelm generate's budget of "
            f"{most:,} on {device}; lower --max-new-tokens or --num-beams"
        )
    if flops > budget:
        raise GenerationBudgetError(
            f"{request} needs at least {flops:.2g} forward FLOPs ({positions:,} token positions "
            f"x 2 x {parameters:,} parameters), over odelm generate's budget of {budget:.0e} "
            f"on {device}; lower --max-new-tokens or --num-beams"
        )
    return positions


class GenerationBudgetError(OdelmError, ValueError):
    """A generation request would run past ``odelm generate``'s budget."""


def progress_printer(prompt: int, new: int) -> Any:
    """A ``progress(length)`` callback printing ``[generate] K/N tokens`` on stderr at most
    every 2 seconds, and at the end."""
    last = [time.monotonic()]

    def progress(length: int) -> None:
        done = length - prompt
        if time.monotonic() - last[0] >= 2.0 or done == new - 1:
            last[0] = time.monotonic()
            print(f"[generate] {done + 1}/{new} tokens", file=sys.stderr, flush=True)

    return progress


def cmd_generate(args: Namespace) -> int:
    from experiments.cli.environment import check_encodable
    from experiments.evaluation.trained import load_run
    from odelm.decoding import MAX_NEW_TOKENS, check_beam_memory

    check_encodable(args.prompt, "--prompt", sys.stdout.encoding)  # echoed with the output
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    run = load_run(args.run, device=args.device)
    prompt = len(run.encode(args.prompt)) + 1
    if args.strategy == "beam":  # the memory bound needs the model's vocabulary
        check_beam_memory(run.model, args.num_beams, 1, prompt + args.max_new_tokens, "--num-beams")
    positions = 0  # a --max-new-tokens out of its range is refused by generate, in one line
    if 0 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        positions = check_generation_cost(run.model, prompt, args)
    options = {"progress": progress_printer(prompt, args.max_new_tokens)}
    text = run.generate(
        args.prompt,
        args.max_new_tokens,
        strategy=args.strategy,
        num_beams=args.num_beams,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_at_eos=args.stop_at_eos,
        batch_invariant=args.batch_invariant,
        **(options if positions > PROGRESS_AFTER else {}),
    )
    print(text)
    return 0
