"""Batch-invariant adaptive solves: a sequence's logits that do not depend on its batch.

An adaptive solver (dopri5) run over a whole batch chooses one step size from the error of
every row, so a row's logits move with its neighbours by up to about the solver tolerance
(a sentence scored in a padded batch differs from it scored alone by ~1e-3 in the logits).
Modules that can solve each row on its own carry a ``solve_rows_alone`` switch (the ODE heads
step each position with torchode's per-instance step control; node-transformer solves each
sequence alone, about ``B`` times the work); [`rows_alone`][odelm.invariance.rows_alone] sets
it for a block of code. Evaluation and generation (``odelm eval``, ``odelm generate``,
``evaluate()``, [`odelm.decoding.generate`][odelm.decoding.generate], the Hugging Face
forward in evaluation mode) switch it on by default; training, and the test evaluation that
ends a training run, keep the shared solve (so recorded results reproduce unchanged).
Fixed-grid models are batch-invariant anyway: the switch changes nothing for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def rows_alone(model: Any, on: bool = True) -> Iterator[None]:
    """Within: every module of ``model`` with a ``solve_rows_alone`` switch has it set to
    ``on`` (evaluation mode only: training always solves the batch together); restored after.
    A model that is no ``nn.Module`` has no switch: nothing changes."""
    modules = model.modules() if isinstance(model, torch.nn.Module) else []
    switches = [m for m in modules if hasattr(type(m), "solve_rows_alone")]
    before = [m.__dict__.get("solve_rows_alone") for m in switches]
    for module in switches:
        module.solve_rows_alone = on
    try:
        yield
    finally:
        for module, value in zip(switches, before):
            if value is None:
                del module.solve_rows_alone
            else:
                module.solve_rows_alone = value


@contextlib.contextmanager
def evaluating(model: Any, batch_invariant: bool = True) -> Iterator[None]:
    """Within: ``model`` in evaluation mode, its adaptive solves batch-invariant or not as
    ``batch_invariant`` says ([`rows_alone`][odelm.invariance.rows_alone]); its training
    mode restored after (a model that is no ``nn.Module`` is left as it is)."""
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        with rows_alone(model, batch_invariant):
            yield
    finally:
        if was_training:
            model.train(True)
