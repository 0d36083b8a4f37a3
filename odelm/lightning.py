"""The one Lightning package odelm trains with, chosen once, when this module is imported.

Lightning ships the same code as two packages whose classes are distinct (a
``lightning.Trainer`` refuses a ``pytorch_lightning.LightningModule``), and its maintainers
do not support mixing them. odelm takes ``lightning`` (``import lightning as L``) when it
is installed, else ``pytorch_lightning``; the environment variable ``ODELM_LIGHTNING``
(``lightning`` or ``pytorch_lightning``), set before odelm is imported, forces either.
``LMTask`` and ``LMDataModule`` derive from the chosen package's classes: train them with
its ``Trainer`` (``odelm.lightning.pl.Trainer`` is that class).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from odelm.errors import OdelmError

ENV = "ODELM_LIGHTNING"
LIGHTNING, PYTORCH_LIGHTNING = "lightning", "pytorch_lightning"
MODULES = {LIGHTNING: "lightning.pytorch", PYTORCH_LIGHTNING: "pytorch_lightning"}
"""The module of each package that holds ``Trainer``, ``LightningModule``, ``callbacks``..."""


class LightningChoiceError(OdelmError, TypeError):
    """``ODELM_LIGHTNING`` names no Lightning package, or a trainer is the other package's."""


def choose(environ: Mapping[str, str] = os.environ) -> str:
    """``lightning`` or ``pytorch_lightning``: the one ``$ODELM_LIGHTNING`` names, else
    ``lightning`` when it is installed, else ``pytorch_lightning``."""
    forced = environ.get(ENV, "").strip()
    if forced:
        if forced not in MODULES:
            raise LightningChoiceError(
                f"{ENV}={forced!r} names no Lightning package; set it to lightning or "
                "pytorch_lightning"
            )
        return forced
    return LIGHTNING if importlib.util.find_spec(LIGHTNING) is not None else PYTORCH_LIGHTNING


NAME = choose()
"""The chosen package: ``lightning`` or ``pytorch_lightning``."""

if TYPE_CHECKING:
    import pytorch_lightning as pl
else:
    pl = importlib.import_module(MODULES[NAME])


def check_trainer(trainer: Any) -> None:
    """Raise ``LightningChoiceError`` (one line naming ``ODELM_LIGHTNING``) unless
    ``trainer`` is the chosen package's ``Trainer``."""
    if isinstance(trainer, pl.Trainer):
        return
    top = type(trainer).__module__.split(".")[0]
    other = PYTORCH_LIGHTNING if NAME == LIGHTNING else LIGHTNING
    what = f"a {other} Trainer" if top == other else f"a {type(trainer).__name__}"
    raise LightningChoiceError(
        f"odelm trains with {NAME} but got {what}: use {NAME}'s Trainer, or set "
        f"{ENV}={other} before importing odelm"
    )
