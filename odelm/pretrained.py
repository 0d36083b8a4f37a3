"""``save_pretrained`` / ``from_pretrained`` for every model of the library, Hugging Face style.

A saved model is a directory with ``config.json`` (the model's class, its family and its
config) and ``model.safetensors`` (the weights). The library's models each hold one typed,
frozen config (``model.config``, an instance of the class's ``config_class``): the saved
config is ``{"vocab_size": ..., **config.to_dict()}`` and the model rebuilds from it. Any
other ``nn.Module`` that inherits [`PretrainedMixin`][odelm.pretrained.PretrainedMixin] (a user's
own class) gets both methods too: for it, like Lightning's ``save_hyperparameters``, the mixin
records the arguments of the outermost constructor call. A class whose constructor takes objects
rather than plain values overrides
[`PretrainedMixin.pretrained_config`][odelm.pretrained.PretrainedMixin.pretrained_config] (what to
write) and [`PretrainedMixin.from_config`][odelm.pretrained.PretrainedMixin.from_config] (how to
rebuild).

Tensors are not written to the config: the weights file (``safetensors``, tied weights kept
tied) holds their trained values. Loading runs no code named by the files: ``architecture``
must be one of [`ARCHITECTURES`][odelm.pretrained.ARCHITECTURES] or the class
``from_pretrained`` is called on, the weights are safetensors (no pickle), their SHA-256
recorded in ``config.json`` must match, every weight must be finite. A config saved by odelm
0.3 and before still loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import importlib
import inspect
import json
import os
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from odelm.errors import OdelmError
from odelm.files import atomic_write, make_dir
from odelm.hub import (
    MODEL_TYPES,
    model_type_mismatch,
    resolve,
    restore_special_tokens,
    special_token_ids,
)

if TYPE_CHECKING:
    from typing_extensions import Self

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURES = frozenset(
    {
        "neuralode_lm.models:LSTMLM",
        "neuralode_lm.models:ODELSTM",
        "neuralode_lm.models:GPT2LM",
        "neuralode_lm.models:ODEGPT2",
        "neuralode_lm.models:AugmentedODEGPT2",
        "neuralode_lm.transformer:NODETransformerLM",
        "ode_transformer.lm:ODETransformerLM",
        "ode_transformer.encoder:ODETransformerEncoder",
        "experiments.reference:BigramLM",
        "experiments.reference:WordLMTransformer",
    }
)
"""The model classes a ``config.json`` may name: the library's own registry. Nothing else is
ever imported on load, so a saved model cannot run code of its choosing."""


class PretrainedError(OdelmError, ValueError):
    """A model cannot be saved, or a saved config names no model class."""


class PretrainedNotFoundError(OdelmError, FileNotFoundError):
    """A directory does not hold a model saved by ``save_pretrained``."""


class ModelDiskFullError(OdelmError, OSError):
    """No space was left to write a saved model (the previous files are kept)."""


class CorruptModelError(OdelmError, ValueError):
    """A saved model's files are damaged, tampered with, or hold non-finite weights."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _json_ready(value: Any, key: str) -> Any:
    """``value`` as plain JSON data; dataclasses and objects with ``to_dict`` become dicts."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_json_ready(item, key) for item in value]
    if isinstance(value, dict):
        return {str(k): _json_ready(v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_ready(dataclasses.asdict(value), key)
    if callable(getattr(value, "to_dict", None)):
        return _json_ready(value.to_dict(), key)
    raise PretrainedError(
        f"constructor argument {key} = {type(value).__name__} cannot be written to "
        f"{CONFIG_FILE}; pass it by name (a string or a dict of options) to save this model"
    )


class PretrainedMixin:
    """Adds ``save_pretrained(dir)`` and ``from_pretrained(dir)`` to an ``nn.Module``.

    ``renamed_keys`` maps a constructor keyword an earlier version saved to its name now
    (``num_layers`` -> ``n_layers``), so a model saved by that version still loads.
    """

    renamed_keys: typing.ClassVar[dict[str, str]] = {}
    config_class: typing.ClassVar[type | None] = None
    """The model's typed config (a dataclass): set, the model keeps one in ``self.config``
    and its constructor arguments are not recorded."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__ and cls.config_class is None:
            # wrapped to record the arguments save_pretrained writes to config.json
            cls.__init__ = _recording_arguments(cls.__dict__["__init__"])  # type: ignore[method-assign]

    def pretrained_config(self) -> dict[str, Any]:
        """``vocab_size`` and the typed config (or, for a class without one, the recorded
        constructor arguments) as JSON data: ``type(self).from_config(config)`` rebuilds the
        architecture."""
        config = getattr(self, "config", None)
        config = getattr(config, "__dict__", {}).get("library_config", config)  # odelm.hf wraps it
        if self.config_class is not None and isinstance(config, self.config_class):
            arguments = {"vocab_size": self.vocab_size, **config.to_dict()}  # type: ignore[attr-defined]
        else:
            arguments = self.__dict__.get("_constructor_arguments", {})
        return {
            key: _json_ready(value, key)
            for key, value in arguments.items()
            if not _is_tensor(value)
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        """A freshly initialised model from
        [`pretrained_config`][odelm.pretrained.PretrainedMixin.pretrained_config]'s output (a dict
        given for a dataclass-typed constructor argument becomes that dataclass)."""
        return cls(**_with_dataclasses(cls.__init__, _renamed(config, cls.renamed_keys)))

    def model_spec(self) -> dict[str, Any]:
        """``{"architecture", "family", "config"}``: what
        [`build_from_config`][odelm.pretrained.build_from_config] needs to rebuild this model's
        architecture (Lightning keeps it as a hyperparameter). ``family`` is the run config's
        ``model.family`` (the reference models': ``reference``)."""
        cls = type(self)
        package = cls.__module__.split(".")[0]
        architecture = f"{cls.__module__}:{cls.__qualname__}"
        spec: dict[str, Any] = {
            "architecture": architecture,
            "family": "reference" if cls.__module__ == "experiments.reference" else package,
            "config": self.pretrained_config(),
        }
        if architecture in MODEL_TYPES:  # the key transformers' AutoConfig reads (odelm.hf)
            spec["model_type"] = MODEL_TYPES[architecture]
        spec.update(special_token_ids(self))  # the tokenizer's, where the model was told them
        return spec

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters of the model, tied weights counted once (Hugging Face's
        ``num_parameters``); ``only_trainable`` counts those with ``requires_grad`` only,
        ``exclude_embeddings`` leaves out the input embedding (``get_input_embeddings``)."""
        unique = {id(p): p for p in self.parameters()}  # type: ignore[attr-defined]
        embeddings = getattr(self, "get_input_embeddings", None)
        if exclude_embeddings and callable(embeddings):
            for parameter in embeddings().parameters():
                unique.pop(id(parameter), None)
        return sum(p.numel() for p in unique.values() if p.requires_grad or not only_trainable)

    def save_pretrained(
        self, directory: str | os.PathLike[str], *, metadata: Any = None, **hub_options: Any
    ) -> None:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``; ``metadata``
        (JSON data) is stored beside the config ([`read_config`][odelm.pretrained.read_config]
        returns it). ``transformers``' options (``safe_serialization``, ``state_dict``, ...,
        passed by ``Trainer``) are ignored: the weights are one safetensors file."""
        from safetensors.torch import save_model

        directory = make_dir(directory, root=directory)  # the folder the caller names
        config = {**self.model_spec(), "metadata": _json_ready(metadata or {}, "metadata")}
        with atomic_write(directory / WEIGHTS_FILE) as partial:
            with _no_space_named(directory, WEIGHTS_FILE):
                save_model(self, str(partial))  # type: ignore[arg-type]
            config["weights_sha256"] = file_sha256(partial)
        with (
            atomic_write(directory / CONFIG_FILE) as partial,
            _no_space_named(directory, CONFIG_FILE),
        ):
            partial.write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike[str], map_location: str = "cpu", **hub_options: Any
    ) -> Self:
        """The model saved in ``directory``, in eval mode; it must be a ``cls``. ``hub_options``:
        those of ``transformers``' ``from_pretrained`` ([`odelm.hub.resolve`][odelm.hub.resolve]).
        """
        directory, map_location, dtype = resolve(directory, map_location, hub_options)
        model = load_pretrained(directory, map_location, trusted=cls)
        if dtype is not None:
            model = model.to(dtype)
        if not isinstance(model, cls):
            raise PretrainedError(
                f"{directory} holds a {type(model).__name__}, not a {cls.__name__}; load it "
                "with its own class or with odelm.pretrained.load_pretrained"
            )
        return model


@contextlib.contextmanager
def _no_space_named(directory: Path, name: str) -> Iterator[None]:
    """A full disk while writing ``name`` (safetensors reports it as its own error) becomes
    [`ModelDiskFullError`][odelm.pretrained.ModelDiskFullError]."""
    try:
        yield
    except Exception as error:
        full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        if full or "No space left on device" in str(error):
            raise ModelDiskFullError(
                errno.ENOSPC,
                f"no space left on {directory} while writing {name}; free some space or "
                "choose another out_dir (the previous file is kept)",
            ) from None
        raise


def _with_dataclasses(init: Any, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with dicts turned into the dataclasses the constructor's annotations name
    (unless the annotation also takes a dict: the constructor then reads the dict itself)."""
    try:
        hints = typing.get_type_hints(inspect.unwrap(init))
    except (NameError, TypeError):
        return config
    arguments = dict(config)
    for key, value in config.items():
        hint = hints.get(key)
        options = typing.get_args(hint) if typing.get_args(hint) else (hint,)
        target = next(
            (t for t in options if isinstance(t, type) and dataclasses.is_dataclass(t)), None
        )
        takes_dict = any(t is dict or typing.get_origin(t) is dict for t in options)
        if target is not None and isinstance(value, dict) and not takes_dict:
            arguments[key] = target(**value)
    return arguments


def _renamed(config: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """``config`` (and a nested ``config`` mapping) with old keyword names made current."""
    out = {renamed.get(key, key): value for key, value in config.items()}
    if isinstance(out.get("config"), dict) and renamed:
        out["config"] = _renamed(out["config"], renamed)
    return out


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "shape")


def _recording_arguments(init: Any) -> Any:
    """Wrap ``__init__`` so that the outermost call stores its arguments on the instance."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if "_constructor_arguments" not in self.__dict__:
            bound = signature.bind(self, *args, **kwargs)
            arguments: dict[str, Any] = {}
            for name, value in list(bound.arguments.items())[1:]:
                kind = signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(value)
                elif kind is inspect.Parameter.VAR_POSITIONAL:
                    if value:
                        raise PretrainedError(f"{init.__qualname__} got extra positional {value}")
                else:
                    arguments[name] = value
            object.__setattr__(self, "_constructor_arguments", arguments)
        init(self, *args, **kwargs)

    return wrapper


def read_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``config.json`` of a saved model (architecture, family, config, metadata)."""
    directory = Path(directory)
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (directory / name).is_file()]
    if missing:
        raise PretrainedNotFoundError(
            f"{directory} holds no saved model (missing {', '.join(missing)}); save one with "
            "model.save_pretrained(directory)"
        )
    path = directory / CONFIG_FILE
    try:
        saved = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptModelError(
            f"{path} is not valid JSON ({error}); save the model again"
        ) from None
    if not (
        isinstance(saved, dict)
        and isinstance(saved.get("model_type", ""), str)
        and isinstance(saved.get("architecture"), str)
        and isinstance(saved.get("config"), dict)
        and isinstance(saved.get("metadata", {}), dict)
    ):
        raise CorruptModelError(
            f"{path} is not a saved model's config (it needs an 'architecture' string and a "
            "'config' object); save the model again"
        )
    if mismatch := model_type_mismatch(saved, path):
        raise CorruptModelError(mismatch)
    return saved


def model_class(architecture: str, trusted: type | None = None) -> type[PretrainedMixin]:
    """The class named ``module:QualName`` in a ``config.json``: one of
    [`ARCHITECTURES`][odelm.pretrained.ARCHITECTURES], or ``trusted`` (the class the caller loads
    with) when it names it. Nothing is imported for a name outside both."""
    if trusted is not None and architecture == f"{trusted.__module__}:{trusted.__qualname__}":
        return trusted
    if architecture not in ARCHITECTURES:
        raise PretrainedError(
            f"architecture {architecture!r} is not one of the library's models "
            f"({', '.join(sorted(ARCHITECTURES))}); odelm imports no other code for a saved "
            "model (load your own class with YourClass.from_pretrained, or pass model= to "
            "LMTask.load_from_checkpoint)"
        )
    module_name, _, qualname = architecture.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def build_from_config(saved: dict[str, Any], trusted: type | None = None) -> PretrainedMixin:
    """A freshly initialised model from a ``config.json``'s ``architecture`` and ``config``."""
    cls = model_class(saved["architecture"], trusted)
    try:
        return cls.from_config(saved["config"])
    except (TypeError, ValueError) as error:
        if isinstance(error, OdelmError):
            raise
        raise CorruptModelError(
            f"the saved config of {saved['architecture']} does not build it ({error}); save "
            "the model again"
        ) from None


def load_pretrained(
    directory: str | os.PathLike[str], map_location: str = "cpu", trusted: type | None = None
) -> Any:
    """Any model saved by ``save_pretrained``, rebuilt from its config, weights loaded, in
    eval mode. The weights must match the SHA-256 recorded beside them and be finite."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    directory = Path(directory)
    saved = read_config(directory)
    weights = directory / WEIGHTS_FILE
    expected = saved.get("weights_sha256")
    if expected is not None and file_sha256(weights) != expected:
        raise CorruptModelError(
            f"{weights} does not match the SHA-256 recorded in {CONFIG_FILE} (changed or "
            "damaged since it was saved); restore it or save the model again"
        )
    model = build_from_config(saved, trusted)
    try:
        load_model(model, str(weights), strict=True, device=map_location)  # type: ignore[arg-type]
    except (SafetensorError, RuntimeError, OSError, ValueError) as error:
        raise CorruptModelError(
            f"{weights} is not a valid weights file for {saved['architecture']} "
            f"({str(error).splitlines()[0]}); restore it or save the model again"
        ) from None
    bad = [name for name, value in model.state_dict().items() if not value.isfinite().all()]  # type: ignore[attr-defined]
    if bad:
        raise CorruptModelError(
            f"{weights} holds non-finite weights ({bad[0]} has NaN or inf); the model "
            "diverged or the file is damaged: retrain or restore it"
        )
    restore_special_tokens(model, saved, directory)
    # load_model copies the weights into the model's own (CPU) parameters: move it too.
    return model.to(map_location).eval()  # type: ignore[attr-defined]
