"""The run config's ``model:`` section: a typed union keyed by ``family`` and ``name``, each
model's frozen config dataclass (``config_class``), checked by jsonargparse when the config is
parsed: an unknown key, a wrong type or choice is one line naming what the key takes. The
section is kept as written, not its defaults, so a run's identity hash does not change.
"""

from __future__ import annotations

import dataclasses
import functools
import textwrap
import typing
from argparse import ArgumentError
from typing import Any

import yaml
from jsonargparse import ArgumentParser

from experiments.config_errors import ConfigError, config_error, type_name

FAMILIES = ("ode_transformer", "neuralode_lm", "reference")
SKIPPED = frozenset({"vocab_size", "embeddings"})
"""Config fields that are not ``model:`` keys: the tokenizer's size, a tensor (Python only)."""


@functools.cache
def schemas() -> dict[str, type]:
    """``"family name"`` (``"ode_transformer"`` alone) -> the model's config dataclass."""
    from experiments.reference import BigramConfig, WordLMTransformerConfig
    from neuralode_lm.models import MODELS
    from ode_transformer.config import ODETransformerConfig

    return {
        "ode_transformer": ODETransformerConfig,
        **{f"neuralode_lm {name}": cls.config_class for name, cls in MODELS.items()},  # type: ignore[attr-defined]
        "reference bigram": BigramConfig,
        "reference transformer": WordLMTransformerConfig,
    }


def model_label(spec: dict[str, Any]) -> str:
    """The key of ``schemas`` a ``model:`` section picks (family checked, name not)."""
    family = spec.get("family")
    if family not in FAMILIES:
        raise ConfigError(
            f"model.family = {family!r} is not one of {', '.join(FAMILIES)} (odelm models "
            "lists every model's keys)"
        )
    if family == "ode_transformer":
        return family
    if family == "neuralode_lm" and "name" not in spec:
        raise ConfigError("model.name is required for family neuralode_lm (e.g. ode-lstm)")
    return f"{family} {spec.get('name', 'bigram')}"


def schema_keys(schema: type) -> list[str]:
    """The ``model:`` keys a config dataclass defines (``preset`` first where it has one)."""
    keys = [f.name for f in dataclasses.fields(schema) if f.name not in SKIPPED]
    return ["preset", *keys] if schema.__name__ == "ODETransformerConfig" else keys


@functools.cache
def schema_parser(label: str) -> ArgumentParser:
    """A jsonargparse parser of one model's keys (cached per model)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(schemas()[label], nested_key=None, skip=set(SKIPPED))
    return parser


def check_model(spec: dict[str, Any], where: str = "model") -> None:
    """Refuse a ``model:`` section whose keys or values its model does not take."""
    from neuralode_lm.configs import check_renamed
    from neuralode_lm.errors import ModelConfigError
    from ode_transformer.presets import PRESETS

    if not isinstance(spec, dict) or not spec:
        return  # the run config names an empty section
    label, valid = model_label(spec), schemas()
    if label not in valid:
        family = label.split()[0]
        names = [key.split()[1] for key in valid if key.startswith(family + " ")]
        raise ConfigError(
            f"{where}.name = {spec.get('name')!r} for family {family}; valid: {', '.join(names)}"
        )
    options = {k: v for k, v in spec.items() if k not in ("family", "name")}
    if label == "ode_transformer" and not isinstance(options.get("block", ""), (str, type(None))):
        blocks = typing.get_args(typing.get_type_hints(valid[label])["block"])
        raise ConfigError(
            f"{where}.block must be a block name ({', '.join(blocks)}), "
            f"got {options['block']!r}; give your own Butcher tableau as tableau: [A, b] instead"
        )
    try:
        check_renamed(options, f"{where}.")
    except ModelConfigError as error:
        raise ConfigError(str(error)) from None
    keys = schema_keys(valid[label])
    unknown = sorted(key for key in options if key not in keys)
    if unknown:
        verb = "is not a key" if len(unknown) == 1 else "are not keys"
        fixed = "family" if label == "ode_transformer" else "family, name"
        raise ConfigError(
            f"{', '.join(f'{where}.{key}' for key in unknown)} {verb} of {label}; its keys: "
            f"{fixed}, {', '.join(keys) or '(none)'} (odelm models lists every model's keys)"
        )
    preset = options.pop("preset", "small") if label == "ode_transformer" else "small"
    if preset not in PRESETS:
        raise ConfigError(f"{where}.preset = {preset!r} is not one of {', '.join(PRESETS)}")
    if options.get("block", "") is None:  # block: null with a tableau: the custom block
        options.pop("block")
    try:
        schema_parser(label).parse_object(options)
    except ArgumentError as error:
        raise config_error(error, where, options, valid[label]) from None


def resolved_model(spec: dict[str, Any]) -> dict[str, Any]:
    """Every typed key of the model ``spec`` picks, its defaults (a preset's sizes) filled in."""
    schema = schemas()[model_label(spec)]
    defaults = {f.name: f.default for f in dataclasses.fields(schema) if f.name not in SKIPPED}
    if schema.__name__ == "ODETransformerConfig":
        from ode_transformer.presets import PRESETS

        defaults = {"preset": "small", **defaults, **PRESETS[spec.get("preset", "small")]}
    return {**{k: spec[k] for k in ("family", "name") if k in spec}, **defaults, **spec}


def resolved_model_comment(spec: dict[str, Any]) -> str:
    """``resolved_model`` as YAML comments, which ``--print_config`` appends (the section as
    written is the run's identity)."""
    text = yaml.safe_dump(resolved_model(spec), sort_keys=False, default_flow_style=False)
    lines = [f"#   {line}" for line in text.splitlines()]
    title = f"# model: every key of {model_label(spec)}, defaults filled in:"
    return "\n".join([title, *lines]) + "\n"


def model_keys_help() -> str:
    """Per model, its typed keys with their defaults (``odelm train --help``)."""
    title = "model keys (model: in the config, --model.KEY here), typed, by model; an unknown"
    lines = [f"{title} key or value is refused when the config is read:"]
    for label, schema in schemas().items():
        hints = typing.get_type_hints(schema)
        defaults = {f.name: f.default for f in dataclasses.fields(schema)}
        cells = ["preset small"] if label == "ode_transformer" else []
        for key in schema_keys(schema)[len(cells) :]:  # preset: its own cell
            cells.append(f"{key}: {type_name(hints[key], short=True)} = {defaults[key]!r}")
        text = "; ".join(cells or ["(no keys)"])
        wrapped = textwrap.fill(text, 92, initial_indent=" " * 6, subsequent_indent=" " * 6)
        lines.append(f"  family: {label.replace(' ', ', name: ')}\n{wrapped}")
    return "\n".join(lines)
