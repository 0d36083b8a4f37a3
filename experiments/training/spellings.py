"""Lightning in both spellings: ``import pytorch_lightning as pl`` and ``import lightning as L``.

Lightning ships the same code as two packages whose classes are distinct:
``lightning.Trainer`` refuses a ``pytorch_lightning.LightningModule`` (``TypeError: model
must be a LightningModule``) and the other way round. ``LMTask`` and ``LMDataModule``
derive from the class of every installed spelling (``lightning_bases``), so either
Trainer accepts them. Which hooks a module overrides, Lightning decides by comparing its
methods with those of its own base class; so when a trainer attaches itself
(``module.trainer = trainer``), ``FollowsTrainer`` moves the object to a twin of its
class whose method order puts that trainer's spelling first. A twin is a subclass of the
class (``isinstance``, ``super()`` and pickling by name keep working) and adds nothing.

``step_progress_bar`` makes the trainer's progress bar count steps when the budget is
in steps (Lightning's Rich bar reads ``Epoch 0/-2`` there).
"""

from __future__ import annotations

import copy
import importlib
from types import ModuleType
from typing import Any

import pytorch_lightning

PYTORCH_LIGHTNING, LIGHTNING = "pytorch_lightning", "lightning"


def _installed() -> dict[str, ModuleType]:
    """The Lightning packages importable here, by spelling (``lightning`` is optional)."""
    packages = {PYTORCH_LIGHTNING: pytorch_lightning}
    try:
        packages[LIGHTNING] = importlib.import_module("lightning.pytorch")
    except ImportError:
        pass
    return packages


PACKAGES = _installed()


def lightning_bases(name: str) -> tuple[type, ...]:
    """Lightning's class ``name`` (``LightningModule``, ``LightningDataModule``) from every
    installed spelling, ``pytorch_lightning`` first (the one ``odelm train`` uses)."""
    return tuple(getattr(package, name) for package in PACKAGES.values())


def spelling(cls: type) -> str:
    """The Lightning spelling a class comes from, or the top-level package of another."""
    top = cls.__module__.split(".")[0]
    return PYTORCH_LIGHTNING if top == "lightning_fabric" else top


class _SpellingFirst(type):
    """Metaclass of a twin: the twin's method order puts ``first``'s classes first."""

    first = PYTORCH_LIGHTNING

    def mro(cls) -> list[type]:
        order = list(cls.__bases__[0].__mro__)
        own = [c for c in order if spelling(c) == cls.first]
        start = next(i for i, c in enumerate(order) if spelling(c) in PACKAGES)
        others = [c for c in order if c not in own]
        return [cls, *others[:start], *own, *others[start:]]


_METACLASSES = {
    name: type(f"_{name}First", (_SpellingFirst,), {"first": name}) for name in PACKAGES
}
_TWINS: dict[tuple[type, str], type] = {}


def twin(cls: type, name: str) -> type:
    """``cls`` with spelling ``name``'s Lightning classes first in its method order."""
    if name == PYTORCH_LIGHTNING:
        return cls
    if (cls, name) not in _TWINS:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        _TWINS[cls, name] = _METACLASSES[name](cls.__name__, (cls,), namespace)
    return _TWINS[cls, name]


def untwinned(cls: type) -> type:
    """The class a twin was made from (``cls`` itself when it is no twin)."""
    while isinstance(cls, _SpellingFirst):
        cls = cls.__bases__[0]
    return cls


def _new_instance(cls: type) -> Any:
    """An empty instance of ``cls``, which unpickling fills with the saved state."""
    return object.__new__(cls)


class FollowsTrainer:
    """Mixin: an object whose Lightning hooks are those of the trainer it is attached to."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "trainer" and value is not None and spelling(type(value)) in PACKAGES:
            cls = twin(untwinned(type(self)), spelling(type(value)))
            object.__setattr__(self, "__class__", cls)
        super().__setattr__(name, value)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as an instance of its own class (a twin is not importable by name)."""
        reduced = super().__reduce_ex__(protocol)
        cls = untwinned(type(self))
        if cls is type(self):
            return reduced
        return (_new_instance, (cls,), *reduced[2:])


class StepCounting:
    """Progress-bar mixin: the training bar's description counts steps (``step 40/200``)."""

    def _get_train_description(self, current_epoch: int) -> str:  # the Rich bar's
        trainer = self.trainer  # type: ignore[attr-defined]
        return f"Epoch {current_epoch} · step {trainer.global_step}/{trainer.max_steps}"

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, *args, **kwargs)  # type: ignore[misc]
        description = self._get_train_description(trainer.current_epoch)
        if hasattr(self, "train_progress_bar_id"):  # Rich
            if self.progress is not None and self.train_progress_bar_id is not None:  # type: ignore[attr-defined]
                theme = self.theme.description  # type: ignore[attr-defined]
                styled = f"[{theme}]{description}" if theme else description
                self.progress.update(self.train_progress_bar_id, description=styled)  # type: ignore[attr-defined]
        elif getattr(self, "train_progress_bar", None) is not None:  # tqdm
            self.train_progress_bar.set_description(description)  # type: ignore[attr-defined]


_COUNTING: dict[type, type] = {}


def step_progress_bar(trainer: Any) -> list[Any]:
    """A copy of ``trainer``'s progress bar that counts steps, when its budget is in steps
    (``max_steps``, no ``max_epochs``); returned from ``configure_callbacks`` it replaces
    the trainer's bar. Empty when there is no bar or the budget is in epochs."""
    bar = getattr(trainer, "progress_bar_callback", None)
    if bar is None or isinstance(bar, StepCounting):
        return []
    if trainer.max_steps is None or trainer.max_steps < 0 or trainer.max_epochs not in (None, -1):
        return []
    kind = type(bar)
    if kind not in _COUNTING:
        _COUNTING[kind] = type(kind.__name__, (StepCounting, kind), {})
    counting = copy.copy(bar)
    counting.__class__ = _COUNTING[kind]
    return [counting]
