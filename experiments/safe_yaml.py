"""The one bounded YAML reader every YAML odelm reads goes through.

``parse_yaml`` is how odelm turns YAML text into values (config files, grids, run folders'
``config.yaml``, ``--model '{...}'``), and ``BoundedLoader`` is the loader jsonargparse reads
every option value and ``--config`` with: a text over ``MAX_YAML_BYTES``, more than
``MAX_YAML_VALUES`` values once aliases are expanded (an alias bomb), nesting deeper than
``MAX_YAML_DEPTH``, an integer of more than ``MAX_INT_DIGITS`` digits, or a key given twice in
one mapping is refused in one line naming where, without echoing the text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import _loaders_dumpers
from yaml.constructor import ConstructorError

from odelm.errors import ConfigError

MAX_YAML_BYTES = 4 * 2**20
"""The largest YAML text odelm reads (4 MiB; the largest published grid is a few KiB)."""
MAX_YAML_VALUES = 200_000
"""The most values (scalars, lists, mappings) a YAML text may hold, its aliases expanded."""
MAX_YAML_DEPTH = 64
"""The deepest nesting of lists and mappings a YAML text may have."""
MAX_INT_DIGITS = 100
"""The longest integer a YAML text may spell (no setting takes a longer one)."""


class YAMLBudgetError(ConfigError):
    """A YAML text exceeds the reader's size, alias or depth budget; ``detail`` says how,
    after the text's name (``parse_yaml`` names the file or option)."""

    def __init__(self, detail: str, where: str = "a YAML value") -> None:
        super().__init__(f"{where} {detail}")
        self.detail = detail


def check_node_budget(root: yaml.Node) -> None:
    """Refuse a node graph nested deeper than ``MAX_YAML_DEPTH`` or holding more than
    ``MAX_YAML_VALUES`` values with its aliases expanded (a shared node counts once per use;
    sizes are memoised, so the walk is linear in the text, never in the expansion)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        children = _children(node)
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_YAML_VALUES:
                raise YAMLBudgetError(
                    f"holds more than {MAX_YAML_VALUES:,} values once its aliases (*name) are "
                    "expanded; a config needs far fewer: write the values out instead"
                )
        elif id(node) in open_nodes:
            raise YAMLBudgetError("has an alias (*name) inside its own anchor; remove the alias")
        elif id(node) not in sizes:
            if depth > MAX_YAML_DEPTH:
                raise YAMLBudgetError(
                    f"nests lists and mappings deeper than {MAX_YAML_DEPTH} levels (line "
                    f"{node.start_mark.line + 1}); a config nests a few: flatten it"
                )
            open_nodes.add(id(node))
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in reversed(children))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class BoundedLoader(_loaders_dumpers.get_yaml_default_loader()):  # type: ignore[misc]
    """jsonargparse's YAML loader (YAML 1.2 numbers: ``1e-3`` a float) within the budgets of
    the module docstring, refusing a key given twice in one mapping at its second place."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_node_budget(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *base" keys may be overridden: that is what they are for
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: the constructor below refuses it
            if first is not key_node:
                raise ConstructorError(
                    problem=f"key {key!r} given twice in one mapping (first on line "
                    f"{first.start_mark.line + 1}); keep one of them",
                    problem_mark=key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if sum(c.isdigit() for c in str(node.value)) > MAX_INT_DIGITS:
            raise ConstructorError(
                problem=f"an integer of more than {MAX_INT_DIGITS} digits; no setting takes one",
                problem_mark=node.start_mark,
            )
        return int(super().construct_yaml_int(node))


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
_loaders_dumpers.yaml_default_loader = BoundedLoader  # every YAML read of jsonargparse


def parse_yaml(text: str, where: str = "YAML text") -> Any:
    """The values of a YAML ``text``, read by ``BoundedLoader`` as jsonargparse reads one;
    a text beyond a budget, or not YAML, is one ``ConfigError`` naming ``where``."""
    if len(text) > MAX_YAML_BYTES:
        raise YAMLBudgetError(
            f"is {len(text):,} characters, over odelm's {MAX_YAML_BYTES:,} for YAML; check "
            "that it is what you meant",
            where,
        )
    try:
        return _loaders_dumpers.yaml_load(text) if text.strip() else None
    except YAMLBudgetError as error:
        raise YAMLBudgetError(error.detail, where) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f", line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"YAML syntax error in {where}{line}: {problem}") from None
    except RecursionError:
        raise YAMLBudgetError("nests lists and mappings too deep to read; flatten it", where)


def read_yaml_text(path: Path) -> str:
    """A YAML file's text: refused in one line when missing, over ``MAX_YAML_BYTES`` or not
    UTF-8 (UTF-16 named as such)."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise YAMLBudgetError(
                f"is {size:,} bytes, over odelm's {MAX_YAML_BYTES:,} for a YAML file; check "
                "that it is the file you meant",
                str(path),
            )
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read {path} ({error.strerror}); check its permissions") from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:2].count(b"\0") == 1:
        raise ConfigError(f"{path} is UTF-16 text; save it as UTF-8")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start}); save it as UTF-8"
        ) from None
