"""Run-config YAML files: ``base:`` inheritance and the merge of a config over another (read
by the bounded reader, ``experiments.safe_yaml``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.config_errors import ConfigError
from experiments.safe_yaml import parse_yaml, read_yaml_text


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
    values = parse_yaml(read_yaml_text(path), str(path)) or {}  # YAML 1.2 numbers: 1e-3
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a YAML mapping at the top level")
    base = values.pop("base", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"base: in {path} must be a file name, got {base!r}")
    if base:
        values = merge(load_yaml(path.parent / base, (*_seen, path.resolve())), values)
    return values
