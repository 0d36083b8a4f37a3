"""``odelm discretize RUN_DIR``: one trained vector field, many discretisations.

For a continuous-depth Transformer (``node-transformer``) the same trained fields ``F_k``
are solved by Euler, midpoint, RK3 and RK4 at several step counts and by dopri5 at rtol
1e-2 ... 1e-6. For a discrete ODE Transformer (plain stack, ``sublayer: both``) every
block's ``F`` is taken as a vector field over one unit of depth: each block's own RK step
is compared with the exact flow of its ``F`` (a tight dopri5 solve) on the states the
trained model produces (the local truncation error), and the whole model is evaluated
with every block replaced by that flow or by another tableau.

Each setting reports test perplexity (over ``--max-batches`` evaluation batches; for a
grammar-family run evaluated by sentences also the excess loss over the true grammar's
exact NLL of the same sentences, which the plots then show), mean NFE per forward pass,
forward FLOPs per token (``experiments.models.flops``), seconds, the relative distance of
the final state from a reference solve (dopri5, rtol 1e-7, in float64 by default) and the
causal leak: the largest change of an earlier position's log-probabilities when the
second half of a window changes (exactly 0 on fixed grids; nonzero when adaptive steps are
shared across positions).
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace

from experiments.data.batching import lm_nll
from experiments.data.grammar_family import family_automaton
from experiments.evaluation.depth_curve import (
    curve_points,
    extrapolation,
    metric,
    plot_depth,
    trained_label,
    training_steps,
)
from experiments.models.flops import forward_flops_per_token
from experiments.training.metrics import EvalSettings, evaluation_batches, window_length
from neuralode_lm.depth_field import FixedGrid
from neuralode_lm.solvers import DEFAULT_MAX_NUM_STEPS, solve
from neuralode_lm.transformer import NODETransformerLM
from ode_transformer.tableau import METHODS, TABLEAUX
from odelm import files
from odelm.contract import model_device
from odelm.errors import OdelmError


def _one_method_per_order() -> tuple[str, ...]:
    """The first fixed-grid method by name of each order (``ode_transformer.METHODS``, from
    ``TABLEAUX``): euler, midpoint, rk3, rk4."""
    by_order: dict[int, str] = {}
    for name in METHODS:
        by_order.setdefault(TABLEAUX[name].order(), name)
    return tuple(by_order[order] for order in sorted(by_order))


GRID_METHODS = _one_method_per_order()
RTOLS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
REFERENCE = {"method": "dopri5", "rtol": 1e-7, "atol": 1e-9, "max_num_steps": 100_000}
COLUMNS = ("method", "setting", "ppl", "nfe", "flops_per_token", "seconds", "state_error")


MAX_GRID_STEPS = DEFAULT_MAX_NUM_STEPS
"""The most steps of one ``--steps`` value: the solver's step cap."""
MAX_FIELD_EVALUATIONS = 20_000
"""The most field evaluations per token the fixed grids of one table may take (the default
``--steps 1 2 4 8`` take 150), so a table ends in minutes, not days."""


class DiscretizeError(OdelmError, ValueError):
    """The run's model has no vector field to re-discretise, or the request is over budget."""


def check_steps(steps: list[int]) -> None:
    """Refuse ``--steps`` beyond ``MAX_GRID_STEPS`` each or ``MAX_FIELD_EVALUATIONS`` in all
    (each method evaluates the field steps x its stages times per token)."""
    stages = sum(len(TABLEAUX[method].b) for method in GRID_METHODS)
    for n in steps:
        if n > MAX_GRID_STEPS:
            raise DiscretizeError(
                f"--steps {n} is over the budget of {MAX_GRID_STEPS} steps per solve (the "
                "solver's step cap); give fewer steps"
            )
    if stages * sum(steps) > MAX_FIELD_EVALUATIONS:
        raise DiscretizeError(
            f"--steps {' '.join(map(str, steps))} needs {stages * sum(steps):,} field evaluations "
            f"per token ({' + '.join(GRID_METHODS)}: {stages} stages x {sum(steps)} steps), over "
            f"the budget of {MAX_FIELD_EVALUATIONS:,}; give fewer or smaller step counts"
        )


def _adaptive(rtol: float) -> dict[str, Any]:
    return {"method": "dopri5", "rtol": rtol, "atol": rtol / 10, "max_num_steps": 100_000}


def settings(steps: list[int]) -> list[tuple[str, str, Any]]:
    """``(method, setting, integration)`` for every discretisation to evaluate."""
    rows = [(m, f"{n} step{'s' * (n > 1)}", FixedGrid(m, n)) for m in GRID_METHODS for n in steps]
    return rows + [("dopri5", f"rtol {r:.0e}", _adaptive(r)) for r in RTOLS]


@torch.no_grad()
def _final_states(model: NODETransformerLM, batches: list) -> list[torch.Tensor]:
    return [model.final_state(tokens)[0] for tokens, _ in batches]


@torch.no_grad()
def causal_leak(model: NODETransformerLM, tokens: torch.Tensor) -> float:
    """Largest change of log-probabilities at positions ``< T/2`` when the tokens from
    ``T/2`` on are replaced (by their cyclic successor ids)."""
    half = tokens.shape[1] // 2
    changed = tokens.clone()
    changed[:, half:] = (changed[:, half:] + 1) % model.vocab_size
    before = model(tokens)[0][:, :half].log_softmax(-1)
    after = model(changed)[0][:, :half].log_softmax(-1)
    return float((before - after).abs().max())


@torch.no_grad()
def evaluate_setting(
    model: NODETransformerLM, batches: list, reference: list[torch.Tensor]
) -> dict[str, Any]:
    """Perplexity, NFE, seconds, FLOPs per token and state error of the current solver."""
    nll, count, nfe, distance = 0.0, 0, [], 0.0
    started = time.perf_counter()
    for (tokens, mask), target in zip(batches, reference):
        state, _ = model.final_state(tokens)
        nfe.append(model.solver_stats.nfe_forward)
        batch_nll, batch_count = lm_nll(model.head(model.norm(state)), tokens, mask)
        nll, count = nll + float(batch_nll), count + batch_count
        distance += float((state - target).square().sum())
    seconds = time.perf_counter() - started
    scale = sum(float(t.square().sum()) for t in reference)
    return {
        "ppl": math.exp(nll / count),
        "nfe": sum(nfe) / len(nfe),
        "flops_per_token": forward_flops_per_token(model, batches),
        "seconds": seconds,
        "state_error": math.sqrt(distance / scale),
        "causal_leak": causal_leak(model, batches[0][0]),
    }


@torch.no_grad()
def block_truncation_errors(lm: torch.nn.Module, model: NODETransformerLM, tokens: torch.Tensor):
    """Per block of a discrete ``lm`` (``model`` shares its fields): its trained RK step
    against the exact flow of its ``F`` over one unit of depth, from the trained states."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    y = lm.token_embedding(tokens) + lm.position_embedding(positions)
    rows = []
    for index, (layer, field) in enumerate(zip(lm.stack.layers, model.fields)):
        step = y + layer.increment(y)
        exact = solve(field, y, [0.0, 1.0], **REFERENCE)[0][-1]
        rows.append(
            {
                "method": f"{lm.config.block} block vs exact flow",
                "setting": f"block {index}",
                "ppl": None,
                "nfe": layer.nfe,
                "flops_per_token": None,
                "seconds": None,
                "state_error": float((step - exact).norm() / exact.norm()),
                "increment_error": float((step - exact).norm() / (exact - y).norm()),
            }
        )
        y = step
    return rows


@torch.no_grad()
def depth_rows(
    model: NODETransformerLM, batches: list, reference: list[torch.Tensor], trained: Any
) -> list[dict[str, Any]]:
    """Rows of the test-time depth curve (``--plot``): the model as trained (``role``
    ``trained``) and past its training depth (``role`` ``2x``/``4x`` the steps over
    ``[0, S]``, ``2S``/``4S`` the same step over a longer depth, whose end state has no
    reference: ``state_error`` None)."""
    model.set_integration(trained)
    rows = [
        {"method": trained_label(model), "setting": "as trained", "role": "trained"}
        | evaluate_setting(model, batches, reference)
    ]
    for method, setting, grid, factor in extrapolation(model, training_steps(model, batches[0][0])):
        model.set_integration(grid)
        length = model.integration_time
        model.integration_time = length * (factor or 1)
        try:
            values = evaluate_setting(model, batches, reference)
        finally:
            model.integration_time = length
        role = f"{factor}S" if factor else setting.split()[0]
        rows.append({"method": method, "setting": setting, "role": role} | values)
        if factor:
            rows[-1]["state_error"] = None
    model.set_integration(trained)
    return rows


def discretize(
    run_dir: str | Path,
    *,
    max_batches: int = 4,
    eval_batch_size: int = 16,
    steps: list[int] | None = None,
    dtype: str = "float64",
    depth: bool = False,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """The rows of the discretisation table for a finished run (with ``depth``, the rows
    of the test-time depth curve too: ``depth_rows``), evaluated on ``device``."""
    from experiments.evaluation.trained import load_run

    counts = [("--max-batches", max_batches), ("--eval-batch-size", eval_batch_size)]
    for flag, value in [*counts, *(("--steps", n) for n in steps or [])]:
        if value < 1:
            raise DiscretizeError(f"{flag} must be >= 1, got {value}")
    check_steps(steps or [])

    run = load_run(run_dir, device=device)
    lm, data, config = run.model, run.data(), run.config
    lm = lm.to(getattr(torch, dtype)).eval()
    if isinstance(lm, NODETransformerLM):
        model, discrete = lm, None
    elif hasattr(lm, "stack") and hasattr(lm, "config"):
        try:
            model, discrete = NODETransformerLM.from_ode_transformer(lm).eval(), lm
        except ValueError as error:
            raise DiscretizeError(f"{run_dir}: {error}") from None
    else:
        raise DiscretizeError(
            f"{run_dir} holds a {type(lm).__name__}; discretize needs a node-transformer or an "
            "ODE Transformer LM (plain stack, sublayer both)"
        )
    window = window_length(model, config.data.eval_window)
    batching = replace(
        EvalSettings.from_config(config), eval_window=window, eval_batch_size=eval_batch_size
    )
    where = model_device(model)
    batches = [
        (tokens.to(where), None if mask is None else mask.to(where))
        for tokens, mask in evaluation_batches(data, "test", batching)[:max_batches]
    ]
    trained = model.integration
    model.set_integration(REFERENCE)
    reference = _final_states(model, batches)
    rows = []
    if discrete is not None:
        rows += block_truncation_errors(discrete, model, batches[0][0])
        rows.append(
            {"method": f"{discrete.config.block} (trained blocks)", "setting": "as trained"}
        )
        model.set_integration(trained)
        rows[-1].update(evaluate_setting(model, batches, reference))
    for method, setting, integration in settings(steps or [1, 2, 4, 8]):
        model.set_integration(integration)
        rows.append(
            {"method": method, "setting": setting, **evaluate_setting(model, batches, reference)}
        )
    model.set_integration(trained)
    if depth:
        rows += depth_rows(model, batches, reference, trained)
    true_nll = true_nll_per_token(data, config, batches)
    rows_per_batch = batches[0][0].shape[0]
    label = (
        f"{data.protocol}, test, first {len(batches)} batches of {window} tokens x {rows_per_batch}"
    )
    if batching.batching == "sentences":
        sentences = sum(tokens.shape[0] for tokens, _ in batches)
        label = f"{data.protocol}, test, first {sentences} sentences ({rows_per_batch} a batch)"
    for row in rows:
        row["protocol"] = label
        if true_nll is not None:  # log ppl is the model's NLL per token of the same tokens
            row["excess"] = None if row["ppl"] is None else math.log(row["ppl"]) - true_nll
    return rows


def true_nll_per_token(data: Any, config: Any, batches: list) -> float | None:
    """The true grammar's exact NLL per token of the tokens ``batches`` score, for a run of
    the grammar family evaluated sentence by sentence (None otherwise): each row is one
    whole sentence after an ``<eos>``, its targets the sentence's words and its ``<eos>``."""
    depth = config.data.grammar_depth
    if config.data.corpus != "grammar" or depth is None or config.data.batching != "sentences":
        return None
    automaton = family_automaton(depth)
    index = {word: i for i, word in enumerate(automaton.words)}
    total, count = 0.0, 0
    for tokens, mask in batches:
        for row, real in zip(tokens.tolist(), mask.tolist(), strict=True):
            words = [data.tokenizer.id_to_token(t) for t, keep in zip(row, real) if keep][1:]
            total -= automaton.log_probability([index[word] for word in words])
            count += len(words)
    return total / count


def _format(value: Any, column: str = "") -> str:
    if value is None:
        return "-"
    if column == "ppl":
        return f"{value:.2f}"
    if column == "excess":
        return f"{value:.4f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def write_table(rows: list[dict[str, Any]], path: Path) -> str:
    """A markdown table of the rows (also returned)."""
    columns = [*COLUMNS, "causal_leak", "increment_error"]
    if "excess" in rows[0]:  # a grammar-family run: excess loss over the true grammar
        columns.insert(columns.index("ppl") + 1, "excess")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_format(row.get(c), c) for c in columns) + " |" for row in rows]
    text = f"Protocol: {rows[0]['protocol']}\n\n" + "\n".join(lines) + "\n"
    files.write_text(path, text)
    return text


def plot_pareto(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Perplexity (a grammar-family run: excess loss) against NFE per method, with the
    Pareto front (no setting is both cheaper and better)."""
    from experiments.plotting import plt, save_figure

    key, label = metric(rows)
    points = [r for r in rows if r.get(key) is not None]
    figure, axes = plt.subplots(figsize=(6.5, 4.5))
    for method in dict.fromkeys(r["method"] for r in points):
        mine = sorted((r["nfe"], r[key]) for r in points if r["method"] == method)
        axes.plot(*zip(*mine), marker="o", label=method)
    front, best = [], math.inf
    for nfe, ppl in sorted((r["nfe"], r[key]) for r in points):
        if ppl < best:
            front.append((nfe, ppl))
            best = ppl
    axes.step(*zip(*front), where="post", color="black", linestyle="--", label="Pareto front")
    axes.set_xscale("log")
    axes.set_xlabel("NFE per forward pass (evaluations of F, all blocks)")
    axes.set_ylabel(label)
    axes.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=8)
    axes.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, path)


def cmd_discretize(args: Namespace) -> int:
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    out, root = Path(args.out or Path(args.run) / "discretize"), args.out or args.run
    files.check_inside(out, root, follow_last=True)  # the output refused before any work
    rows = discretize(
        args.run,
        max_batches=args.max_batches,
        eval_batch_size=args.eval_batch_size,
        steps=args.steps,
        dtype=args.dtype,
        depth=args.plot,
        device=args.device,
    )
    files.make_dir(out, root=root)  # the folder named, or one in the run
    table = write_table(rows, out / "discretize.md")
    title = f"{Path(args.run).name}\n{rows[0]['protocol']}"
    plot_pareto([r for r in rows if "role" not in r], out / "discretize.png", title)
    if args.plot:
        plot_depth(curve_points(rows), out / "depth.png", f"test-time depth: {title}")
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(table + f"\n[discretize] table and plot in {out}")
    return 0
