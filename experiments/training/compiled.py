"""``trainer.compile``: training steps through ``torch.compile`` of the model's forward."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from odelm.errors import OdelmError


class CompileUnsupportedError(OdelmError, ValueError):
    """``trainer.compile`` was asked of a model that does not compile cleanly."""


class CompiledModel:
    """A model whose calls go through ``torch.compile`` of its forward; every attribute is
    the model's own. Not an ``nn.Module``, so the task's state dict and checkpoints keep
    the model's keys; the compiled graphs are specialised to the training shapes."""

    def __init__(self, model: nn.Module) -> None:
        from neuralode_lm.depth_field import FixedGrid

        solver_driven = hasattr(model, "solver_stats")
        if solver_driven and not isinstance(getattr(model, "integration", None), FixedGrid):
            raise CompileUnsupportedError(
                f"trainer.compile: {type(model).__name__} runs an ODE solver library, whose "
                "step loop does not compile; set trainer.compile: false, or use an "
                "ode_transformer or a node-transformer on a fixed grid (solver: {method: rk4})"
            )
        self.model = model
        self.compiled = torch.compile(model.forward, dynamic=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)
