"""Host syncs per training step, per model family: every read of a value back to
the host (``.item()``, ``bool(t)``, ``float(t)``, ``.tolist()``) and every op whose output
shape depends on the values (``nonzero``, ``unique``, ``masked_select``) stalls a GPU
until its queue drains. Counted on the CPU during one training step (``LMTask``'s
``training_step`` and backward) as it runs on a GPU: the token-range check takes its
device-side path (``HOST_CHECKED_DEVICES`` emptied; on the CPU it reads the range back
once, for a clear ``TokenInputError``). The allowance of each family is what it needs, each
read justified below, so a sync added later fails here.

- 1 per step, every family: the training loss's finiteness check (``NonFiniteLossError``),
  the one read of a Transformer or LSTM step (was 2 with the token-range read; 3 before).
- GPT-2 families: 1 inside Hugging Face ``transformers`` (``find_packed_sequence_indices``,
  its check for packed sequences in the position ids), not ours to remove.
- ODE heads, 1 per solve (was 23 for RK4 on 2 steps): the facade knows ``[0, S]`` on the
  host (checked and gridded there, no read), the fixed grid is stepped by
  ``TableauSolver.integrate_on`` (no ``_check_inputs``, no grid comparisons), and the
  monitor keeps the checks of ``y0``, of every step and of the final state on the device
  and reads them back once, after the solve (``StepMonitor.defer``). An adaptive
  (torchdiffeq) solve has the same 1 read of ours per solve (was 1 per step plus 4); the
  rest is torchdiffeq's own: ``_check_inputs``, step-size selection and control, its
  per-step assertions, ``unique`` of the step times (50 for dopri5 here). The adjoint's
  backward solve reads the monitor's check once per backward step (the GradScaler's
  overflow rule decides there), and torchdiffeq's adjoint reads its own again.
  ODE-LSTM RK4 on 2 steps: 2 (was 25); ODE-GPT2: 3 (was 25); dopri5: 51 (was 57);
  dopri5 with the adjoint: 136 (was 142). RK4 with the (fixed-grid) adjoint: 15 (was 28):
  its forward solve reads once, as a direct one; its backward solve, one per interval
  of ``t`` on a device tensor of times, still goes through ``tableau_odeint``
  (``_check_inputs`` 4, the grid's times 1, ``integrate``'s comparisons 6, the monitor
  once per backward step 2 on 2 steps).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.models.build import build_model
from experiments.training.config import OptimConfig
from experiments.training.task import LMTask
from ode_transformer import backbone
from ode_transformer.backbone import TokenInputError
from tests.support.fake_cuda import recorded_reads
from tests.support.paths import ROOT

DATA_DEPENDENT = {
    "aten.nonzero.default",
    "aten._unique2.default",
    "aten.unique_dim.default",
    "aten.unique_consecutive.default",
    "aten.masked_select.default",
}

RK4 = {"method": "rk4", "step_size": 0.5}
GPT2 = {"n_layer": 1, "n_embd": 8, "n_head": 2, "n_positions": 16}
ALLOWANCE: dict[str, tuple[dict[str, Any], int]] = {
    "reference bigram": ({"family": "reference"}, 1),
    "reference transformer": ({"family": "reference", "name": "transformer", "d_model": 16,
                               "n_heads": 2, "d_ff": 32, "n_layers": 1}, 1),
    "ode_transformer rk2": ({"family": "ode_transformer", "preset": "small", "n_layers": 1,
                             "d_model": 16, "d_ff": 32, "n_heads": 2, "block": "rk2"}, 1),
    "lstm": ({"family": "neuralode_lm", "name": "lstm", "embed_dim": 8, "hidden_dim": 8}, 1),
    "gpt2": ({"family": "neuralode_lm", "name": "gpt2", "config": GPT2}, 2),
    "node-transformer rk4": ({"family": "neuralode_lm", "name": "node-transformer",
                              "d_model": 8, "n_heads": 2, "d_ff": 16, "solver": RK4}, 1),
    "ode-lstm rk4": ({"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8,
                      "hidden_dim": 8, "field_hidden": 8, "solver": RK4}, 2),
    "ode-gpt2 rk4": ({"family": "neuralode_lm", "name": "ode-gpt2", "config": GPT2,
                      "field_hidden": 8, "solver": RK4}, 3),
    "ode-lstm rk4 adjoint": ({"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8,
                              "hidden_dim": 8, "field_hidden": 8,
                              "solver": {**RK4, "adjoint": True}}, 15),
    "ode-lstm dopri5": ({"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8,
                         "hidden_dim": 8, "field_hidden": 8}, 51),
    "ode-lstm dopri5 adjoint": ({"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8,
                                 "hidden_dim": 8, "field_hidden": 8,
                                 "solver": {"method": "dopri5", "adjoint": True}}, 136),
}  # fmt: skip


class DataDependentOps(TorchDispatchMode):
    """Counts the ops whose output shape depends on the values."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) in DATA_DEPENDENT:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def host_syncs(
    spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch, on_gpu: bool = True
) -> list[Any]:
    """The host reads and data-dependent ops of one training step of ``spec``'s model, the
    device-dependent checks taking their GPU path (``on_gpu``) or their CPU one."""
    if on_gpu:
        monkeypatch.setattr(backbone, "HOST_CHECKED_DEVICES", ())
    torch.manual_seed(0)
    task = LMTask(build_model(spec, 30), OptimConfig())
    trainer = SimpleNamespace(log_every_n_steps=10, progress_bar_callback=None)
    monkeypatch.setattr(LMTask, "trainer", property(lambda self: trainer))
    monkeypatch.setattr(LMTask, "global_step", property(lambda self: 0))
    task.train()
    tokens = torch.randint(0, 30, (2, 6))
    with recorded_reads() as reads, DataDependentOps() as ops:
        task.training_step((tokens, None), 0).backward()
    return [site for site, _ in reads] + ops.ops


@pytest.mark.parametrize("name", sorted(ALLOWANCE))
def test_host_syncs_per_training_step_stay_within_the_allowance(name, monkeypatch) -> None:
    spec, allowed = ALLOWANCE[name]
    syncs = host_syncs(spec, monkeypatch)
    assert len(syncs) <= allowed, syncs


OWN = {"ode-lstm rk4": 2, "ode-lstm dopri5": 2, "ode-lstm dopri5 adjoint": 4}
"""The reads of the library's own code (not torchdiffeq's) in a training step of an ODE
head: the loss check and one per solve (an adjoint's backward solve: one per step)."""


@pytest.mark.parametrize("name", sorted(OWN))
def test_an_ode_head_reads_its_own_checks_once_per_solve(name, monkeypatch) -> None:
    syncs = host_syncs(ALLOWANCE[name][0], monkeypatch)
    root = str(ROOT)
    packages = tuple(  # the library's own code; a virtual environment may sit in the checkout
        os.path.join(root, name) + os.sep
        for name in ("odelm", "neuralode_lm", "ode_transformer", "experiments", "tests")
    )
    own = [site for site in syncs if not isinstance(site, str) and site[0][0].startswith(packages)]
    assert len(own) <= OWN[name], own


def test_the_token_range_is_read_back_on_the_cpu_and_asserted_on_a_gpu(monkeypatch) -> None:
    spec, allowed = ALLOWANCE["lstm"]
    assert len(host_syncs(spec, monkeypatch, on_gpu=False)) == allowed + 1
    model = build_model(spec, 30)
    bad = torch.tensor([[1, 2, 30]])
    with pytest.raises(TokenInputError, match=r"must lie in \[0, 30\), got range \[1, 30\]"):
        model(bad)
    monkeypatch.setattr(backbone, "HOST_CHECKED_DEVICES", ())
    with pytest.raises(RuntimeError, match=r"^token ids must lie in \[0, 30\)$"):
        model(bad)  # torch._assert_async: on a GPU, a device-side assert


def test_a_read_added_to_a_forward_is_counted(monkeypatch) -> None:
    from experiments.reference import BigramLM

    spec, allowed = ALLOWANCE["reference bigram"]
    real_forward = BigramLM.forward

    def forward(self: Any, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        logits, aux = real_forward(self, tokens, *args, **kwargs)
        aux["peak"] = float(logits.max())  # a log value read back every step: a sync
        return logits, aux

    monkeypatch.setattr(BigramLM, "forward", forward)
    assert len(host_syncs(spec, monkeypatch)) == allowed + 1


@pytest.mark.parametrize("step_size", [0.25, 0.05])
def test_a_fixed_grid_solve_reads_back_once_whatever_its_steps(step_size) -> None:
    from neuralode_lm.solvers import solve

    with recorded_reads() as reads:
        solve(lambda s, z: -z, torch.ones(2, 3), 1.0, method="rk4", step_size=step_size)
    assert len(reads) == 1, reads


@pytest.mark.parametrize("method", ["rk4", "euler", "rk4_38", "dopri5"])
def test_checks_kept_on_the_device_still_name_the_step_that_went_wrong(method) -> None:
    from neuralode_lm.solvers import NonFiniteStateError, solve

    calls = {"n": 0}

    def field(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # NaN from the 6th evaluation
        calls["n"] += 1
        return -z * (float("nan") if calls["n"] > 5 else 1.0)

    step = {"euler": 7, "dopri5": 2}.get(method, 3)  # as when each step was read back
    nfe = {"euler": 6}.get(method, 8)
    fixed = {} if method == "dopri5" else {"step_size": 0.1 if method == "euler" else 0.25}
    with pytest.raises(NonFiniteStateError, match="the vector field returned non-finite") as error:
        solve(field, torch.ones(2, 3), 1.0, method=method, **fixed)
    assert (error.value.steps, error.value.nfe) == (step, nfe)
    assert f"(forward solve, step {step}, NFE {nfe}," in str(error.value)
    with pytest.raises(NonFiniteStateError, match="the initial state y0") as error:
        solve(lambda s, z: -z, torch.full((2, 3), float("nan")), 1.0, method=method, **fixed)
    assert (error.value.steps, error.value.nfe, error.value.last_step_size) == (0, 0, None)
