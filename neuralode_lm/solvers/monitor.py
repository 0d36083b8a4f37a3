"""What the facade watches during a solve: evaluations, steps, the step cap, bad values.

Every backend adapter reports to one ``StepMonitor`` through the same three calls:
``on_step`` before each step, ``record_outcome`` when
a step is accepted or rejected (or ``set_step_counts`` once, where the
backend counts them), and the ``MonitoredField`` reports each evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import (
    FieldOutputError,
    MaxStepsExceeded,
    NonFiniteStateError,
    SolverError,
    StepSizeUnderflowError,
)

__all__ = ["MonitoredField", "SolverStats", "StepMonitor", "loss_scaled", "loss_scaling"]

_loss_scaling = [False]
"""Whether backward passes run under a loss scaler (``loss_scaling``); process-wide, as
autograd runs CUDA backward passes on its own threads."""


@contextmanager
def loss_scaling(enabled: bool = True) -> Iterator[None]:
    """Backward solves inside run under a loss scaler (``torch.amp.GradScaler``, Lightning's
    ``16-mixed``): a non-finite adjoint state there is a scaled gradient that overflowed,
    let through to the gradients so the scaler skips the optimizer step and lowers its
    scale, instead of stopping training with ``NonFiniteStateError``. Forward solves, and
    backward solves outside it, still raise."""
    before = _loss_scaling[0]
    _loss_scaling[0] = enabled
    try:
        yield
    finally:
        _loss_scaling[0] = before


@dataclass
class SolverStats:
    """Counts for one solve; ``nfe_backward`` keeps growing while the backward pass runs.

    ``nfe_forward`` counts evaluations of the field (each on the whole batch of states)
    during the solve. ``nfe_backward`` counts field evaluations in the adjoint's backward
    solve, or, for direct backpropagation, the vector-Jacobian products autograd takes
    through the field's recorded evaluations. Steps are forward steps (accepted and
    rejected); with torchode, whose step control is per sample, they are the maximum over
    samples.
    """

    backend: str
    method: str
    adjoint: str
    nfe_forward: int = 0
    nfe_backward: int = 0
    accepted_steps: int | None = None
    rejected_steps: int | None = None


class StepMonitor:
    """Counts evaluations and steps of one solve and stops it when it goes wrong."""

    def __init__(self, stats: SolverStats, max_num_steps: int | None) -> None:
        self.stats = stats
        self.max_num_steps = max_num_steps
        self.phase = "forward"
        self.steps = 0
        self.last_dt: torch.Tensor | float | None = None
        self.last_running: torch.Tensor | None = None
        self.last_output: torch.Tensor | None = None
        self.defer = False
        """Whether forward steps are checked on the device and read back once, in
        ``flush``, which the facade calls after the solve and the adapter when the backend
        stops it (torchdiffeq's own per-step checks of an adaptive solve); else each step
        reads its check back before the next one (and every backward step does)."""
        self._pending: list[tuple[torch.Tensor, Callable[[list[bool]], SolverError]]] = []

    def enter_backward(self) -> None:
        """From now on evaluations and steps belong to the backward pass."""
        self.phase = "backward"
        self.steps = 0

    @property
    def nfe(self) -> int:
        return self.stats.nfe_forward if self.phase == "forward" else self.stats.nfe_backward

    def on_eval(self, out: torch.Tensor) -> None:
        """One evaluation of the field (and, under autograd, one VJP later)."""
        self.last_output = out
        if self.phase == "forward":
            self.stats.nfe_forward += 1
            if torch.is_grad_enabled() and out.requires_grad:
                out.register_hook(_vjp_counter(self.stats))
        else:
            self.stats.nfe_backward += 1

    def note_step_size(self, dt: torch.Tensor, running: torch.Tensor | None = None) -> None:
        """Remember the step size (per row where ``running`` marks live rows) for errors."""
        self.last_dt, self.last_running = dt, running

    def on_step(self, t: torch.Tensor, y: Any, dt: torch.Tensor) -> None:
        """Called before each step (accepted or rejected) with its start time and size."""
        self.steps += 1
        self.note_step_size(dt)
        if self.max_num_steps is not None and self.steps > self.max_num_steps:
            self.flush()  # a non-finite state may be why the steps ran out
            raise self.fail(MaxStepsExceeded, f"more than max_num_steps={self.max_num_steps} steps")
        states = y if isinstance(y, (tuple, list)) else (y,)
        t, dt = t.detach(), dt.detach()
        dt_ok = (torch.isfinite(dt) & (dt != 0) & (t + dt != t)).all()
        finite = torch.stack([torch.isfinite(s).all() for s in states]).all()
        if self.phase == "backward" and _loss_scaling[0]:
            bad = (
                dt_ok.logical_not()
            )  # a scaled gradient overflowed: the GradScaler skips this step
        else:
            bad = (dt_ok & finite).logical_not()
        out = self.last_output
        out_bad = finite.new_zeros(()) if out is None else torch.isfinite(out).all().logical_not()
        # flags: bad step, the field's last output, the state, the step size non-finite
        flags = torch.stack(
            [bad, out_bad, finite.logical_not(), torch.isfinite(dt).all().logical_not()]
        )
        self._pending.append((flags, self._step_error(self.steps, self.nfe, dt)))
        if not (self.defer and self.phase == "forward"):
            self.flush()  # the one read back to the host of a good step

    def _step_error(
        self, step: int, nfe: int, dt: torch.Tensor
    ) -> Callable[[list[bool]], SolverError]:
        def error(flags: list[bool]) -> SolverError:
            _, out_bad, state_bad, dt_bad = flags
            self.steps, self.last_dt, self.last_running = step, dt, None
            if out_bad:
                reason = "the vector field returned non-finite values"
                return self.fail(NonFiniteStateError, reason, nfe=nfe)
            if state_bad:
                return self.fail(NonFiniteStateError, "the state became non-finite", nfe=nfe)
            if dt_bad:
                return self.fail(NonFiniteStateError, "the step size became non-finite", nfe=nfe)
            return self.fail(StepSizeUnderflowError, "the step size underflowed to zero", nfe=nfe)

        return error

    def check_later(
        self, bad: torch.Tensor, kind: type[SolverError], reason: str, steps: int, nfe: int
    ) -> None:
        """Raise ``kind(reason)`` at the next ``flush`` if the 0-dim bool ``bad`` is true
        there (a check kept on the device until then), as at ``steps`` and ``nfe``."""

        def error(flags: list[bool]) -> SolverError:
            self.steps = steps
            if steps == 0:
                self.last_dt = None
            return self.fail(kind, reason, nfe=nfe)

        self._pending.append((bad.reshape(1), error))

    def flush(self) -> None:
        """Read every pending check back to the host at once (one sync) and raise the error
        of the first that failed."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        values = torch.cat([flags for flags, _ in pending]).tolist()
        at = 0
        for flags, error in pending:
            these = values[at : at + flags.numel()]
            at += flags.numel()
            if these[0]:
                raise error(these)

    def record_outcome(self, accepted: bool) -> None:
        """Count one forward step as accepted or rejected."""
        if self.phase != "forward":
            return
        if self.stats.accepted_steps is None:
            self.stats.accepted_steps, self.stats.rejected_steps = 0, 0
        if accepted:
            self.stats.accepted_steps += 1
        else:
            self.stats.rejected_steps += 1  # type: ignore[operator]  # set to 0 above

    def set_step_counts(self, accepted: int, rejected: int) -> None:
        """Set the forward counts at once, where the backend (or the grid) knows them."""
        self.stats.accepted_steps, self.stats.rejected_steps = accepted, rejected

    def _last_dt(self) -> float | None:
        dt = self.last_dt
        if dt is None:
            return None
        if isinstance(dt, torch.Tensor):
            dt = dt.detach().abs()
            if self.last_running is not None and bool(self.last_running.any()):
                dt = dt[self.last_running]
            dt = float(dt.min()) if dt.numel() else None
        return dt

    def fail(self, kind: type[SolverError], reason: str, nfe: int | None = None) -> SolverError:
        """The error ``kind`` naming the phase, step, NFE (``nfe``, or the count so far),
        last step size and a remedy."""
        dt = self._last_dt()
        nfe = self.nfe if nfe is None else nfe
        return kind(
            f"{reason} ({self.phase} solve, step {self.steps}, NFE {nfe}, "
            f"last step size {dt if dt is None else f'{dt:.3g}'}); {kind.advice}",
            nfe=nfe,
            steps=self.steps,
            last_step_size=dt,
            phase=self.phase,
        )

    def diagnose(self, states: Any = ()) -> SolverError:
        """The error that explains a bad step: non-finite values or a vanishing step."""
        out = self.last_output
        if out is not None and not bool(torch.isfinite(out).all()):
            return self.fail(NonFiniteStateError, "the vector field returned non-finite values")
        if not all(bool(torch.isfinite(s).all()) for s in states):
            return self.fail(NonFiniteStateError, "the state became non-finite")
        dt = self.last_dt
        if dt is not None and not bool(torch.isfinite(torch.as_tensor(dt)).all()):
            return self.fail(NonFiniteStateError, "the step size became non-finite")
        return self.fail(StepSizeUnderflowError, "the step size underflowed to zero")


def loss_scaled(states: torch.Tensor, field: nn.Module) -> torch.Tensor:
    """``states`` through ``_ScaledOverflow``, for an adjoint solve (its backward solve
    starts from their gradient): the identity unless backward runs under ``loss_scaling``."""
    if not states.requires_grad:
        return states
    params = [p for p in field.parameters() if p.requires_grad]
    return _ScaledOverflow.apply(states, *params)


class _ScaledOverflow(torch.autograd.Function):
    """The identity on the solve's states. Backward, on the device (no host sync): a
    non-finite incoming gradient (a scaled loss gradient that overflowed) goes on as zeros
    to the adjoint's backward solve, which an adaptive solver could not integrate, and as
    NaN to the field's parameters, so the GradScaler skips the step and lowers its scale; a
    finite one goes on unchanged, with zero added to the parameters' gradients. Outside
    ``loss_scaling`` the gradient goes on untouched."""

    @staticmethod
    def forward(ctx: Any, states: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.params = [(p.shape, p.dtype) for p in params]
        return states.view_as(states)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if not _loss_scaling[0]:
            return grad, *(None for _ in ctx.params)
        finite = torch.isfinite(grad).all()
        poison = torch.where(finite, 0.0, torch.nan)
        passed = torch.where(finite, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        return passed, *(poison.to(dtype).expand(shape) for shape, dtype in ctx.params)


def _vjp_counter(stats: SolverStats) -> Callable[[torch.Tensor], None]:
    """A gradient hook counting one backward evaluation in ``stats``.

    It holds the stats, not the monitor: the monitor keeps the last output, whose graph
    holds its hooks, and a hook bound to the monitor would close a cycle through the
    autograd graph that Python's collector cannot free (every solve's graph leaked).
    """

    def count(grad: torch.Tensor) -> None:
        stats.nfe_backward += 1

    return count


class MonitoredField(nn.Module):
    """Calls the user's field with the user's state shape and reports each evaluation.

    ``autocast`` (``(device_type, dtype)``, or None) is the mixed precision the solve was
    asked under: the facade runs the solver itself outside autocast, so step-size control,
    error norms and state updates stay in the state's precision, and only the field runs
    under autocast, in the forward solve and in the adjoint's backward solve alike (one
    vector field both ways). Its output comes back in the state's dtype.

    ``evaluate_in`` (a half-precision dtype, or None) is the dtype of a half-precision model
    whose adaptive solve runs in fp32: the field sees its state and time in that dtype and
    its output comes back in fp32 (the error norms of fp16 underflow the first step size).
    """

    def __init__(
        self,
        field: Callable[..., torch.Tensor],
        monitor: StepMonitor,
        shape: torch.Size,
        autocast: tuple[str, torch.dtype] | None = None,
        evaluate_in: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.field = field
        self.monitor = monitor
        self.shape = shape
        self.autocast = autocast
        self.evaluate_in = evaluate_in

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # torchode flattens the state to [rows, features] with one time per row; restore the
        # caller's shape so the field sees what it would see with the other backends.
        flat = x.shape != self.shape and x.dim() == 2 and x.numel() == math.prod(self.shape)
        if self.evaluate_in is not None:
            out = self._call(t.to(self.evaluate_in), x.to(self.evaluate_in), flat).to(x.dtype)
        elif self.autocast is None:
            out = self._call(t, x, flat)
        else:
            device_type, dtype = self.autocast
            with torch.autocast(device_type, dtype=dtype):
                out = self._call(t, x, flat).to(x.dtype)
        self.monitor.on_eval(out)
        return out

    def _call(self, t: torch.Tensor, x: torch.Tensor, flat: bool) -> torch.Tensor:
        state = x.reshape(self.shape) if flat else x
        out = self.field(t.reshape(self.shape[:-1]) if flat else t, state)
        if not isinstance(out, torch.Tensor) or out.shape != state.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise FieldOutputError(
                f"the vector field returned {got} for a state of shape {tuple(state.shape)}; "
                "field(s, z) must return dz/ds, a tensor of z's shape"
            )
        return out.reshape(x.shape) if flat else out


def autocast_state(device_type: str) -> tuple[str, torch.dtype] | None:
    """``(device_type, dtype)`` of the autocast region the caller is in, or None."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return device_type, torch.get_autocast_dtype(device_type)
