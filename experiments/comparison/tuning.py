"""Equal tuning for every arm of a grid: the grid's ``tune:`` section.

::

    tune:
      key: optim.lr                 # a run-config key (dotted)
      values: [0.6, 1.25, 2.5, 5]   # tried in this order by every arm
      seed: 0                       # the trials' seed, not one of the grid's seeds
                                    # (default: one past the largest)
      extend: 1                     # values added past an edge, at most (default 1)
      also: {key: optim.anneal_patience, values: [2, 3]}   # optional second key

Every arm (every run of the grid) trains once per value, or per pair of values with
``also``, at the trial seed and the grid's own budget; the value with the lowest
validation perplexity is the arm's, and the grid's seeds then train at it. The trial seed
is kept out of the results: were it one of the grid's seeds, that seed's result would be the
best of several trials, biased towards the arm with the luckiest trial, so a tune seed among
the grid's seeds is refused unless the grid says ``trial_is_result: true`` (the protocol of
the grids tuned before 0.4, whose trial at the chosen value *is* the arm's run at that
seed and is not trained twice). When an arm's best value is the first or last of the list, the list is extended by
one value past that edge (the geometric continuation of the last two), for every arm, so
the trials per arm stay equal; ``tune.csv`` and ``tune.png`` in the grid's folder hold the
sweep (``tune.csv`` is rewritten as each trial finishes, so a long sweep shows how far it
has got), and a best value still at an edge after the extensions is reported.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.comparison.tables import SEED_NOISE
from experiments.training.config import ConfigError, merge
from odelm import files

TUNE_KEYS = {"key", "values", "seed", "extend", "also", "trial_is_result"}
Recorder = Callable[[str, dict[str, Any]], None]
"""Called with a run's name and result as soon as it has one (trained or kept)."""


@dataclass(frozen=True)
class TuneSpec:
    """A grid's checked ``tune:`` section."""

    key: str
    values: tuple[float, ...]
    seed: int
    extend: int = 1
    also_key: str | None = None
    also_values: tuple[Any, ...] = (None,)
    trial_is_result: bool = False


def tune_spec(grid: dict[str, Any], seeds: Sequence[int]) -> TuneSpec | None:
    """The grid's ``tune:`` section, checked against the grid's result ``seeds`` (None
    without one)."""
    section = grid.get("tune")
    if section is None:
        return None
    if not isinstance(section, dict) or set(section) - TUNE_KEYS or "key" not in section:
        raise ConfigError(
            f"the grid's tune section takes {', '.join(sorted(TUNE_KEYS))} (key and values "
            "required), e.g. tune: {key: optim.lr, values: [0.6, 1.25, 2.5, 5]}"
        )
    values = section.get("values")
    if (
        not isinstance(values, list)
        or len(values) < 2
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values
        )
        or values != sorted(set(values))
    ):
        raise ConfigError(
            f"tune.values must be at least two increasing positive numbers, got {values!r}"
        )
    also = section.get("also") or {}
    if also and (set(also) != {"key", "values"} or not isinstance(also["values"], list)):
        raise ConfigError(
            "tune.also takes key and values, e.g. {key: optim.schedule, values: [...]}"
        )
    extend = section.get("extend", 1)
    if not isinstance(extend, int) or extend < 0:
        raise ConfigError(f"tune.extend must be a count >= 0, got {extend!r}")
    reuse = section.get("trial_is_result", False)
    if not isinstance(reuse, bool):
        raise ConfigError(f"tune.trial_is_result must be true or false, got {reuse!r}")
    seed = section.get("seed", max(seeds, default=0) + 1)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"tune.seed must be a seed (an integer >= 0), got {seed!r}")
    if seed in seeds and not reuse:
        raise ConfigError(
            f"tune.seed {seed} is also one of the grid's seeds {list(seeds)}: tuning trials "
            "need a seed of their own, or that seed's result is the best of several trials; "
            f"choose another (e.g. tune.seed: {max(seeds) + 1}), or set "
            "tune.trial_is_result: true to reuse the trial as that seed's run"
        )
    return TuneSpec(
        section["key"],
        tuple(float(v) for v in values),
        seed,
        extend,
        also.get("key"),
        tuple(also["values"]) if also else (None,),
        reuse,
    )


def nested(key: str, value: Any) -> dict[str, Any]:
    """``{"optim": {"lr": value}}`` from ``("optim.lr", value)``."""
    head, _, rest = key.partition(".")
    return {head: nested(rest, value) if rest else value}


def _slug(key: str, value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{key.rsplit('.', 1)[-1]}{text}"


def trial_name(spec: TuneSpec, arm: str, value: float, also: Any) -> str:
    """The trial's run directory: ``tune-ARM-lr2.5`` (``-anneal_patience2`` with ``also``)."""
    name = f"tune-{arm}-{_slug(spec.key, value)}"
    return name if spec.also_key is None else f"{name}-{_slug(spec.also_key, also)}"


def tuned_values(spec: TuneSpec, values: dict[str, Any], value: float, also: Any) -> dict[str, Any]:
    """A run's config values at one tuned value (the tuned keys win over run and recipe)."""
    tuned = merge(values, nested(spec.key, value))
    return tuned if spec.also_key is None else merge(tuned, nested(spec.also_key, also))


def trial_values(
    spec: TuneSpec, arm: str, values: dict[str, Any], value: float, also: Any
) -> dict[str, Any]:
    """The config of one trial: the arm's values at the tuned value, named as its run
    directory (``trial_name``), at the trial seed."""
    name = trial_name(spec, arm, value, also)
    return {**tuned_values(spec, values, value, also), "name": name, "seed": spec.seed}


def extended(values: tuple[float, ...], low: bool, high: bool) -> tuple[float, ...]:
    """The list with one value added past each edge asked for (geometric continuation)."""
    result = list(values)
    if low:
        result.insert(0, round(values[0] ** 2 / values[1], 6))
    if high:
        result.append(round(values[-1] ** 2 / values[-2], 6))
    return tuple(result)


def choose(
    spec: TuneSpec, arms: list[str], scores: dict[tuple[str, float, Any], float]
) -> dict[str, tuple[float, Any]]:
    """Each arm's (value, also) of lowest validation perplexity (non-finite counts as worst;
    ties go to the earlier value)."""
    choices = {}
    for arm in arms:
        candidates = [(v, a) for v in spec.values for a in spec.also_values]
        choices[arm] = min(
            candidates,
            key=lambda c: _finite(scores.get((arm, *c))),
        )
    return choices


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else math.inf


def run_tuning(
    spec: TuneSpec,
    arms: dict[str, dict[str, Any]],
    out_dir: Path,
    train: Callable[[list[tuple[str, dict[str, Any], str]], Recorder], dict[str, dict[str, Any]]],
) -> tuple[TuneSpec, dict[str, tuple[float, Any]], dict[str, dict[str, Any]]]:
    """Train the trials (``train`` takes ``(run name, values, label)`` triples and a
    recorder it calls with each finished trial's name and result, and returns the finished
    results by run name), extending past an edge as the module says.

    Returns the final spec, each arm's choice and the trials' results by run name.
    """
    results: dict[str, dict[str, Any]] = {}
    extensions = 0

    def record(name: str, result: dict[str, Any]) -> None:  # tune.csv so far, nothing chosen
        results[name] = result
        write_tune_table(spec, arms, results, {}, out_dir, plot=False)

    while True:
        per_arm = len(spec.values) * len(spec.also_values)
        print(
            f"[tune] {spec.key} over {list(spec.values)}"
            + (f" x {spec.also_key} over {list(spec.also_values)}" if spec.also_key else "")
            + f": {per_arm} trials per arm, {len(arms)} arms, seed {spec.seed}",
            flush=True,
        )
        todo = []
        for arm, values in arms.items():
            for value in spec.values:
                for also in spec.also_values:
                    name = trial_name(spec, arm, value, also)
                    if name not in results:
                        label = f"[tune] {arm} {_slug(spec.key, value)}"
                        todo.append((name, trial_values(spec, arm, values, value, also), label))
        results.update(train(todo, record))
        scores = {
            (arm, v, a): results.get(trial_name(spec, arm, v, a), {}).get("valid_ppl")
            for arm in arms
            for v in spec.values
            for a in spec.also_values
        }
        choices = choose(spec, list(arms), scores)
        low = [arm for arm, (v, _) in choices.items() if v == spec.values[0]]
        high = [arm for arm, (v, _) in choices.items() if v == spec.values[-1]]
        if low or high:
            edge = ", ".join(f"{arm} (best {choices[arm][0]:g})" for arm in low + high)
            if extensions >= spec.extend:
                print(f"[tune] WARNING: best value at the edge of the list: {edge}", flush=True)
                break
            spec = replace(spec, values=extended(spec.values, bool(low), bool(high)))
            extensions += 1
            print(
                f"[tune] best value at an edge for {edge}: extending every arm's list", flush=True
            )
            continue
        break
    write_tune_table(spec, arms, results, choices, out_dir)
    return spec, choices, results


def write_tune_table(
    spec: TuneSpec,
    arms: dict[str, dict[str, Any]],
    results: dict[str, dict[str, Any]],
    choices: dict[str, tuple[float, Any]],
    out_dir: Path,
    plot: bool = True,
) -> None:
    """``tune.csv`` (one row per trial; a trial not yet finished has no perplexity) and,
    with ``plot``, ``tune.png`` (validation perplexity against the tuned value, one line per
    arm, the chosen value ringed). A grid of the grammar family is read in excess loss: its
    rows also hold ``valid_excess`` (nats/token over the true grammar), which the plot shows."""
    from experiments.comparison.compute import family_depth, validation_reference

    rows = []
    for arm, values in arms.items():
        data = values.get("data", {})
        reference = validation_reference(data) if family_depth(data) is not None else None
        for value in spec.values:
            for also in spec.also_values:
                result = results.get(trial_name(spec, arm, value, also), {})
                rows.append(
                    {
                        "arm": arm,
                        "key": spec.key,
                        "value": value,
                        "also_key": spec.also_key or "",
                        "also_value": "" if also is None else also,
                        "valid_ppl": result.get("valid_ppl"),
                        "test_ppl": result.get("test_ppl"),
                        "steps": result.get("steps"),
                        "chosen": choices.get(arm) == (value, also),
                        "edge": choices.get(arm, (None,))[0] in (spec.values[0], spec.values[-1]),
                        "run": trial_name(spec, arm, value, also),
                    }
                )
                if reference is not None:
                    ppl = result.get("valid_ppl")
                    excess = math.log(ppl) - reference if _finite(ppl) < math.inf else None
                    rows[-1]["valid_excess"] = excess
    with (
        files.atomic_write(out_dir / "tune.csv") as partial,
        partial.open("w", newline="") as handle,
    ):
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if plot:
        plot_tuning(rows, spec, out_dir / "tune.png")


def plot_tuning(rows: list[dict[str, Any]], spec: TuneSpec, path: Path) -> None:
    """Validation perplexity against the tuned value (log scale), one line per arm (the
    validation excess loss for a grammar-family grid); a trial far above every arm's chosen
    one (a stalled run: 1.3 x its perplexity, + log 1.3 nats of excess) is marked by an arrow
    at the top edge in its arm's colour and listed with its value under the legend, so that
    it does not squeeze the region where the arms differ."""
    from experiments.comparison.plots import style
    from experiments.plotting import plain_log_ticks, plt, save_figure

    metric = "valid_excess" if "valid_excess" in rows[0] else "valid_ppl"
    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    chosen = [_finite(r[metric]) for r in rows if r["chosen"]]
    top = max(chosen) if chosen and max(chosen) < math.inf else math.inf
    top = top + math.log(1.3) if metric == "valid_excess" else 1.3 * top
    lines = sorted(
        {(r["arm"], r["also_value"]) for r in rows},
        key=lambda k: [r["arm"] for r in rows].index(k[0]),
    )
    above: list[str] = []  # the trials off the top, in the order of the lines
    digits = 3 if metric == "valid_excess" else 0
    for index, (arm, also) in enumerate(lines):
        mine = [r for r in rows if r["arm"] == arm and r["also_value"] == also]
        points = [(r["value"], r[metric]) for r in mine if 0 < _finite(r[metric]) < math.inf]
        label = arm if spec.also_key is None else f"{arm}, {_slug(spec.also_key, also)}"
        if points:
            axis.plot(*zip(*points), label=label, **style(index))
        for r in mine:
            if r["chosen"] and 0 < _finite(r[metric]) < math.inf:
                axis.scatter([r["value"]], [r[metric]], s=160, facecolors="none",
                             edgecolors="black", zorder=5)  # fmt: skip
            if top < _finite(r[metric]) < math.inf:
                axis.scatter([r["value"]], [top], marker="^", s=70, clip_on=False, zorder=6,
                             color=style(index)["color"])  # fmt: skip
                above.append(f"{label} at {r['value']:g}: {r[metric]:.{digits}f}")
    if above:
        axis.text(1.03, 0.0, "\u2191 off the top:\n" + "\n".join(above), transform=axis.transAxes,
                  ha="left", va="bottom", fontsize="small")  # fmt: skip
    axis.set_xscale("log")
    axis.set_yscale("log")
    if top < math.inf and axis.get_ylim()[1] > top:
        axis.set_ylim(top=top)  # the marked trials lie above it
    plain_log_ticks(axis, "y")
    axis.set_xticks(list(spec.values), [f"{v:g}" for v in spec.values])
    axis.minorticks_off()
    axis.set_xlabel(f"{spec.key} (log scale)")
    axis.set_ylabel(
        "best validation excess loss (nats/token, log scale)"
        if metric == "valid_excess"
        else "best validation perplexity (log scale)"
    )
    axis.set_title(f"Equal tuning: {len(spec.values) * len(spec.also_values)} trials per arm, "
                   f"seed {spec.seed} (ringed: chosen)")  # fmt: skip
    axis.grid(True, alpha=0.3)
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    figure.tight_layout()
    save_figure(figure, path)


def apply_choices(
    planned: list[Any], spec: TuneSpec, choices: dict[str, tuple[float, Any]], baseline: str
) -> list[Any]:
    """The grid's runs at their arm's chosen value; the run at the trial seed is the trial
    itself where the grid says ``trial_is_result`` (seed-noise runs take the baseline's value
    and are never trials)."""
    tuned = []
    for plan in planned:
        arm = baseline if plan.name == SEED_NOISE else plan.name
        value, also = choices[arm]
        values = tuned_values(spec, plan.values, value, also)
        if spec.trial_is_result and plan.seed == spec.seed and plan.name != SEED_NOISE:
            run = trial_name(spec, arm, value, also)
            values = {**values, "name": run}
            plan = replace(plan, run=run)
        tuned.append(replace(plan, values=values))
    return tuned
