"""Generated blocks of a results page: a study's page under ``docs/results/GRID/README.md``
holds its tables between markers, drawn from the grid's ``results.csv`` and ``tune.csv``
(never typed by hand), so a number on the page cannot drift from the data::

    <!-- odelm:results -->
    (the seed-aggregated table of results.md, from results.csv)
    <!-- /odelm:results -->
    <!-- odelm:tuning -->
    (every arm's validation perplexity at every tuned value, the chosen one in bold)
    <!-- /odelm:tuning -->

``odelm verdicts --write README.md`` refreshes every page's blocks with the verdict tables,
after every input is read; ``tests/experiments/comparison/test_verdicts.py`` fails when a page differs.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.comparison.compare import GRIDS_DIR, grid_baseline
from experiments.comparison.tables import grid_has_fixed_budget, markdown_table
from experiments.training.config import ConfigError, load_yaml

BLOCK = re.compile(r"<!-- odelm:([a-z-]+) -->\n(.*?)<!-- /odelm:\1 -->", re.DOTALL)


def typed_rows(path: Path) -> list[dict[str, Any]]:
    """A CSV file's rows with numbers, booleans, JSON and empty cells (None) typed back."""
    try:
        with path.open(newline="") as handle:
            return [
                {key: _typed(value) for key, value in row.items()} for row in csv.DictReader(handle)
            ]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"cannot read {path}: {error}") from None


def _typed(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def results_block(folder: Path) -> str:
    """The grid's seed-aggregated table (as ``results.md``), from its ``results.csv``."""
    grid = GRIDS_DIR / f"{folder.name}.yaml"
    if not grid.is_file():
        raise ConfigError(f"{folder} names no grid of experiments/configs/grids: no baseline")
    spec = load_yaml(grid)
    return markdown_table(
        typed_rows(folder / "results.csv"), grid_baseline(spec), grid_has_fixed_budget(spec)
    )


def tuning_block(folder: Path) -> str:
    """Every arm's best validation perplexity at every tuned value (the chosen one in
    bold, a trial still to come as -), from the grid's ``tune.csv``; a grammar-family
    grid's best validation excess loss (nats/token) instead."""
    rows = typed_rows(folder / "tune.csv")
    if not rows:
        raise ConfigError(f"{folder / 'tune.csv'} has no trials")
    values = sorted({row["value"] for row in rows})
    key = rows[0]["key"]
    metric, digits, what = "valid_ppl", 2, "arm"
    if "valid_excess" in rows[0]:
        metric, digits, what = "valid_excess", 4, "arm: validation excess (nats/token)"
    lines = [
        f"| {what} | " + " | ".join(f"{key} {v:g}" for v in values) + " |",
        "|" + "---|" * (len(values) + 1),
    ]
    for arm in dict.fromkeys(row["arm"] for row in rows):
        cells = {row["value"]: row for row in rows if row["arm"] == arm}
        line = [arm]
        for value in values:
            row = cells.get(value)
            if row is None or row[metric] is None:
                line.append("-")
            else:
                text = f"{row[metric]:.{digits}f}"
                line.append(f"**{text}**" if row["chosen"] else text)
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, Callable[[Path], str]] = {"results": results_block, "tuning": tuning_block}
"""Each generated block's name and what draws it from the page's grid folder."""


def refreshed(page: Path) -> str:
    """The text of ``page`` with each of its generated blocks drawn anew (nothing written);
    the page's folder is its grid's."""
    text = page.read_text(encoding="utf-8")

    def draw(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in BLOCKS:
            raise ConfigError(
                f"{page}: unknown generated block {name!r}; known: {', '.join(BLOCKS)}"
            )
        return f"<!-- odelm:{name} -->\n{BLOCKS[name](page.parent)}<!-- /odelm:{name} -->"

    return BLOCK.sub(draw, text)


def pages_with_blocks(results_root: Path) -> list[Path]:
    """Every grid page under ``results_root`` that holds a generated block."""
    return sorted(
        page
        for page in results_root.glob("*/README.md")
        if BLOCK.search(page.read_text(encoding="utf-8"))
    )
