"""Gradient (activation) checkpointing for the library's layers, RK stages and vector fields:
what ``transformers``' ``gradient_checkpointing_enable()`` switches on.

A module that can be recomputed in the backward pass inherits
[`Checkpointable`][odelm.checkpointing.Checkpointable]: ``transformers`` finds its
``gradient_checkpointing`` flag and sets it (with its ``_gradient_checkpointing_func``), and the
module runs its computation through
[`checkpointed`][odelm.checkpointing.Checkpointable.checkpointed], which, in training with
gradients on, keeps only the inputs and recomputes the rest in the backward pass. Off (the
default), nothing changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


class Checkpointable:
    """A module whose computation may be recomputed in the backward pass (see the module)."""

    gradient_checkpointing: bool = False
    """Set by ``gradient_checkpointing_enable()`` / ``..._disable()`` (or by hand)."""

    def checkpointing(self) -> bool:
        """Whether [`checkpointed`][odelm.checkpointing.Checkpointable.checkpointed] recomputes
        now: the flag is on, the module is in training and gradients are recorded."""
        training = getattr(self, "training", False)
        return self.gradient_checkpointing and training and torch.is_grad_enabled()

    def checkpointed(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)``, checkpointed when
        [`checkpointing`][odelm.checkpointing.Checkpointable.checkpointing]."""
        if not self.checkpointing():
            return function(*args, **kwargs)
        run = getattr(self, "_gradient_checkpointing_func", None)
        if run is None:
            run = functools.partial(checkpoint, use_reentrant=False)
        return run(function, *args, **kwargs)


def supports_checkpointing(model: torch.nn.Module) -> bool:
    """Whether any module of ``model`` can be checkpointed (has the flag)."""
    return any(hasattr(module, "gradient_checkpointing") for module in model.modules())
