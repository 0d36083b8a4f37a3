"""Run-config YAML files: ``base:`` inheritance, and the merge of a config over another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader

from experiments.config_errors import ConfigError


class Replace(dict):
    """A mapping that ``merge`` puts in place of the one under its key instead of
    merging into it: ``--model '{...}'`` replaces the file's model section."""


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``override`` wins, nested mappings merge (a ``Replace``
    mapping replaces)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Replace):
            merged[key] = dict(value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML mapping, with ``base:`` files merged underneath (paths relative to the file);
    a file that is its own base, through any chain, is an error naming the chain."""
    path = Path(path)
    if path.resolve() in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path.resolve()))
        raise ConfigError(f"base: files form a cycle ({chain}); remove one base: line")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        values = get_loader("yaml")(path.read_text()) or {}  # YAML 1.2 numbers: 1e-3
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}, line {mark.line + 1} column {mark.column + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"YAML syntax error in {where}: {problem}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a YAML mapping at the top level")
    base = values.pop("base", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"base: in {path} must be a file name, got {base!r}")
    if base:
        values = merge(load_yaml(path.parent / base, (*_seen, path.resolve())), values)
    return values
