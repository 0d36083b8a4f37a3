"""Config errors as one line each: jsonargparse's messages, and a value out of its field type's
range, as one ``odelm.errors.ConfigError`` naming the key. A leaf: it imports no module of
``experiments``, so every layer may import it."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any

from odelm.errors import ConfigError


def config_error(error: Exception, where: str, values: Any, schema: type) -> ConfigError:
    """jsonargparse's error on a mapping read from ``where`` as one line naming the key as
    ``where.key``, what it must be and what it got (looked up in ``values``)."""
    text = str(error)
    label = lambda key: f"{where}.{key}".rstrip(".")
    unknown = re.search(r"Group '([\w.]+)' does not accept option '([^']+)'", text)
    unknown = unknown or re.search(r"Option '(?:([\w.]+)\.)?([^'.]+)' is not accepted", text)
    if unknown:
        section, key = unknown[1] or "", unknown[2]
        valid = ", ".join(f.name for f in dataclasses.fields(key_type(schema, section)))
        dotted = f"{section}.{key}" if section else key
        return ConfigError(f"unknown key {label(dotted)}; valid keys in {label(section)}: {valid}")
    wrong = re.search(r'Parser key "([^"]+)"', text)
    if wrong:
        key = wrong[1]
        value = lookup(values, key)
        check_range(key_type(schema, key), value, key)  # raises where it is out of range
        if value is _MISSING:
            given = re.search(r"(?:Got|Given) value: (.*)", text)
            value = given[1] if given else None
        expected = type_name(key_type(schema, key))
        return ConfigError(
            f"{label(key)} must be {expected}, got {value!r} ({type(value).__name__})"
        )
    return ConfigError(text.splitlines()[0])


_MISSING = object()


def lookup(values: Any, key: str) -> Any:
    """The value of a dotted key in nested mappings (``_MISSING`` where there is none)."""
    for part in key.split("."):
        if not isinstance(values, dict) or part not in values:
            return _MISSING
        values = values[part]
    return values


def key_type(schema: Any, key: str) -> Any:
    """The type of a dotted config key in a dataclass schema (``optim.lr`` -> float)."""
    for part in filter(None, key.split(".")):
        schema = typing.get_type_hints(schema)[part]
    return schema


def type_name(annotation: Any, short: bool = False) -> str:
    """A type as people read it: ``one of a, b``, ``int or null``, ``float``; ``short`` (help
    lines): ``{a,b}``, ``int | None``."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        choices = [str(arg) for arg in args]
        return "{" + ",".join(choices) + "}" if short else "one of " + ", ".join(choices)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return (" | " if short else " or ").join(type_name(arg, short) for arg in args)
    if annotation is type(None):
        return "None" if short else "null"
    if typing.get_origin(annotation) is list and len(args) == 1:
        return f"list[{type_name(args[0], short)}]"
    if typing.get_origin(annotation) is not None:
        return str(annotation).replace("typing.", "")
    if hasattr(annotation, "_expression") and hasattr(annotation, "_type"):  # jsonargparse's
        limits = annotation._expression.replace("v", "").replace(" and ", ", ")
        if annotation._type is int:  # PositiveInt: >0 is >=1
            limits = re.sub(r">(-?\d+)", lambda m: f">={int(m[1]) + 1}", limits)
        return f"{annotation._type.__name__} {limits}"  # restricted_number_type: "int >=1"
    return getattr(annotation, "__name__", str(annotation))


def _ranged(hint: Any) -> Any:
    """The jsonargparse range type of a field type (``PositiveInt | None``), or None."""
    return next((a for a in typing.get_args(hint) or (hint,) if hasattr(a, "_restrictions")), None)


def range_text(hint: Any) -> str | None:
    """The range a field's type allows (``>= 1``, ``in [0, 1)``, ``> 0 or null``), or None."""
    ranged = _ranged(hint)
    if ranged is None:
        return None
    limits = {op.__name__: value for op, value in ranged._restrictions}  # operator.ge: "ge"
    if len(limits) == 1:
        ((name, value),) = limits.items()
        if ranged._type is int and name == "gt":  # PositiveInt: > 0 is >= 1
            name, value = "ge", value + 1
        text = f"{ {'ge': '>=', 'gt': '>'}[name] } {value}"
    else:
        low, high = ("[" if "ge" in limits else "("), ("]" if "le" in limits else ")")
        text = f"in {low}{limits.get('ge', limits.get('gt'))}, "
        text += f"{limits.get('le', limits.get('lt'))}{high}"
    return text + (" or null" if type(None) in typing.get_args(hint) else "")


def check_range(hint: Any, value: Any, label: str) -> None:
    """Raise ``ConfigError`` naming ``label`` unless ``value`` (a number, or a list of them)
    lies in the range of the field type ``hint`` (None and other values pass)."""
    if isinstance(value, list):
        (item,) = typing.get_args(hint) or (None,)
        for index, each in enumerate(value):
            check_range(item, each, f"{label}[{index}]")
        return
    ranged = _ranged(hint)
    if ranged is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if ranged._type is int and not isinstance(value, int):
        return  # a type error, not a range's
    try:
        ranged(value)
    except ValueError:
        raise ConfigError(
            f"{label} = {value!r} is out of range; it must be {range_text(hint)}"
        ) from None
