"""``trainer.compile``: training steps through ``torch.compile`` of the model's forward.

On a GPU (any device but the CPU) an unmasked training batch goes through one compiled graph
of the forward and the loss (``CompiledModel.loss``),
as nanoGPT compiles its model with its loss: inductor fuses the fp32 cast, the log-softmax and
its gradient into the output layer's kernels, so no fp32 copy of the ``[B, T, V]`` logits is
made, where the forward compiled alone hands bf16 logits to an eager ``F.cross_entropy`` that
copies them to fp32. On the CPU the loss stays eager (its blocked paths are Python loops tuned
for a CPU, ``experiments.training.losses``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from experiments.training.losses import training_inputs, training_nll
from odelm.contract import call_model
from odelm.errors import OdelmError


class CompileUnsupportedError(OdelmError, ValueError):
    """``trainer.compile`` was asked of a model that does not compile cleanly."""


class CompiledModel:
    """A model whose calls go through ``torch.compile`` of its forward; every attribute is
    the model's own. Not an ``nn.Module``, so the task's state dict and checkpoints keep
    the model's keys; the compiled graphs are specialised to the training shapes.
    ``backend``: ``torch.compile``'s (the GPU check's short mode uses ``eager``)."""

    def __init__(self, model: nn.Module, backend: str = "inductor") -> None:
        from neuralode_lm.depth_field import FixedGrid

        solver_driven = hasattr(model, "solver_stats")
        if solver_driven and not isinstance(getattr(model, "integration", None), FixedGrid):
            raise CompileUnsupportedError(
                f"trainer.compile: {type(model).__name__} runs an ODE solver library, whose "
                "step loop does not compile; set trainer.compile: false, or use an "
                "ode_transformer or a node-transformer on a fixed grid (solver: {method: rk4})"
            )
        self.model = model
        self.compiled = torch.compile(model.forward, dynamic=False, backend=backend)
        self.compiled_loss = torch.compile(self.forward_loss, dynamic=False, backend=backend)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)

    def forward_loss(
        self, tokens: torch.Tensor, label_smoothing: float = 0.0
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The training loss of an unmasked batch (plus the model's regulariser) and
        ``aux``, uncompiled: what ``loss`` compiles."""
        logits, aux = call_model(self.model, training_inputs(self.model, tokens, None))
        loss = training_nll(logits, tokens, None, label_smoothing)
        return (loss + aux["reg"] if "reg" in aux else loss), aux

    def loss(
        self, tokens: torch.Tensor, label_smoothing: float = 0.0
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``forward_loss`` through ``torch.compile``: the forward and the loss in one graph."""
        return self.compiled_loss(tokens, label_smoothing)  # type: ignore[no-any-return]


def compiled_loss_applies(tokens: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether a compiled model's training loss is compiled with its forward: an unmasked
    batch off the CPU (the CPU keeps its eager blocked loss paths)."""
    return mask is None and tokens.device.type != "cpu"
