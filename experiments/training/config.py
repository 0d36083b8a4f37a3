"""Run configuration: a run-form mapping read into a ``RunConfig`` (``parse_config``) by
``odelm train``'s parser, with unknown keys, wrong types and values out of range named in
one line; YAML run configs and run folders' ``config.yaml`` read the same way. The schema
(the typed sections, recipes, checks) is ``experiments.training.run_schema``, re-exported
here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.config_errors import ConfigError  # noqa: F401 (re-exported)
from experiments.training.identity import saved_run_values
from experiments.training.run_parser import read_run_form
from experiments.training.run_schema import (  # noqa: F401 (re-exported: the schema)
    RECIPE_DIR,
    RECIPES,
    SECTIONS,
    DataConfig,
    EvalConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
)
from experiments.training.yamlfiles import Replace, load_yaml, merge  # noqa: F401


def parse_config(values: dict[str, Any], *, where: str = "config") -> RunConfig:
    """Build a RunConfig from a plain dict (the run form; Lightning-form keys are read too),
    naming any unknown key, wrong type or value out of range in one line.

    It is read as ``odelm train --config`` reads a file: translated to the Lightning form
    and parsed by ``odelm train``'s parser (``experiments.training.run_parser``),
    so each range is checked once, by that parser's constrained types. A ``recipe`` lies
    underneath: the config's own settings win over the recipe's.
    """
    return read_run_form(values, where)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (``base: other.yaml`` inherits from another file)."""
    values = load_yaml(path)
    return parse_config(merge(values, overrides or {}), where=str(path))


def load_run_config(path: str | Path) -> RunConfig:
    """A run folder's ``config.yaml``; one written by odelm 0.3 or before, whose model keys
    have since been renamed (``num_layers``, ``n_blocks``), loads under the new names, and
    one written before ``data.order`` existed reads the window order it trained with (1)."""
    return parse_config(saved_run_values(load_yaml(path)), where=str(path))
