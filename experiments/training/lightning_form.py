"""The two spellings of a run config, and the translation between them.

``odelm train`` is a ``LightningCLI`` (``experiments.cli.lightning_cli``): its config, the
*Lightning form*, spells the trainer's settings as Lightning's ``Trainer`` does
(``trainer.val_check_interval``, ``trainer.limit_val_batches``, ``trainer.log_every_n_steps``,
``trainer.enable_progress_bar``, ``trainer.max_time``, ``trainer.max_steps: -1`` for no step
budget), the seed as ``seed_everything``, odelm's own loop settings, which Lightning's
``Trainer`` has no argument for, under ``run:``, and the model either as odelm's
``{family, name, ...keys}`` or as ``{class_path, init_args}``.

The engine (``experiments.training.train.train``) takes a ``RunConfig``, the *run form*:
every run folder's ``config.yaml``, every published config and grid, and the run's
identity hash (``experiments.training.runs.config_sha256``) are in it. ``to_lightning``
reads a run-form mapping (whole or partial; keys already in the Lightning form pass
unchanged) as the Lightning form, ``from_lightning`` the other way; a run-form config read
by ``odelm train --config`` is translated on read, so every published config still loads
and hashes as before (tests/test_lightning_form.py).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Collection
from typing import Any

from experiments.config_errors import ConfigError
from experiments.training.run_schema import key_range_check

TRAINER_RENAMES = {
    "val_every": "val_check_interval",
    "val_batches": "limit_val_batches",
    "log_every": "log_every_n_steps",
    "progress_bar": "enable_progress_bar",
}
"""Run-form ``trainer`` keys -> Lightning's names for them."""
RUN_KEYS = (
    "checkpoint_every",
    "early_stopping_patience",
    "average_last",
    "num_threads",
    "compile",
    "matmul_precision",
)
"""Run-form ``trainer`` keys that Lightning's ``Trainer`` has no argument for: the
Lightning form keeps them under ``run:``."""
LIGHTNING_TRAINER_KEYS = (
    "max_steps",
    "max_epochs",
    "max_time",
    "val_check_interval",
    "limit_val_batches",
    "log_every_n_steps",
    "enable_progress_bar",
    "accelerator",
    "devices",
    "num_nodes",
    "strategy",
    "precision",
    "deterministic",
    "logger",
)
"""The ``Trainer`` arguments ``odelm train`` takes (the engine sets the others)."""
LOGGERS = ("csv", "tensorboard", "wandb")
DEFAULT_LOGGERS = ["csv", "tensorboard"]


def renamed_key(key: str) -> str:
    """A dotted run-form key as the Lightning form spells it (``trainer.val_every`` ->
    ``trainer.val_check_interval``, ``trainer.num_threads`` -> ``run.num_threads``)."""
    section, _, name = key.partition(".")
    if key == "seed":
        return "seed_everything"
    if section == "trainer" and name in TRAINER_RENAMES:
        return f"trainer.{TRAINER_RENAMES[name]}"
    if section == "trainer" and name in RUN_KEYS:
        return f"run.{name}"
    if key == "trainer.max_time_s":
        return "trainer.max_time"
    return key


def run_form_key(key: str) -> str:
    """A dotted Lightning-form key as the run form spells it (``renamed_key``'s inverse:
    ``run.num_threads`` -> ``trainer.num_threads``)."""
    section, _, name = key.partition(".")
    if key == "seed_everything":
        return "seed"
    if section == "run":
        return f"trainer.{name}"
    back = {new: old for old, new in TRAINER_RENAMES.items()}
    return f"trainer.{back[name]}" if section == "trainer" and name in back else key


def lightning_message(text: str, written: Collection[str] = ()) -> str:
    """A run-form error message with its keys named as the Lightning form names them, but
    for those in ``written`` (the user's config file spells them so)."""
    return re.sub(
        r"\b(seed|trainer\.\w+)\b",
        lambda m: m[1] if m[1] in written else renamed_key(m[1]),
        text,
    )


# --- run form -> Lightning form ------------------------------------------------------


def time_text(seconds: float) -> str:
    """A wall-clock budget in Lightning's ``DD:HH:MM:SS``; a budget of fractional seconds as
    its seconds (``"1.5"``, exact: odelm reads it, the engine hands Lightning seconds)."""
    if float(seconds) != int(seconds):
        return repr(float(seconds))
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


def to_lightning(values: dict[str, Any]) -> dict[str, Any]:
    """A run-form config mapping (whole or partial) in the Lightning form; keys already in
    the Lightning form are kept, a key given in both spellings must agree."""
    values = dict(values)
    if "seed" in values:
        seed = values.pop("seed")
        _agree(values, "seed_everything", seed, "seed")
    trainer = values.get("trainer")
    if isinstance(trainer, dict):
        trainer, run = dict(trainer), dict(values.get("run") or {})
        for old, new in TRAINER_RENAMES.items():
            if old in trainer:
                value = trainer.pop(old)
                if old == "val_every" and isinstance(value, str):
                    if value != "epoch":
                        raise ConfigError(f"trainer.val_every = {value!r}: give steps or 'epoch'")
                    value = 1.0
                _agree(trainer, new, value, f"trainer.{old}")
        for key in RUN_KEYS:
            if key in trainer:
                _agree(run, key, trainer.pop(key), f"trainer.{key}")
        if "max_time_s" in trainer:
            seconds = trainer.pop("max_time_s")
            key_range_check("trainer.max_time_s", seconds)
            if trainer.get("max_time") is not None and seconds is not None:
                given = max_time_seconds(trainer["max_time"])
                if given != float(seconds):
                    raise ConfigError(
                        f"trainer.max_time = {trainer['max_time']!r} ({given:g} s) and "
                        f"trainer.max_time_s = {seconds!r} disagree; give one of them"
                    )
            elif seconds is not None:
                trainer["max_time"] = time_text(seconds)
        if isinstance(trainer.get("max_time"), int):  # YAML's reading of 1:30:00: seconds
            trainer["max_time"] = time_text(trainer["max_time"])
        if isinstance(trainer.get("logger"), list):
            _loggers(trainer["logger"])  # each name known
        if "max_steps" in trainer and trainer["max_steps"] is None:
            trainer["max_steps"] = -1  # Lightning's "no step budget"
        values["trainer"] = trainer
        if run:
            values["run"] = run
    return values


def _agree(section: dict[str, Any], key: str, value: Any, old: str) -> None:
    if key in section and section[key] != value:
        raise ConfigError(f"{old} = {value!r} and {key} = {section[key]!r} disagree; give one")
    section[key] = value


def run_form_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """Partial overrides (``odelm compare``'s given options) with the Lightning spellings of
    renamed keys in the run form; keys already in the run form pass, both must agree."""
    values = dict(values)
    if "seed_everything" in values:
        _agree(values, "seed", values.pop("seed_everything"), "seed_everything")
    trainer = dict(values.get("trainer") or {})
    for old, new in TRAINER_RENAMES.items():
        if new in trainer:
            value = trainer.pop(new)
            if new == "val_check_interval":
                value = _val_every(value)
            elif new == "limit_val_batches":
                value = _val_batches(value)
            _agree(trainer, old, value, f"trainer.{new}")
    for key, value in (values.pop("run", None) or {}).items():
        _agree(trainer, key, value, f"run.{key}")
    if trainer.get("max_steps") == -1:
        trainer["max_steps"] = None  # Lightning's "no step budget"
    if trainer or "trainer" in values:
        values["trainer"] = trainer
    return values


# --- Lightning form -> run form ------------------------------------------------------

_HMS = re.compile(r"(?:(\d+):)?(\d+):(\d+):(\d+)")


def max_time_seconds(value: Any) -> float:
    """Lightning's ``max_time`` (``[DD:]HH:MM:SS``, whole seconds, a ``timedelta`` or its
    keyword dict) in seconds; a ``ConfigError`` names anything else."""
    if isinstance(value, datetime.timedelta):
        total = value.total_seconds()
    elif isinstance(value, dict):
        try:
            total = datetime.timedelta(**value).total_seconds()
        except TypeError:
            total = -1.0
    else:
        text = str(value)
        match = _HMS.fullmatch(text)
        if match:
            days, hours, minutes = (int(part or 0) for part in match.groups()[:3])
            total = float(((days * 24 + hours) * 60 + minutes) * 60) + float(match[4])
        elif re.fullmatch(r"\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", text):
            total = float(text)  # seconds
        else:
            raise ConfigError(
                f"trainer.max_time = {value!r} is not a time; it must be HH:MM:SS or "
                "DD:HH:MM:SS (as Lightning spells it, e.g. 00:05:00) or null"
            )
    if total <= 0:
        raise ConfigError(f"trainer.max_time = {value!r} is out of range; it must be > 0 or null")
    return total


def plain(value: Any) -> Any:
    """``value`` with jsonargparse's constrained numbers (``PositiveInt(8)``) as the plain
    ``int`` and ``float`` they are, in nested mappings and lists too (YAML writes those)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, int) and type(value) not in (int, bool):
        return int(value)
    if isinstance(value, float) and type(value) is not float:
        return float(value)
    return value


def from_lightning(values: dict[str, Any]) -> dict[str, Any]:
    """A Lightning-form config mapping (``odelm train``'s parsed config) in the run form
    that ``experiments.training.config.parse_config`` reads."""
    values = plain(values)
    out: dict[str, Any] = {}
    seed = values.pop("seed_everything", 0)
    if isinstance(seed, bool):  # LightningCLI draws one for true before a run reads this
        raise ConfigError("seed_everything must be an int or true (draw one): odelm seeds runs")
    out["seed"] = seed
    for key in ("name", "recipe", "out_dir", "data", "optim", "eval"):
        if key in values:
            out[key] = values.pop(key)
    lightning = dict(values.pop("trainer", None) or {})
    trainer: dict[str, Any] = dict(values.pop("run", None) or {})
    for key in ("accelerator", "devices", "num_nodes", "strategy", "precision", "deterministic"):
        if key in lightning:
            trainer[key] = lightning.pop(key)
    steps = lightning.pop("max_steps", -1)
    trainer["max_steps"] = None if steps == -1 else steps
    epochs = lightning.pop("max_epochs", None)
    trainer["max_epochs"] = None if epochs == -1 else epochs
    max_time = lightning.pop("max_time", None)
    trainer["max_time_s"] = None if max_time is None else max_time_seconds(max_time)
    trainer["val_every"] = _val_every(lightning.pop("val_check_interval", None))
    trainer["val_batches"] = _val_batches(lightning.pop("limit_val_batches", None))
    if "log_every_n_steps" in lightning:
        trainer["log_every"] = lightning.pop("log_every_n_steps")
    bar = lightning.pop("enable_progress_bar", None)
    trainer["progress_bar"] = True if bar is None else bar
    logger = lightning.pop("logger", DEFAULT_LOGGERS)
    trainer["logger"] = _loggers(logger)
    if lightning:
        raise ConfigError(
            f"trainer.{min(lightning)} is not a trainer setting odelm train takes; its "
            f"keys: {', '.join(LIGHTNING_TRAINER_KEYS)} (the engine sets the others)"
        )
    out["trainer"] = trainer
    out["model"] = odelm_model(values.pop("model", None) or {})
    values.pop("config", None)
    if values:
        raise ConfigError(f"unknown key {min(values)}")
    return out


def _val_every(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value == 1.0):
        return "epoch"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"trainer.val_check_interval = {value!r}: odelm validates every N steps (an int) "
            "or once per epoch (1.0)"
        )
    return value


def _val_batches(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value == 1.0):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"trainer.limit_val_batches = {value!r}: give a number of windows (an int), or "
            "1.0 or null for the whole split"
        )
    return value


def _loggers(value: Any) -> list[str]:
    if value is True or value is None:
        return list(DEFAULT_LOGGERS)
    if value is False:
        return []
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"trainer.logger {name!r} is not one of {', '.join(LOGGERS)}")
    return names


# --- the model section ---------------------------------------------------------------


def model_classes() -> dict[str, str]:
    """``"family name"`` (``"ode_transformer"`` alone) -> its model class's import path."""
    from experiments.reference import BigramLM, WordLMTransformer
    from neuralode_lm.models import MODELS
    from ode_transformer.lm import ODETransformerLM

    classes: dict[str, type] = {
        "ode_transformer": ODETransformerLM,
        **{f"neuralode_lm {name}": cls for name, cls in MODELS.items()},
        "reference bigram": BigramLM,
        "reference transformer": WordLMTransformer,
    }
    return {label: f"{cls.__module__}.{cls.__qualname__}" for label, cls in classes.items()}


def odelm_model(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model:`` section as odelm's ``{family, name, ...keys}``: a
    ``{class_path, init_args}`` one, or the ``{architecture, config}`` of a saved model (what
    ``LMTask`` and ``examples/lightning_cli.yaml`` take; its ``vocab_size`` is left to the
    corpus), is translated: the class picks family and name, the arguments are the keys.
    odelm's own passes unchanged."""
    if "architecture" in model and "family" not in model:
        config = {k: v for k, v in dict(model.get("config") or {}).items() if k != "vocab_size"}
        path = str(model["architecture"]).replace(":", ".")
        return odelm_model({"class_path": path, "init_args": config, **_rest(model)})
    if "class_path" not in model:
        return dict(model)
    extra = sorted(set(model) - {"class_path", "init_args"})
    if extra:
        raise ConfigError(f"model.{extra[0]}: a class_path model takes only init_args beside it")
    path = str(model["class_path"])
    for label, known in model_classes().items():
        if path in (known, known.rsplit(".", 1)[1]):
            family, _, name = label.partition(" ")
            head = {"family": family, **({"name": name} if name else {})}
            return {**head, **dict(model.get("init_args") or {})}
    raise ConfigError(
        f"model.class_path = {path!r} is not an odelm model; one of "
        f"{', '.join(model_classes().values())} (or give family and name)"
    )


def _rest(model: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in model.items() if k not in ("architecture", "config")}
