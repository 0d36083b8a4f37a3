"""Benchmarks of the ODE heads and the solver facade, registered in ``odelm bench``.

* ``ode-batching``: training tokens/s of ODE-LSTM at batch 32 over batch 1 (the report's
  one-sentence regime), for the library and for plain PyTorch + torchdiffeq in one run;
* ``adjoint-memory``: peak memory of forward + backward as the integration length S grows,
  adjoint against direct backpropagation;
* ``solver-overhead``: the facade against calling each backend directly.

Each is sized to run in about a minute on a small CPU; the callers compared are timed by
[`odelm.timing.alternating`][odelm.timing.alternating] and medians reported, so neither side gains
from warm caches or from a busy machine. Iteration counts are in the records.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from neuralode_lm.fields import MLPField
from neuralode_lm.models import ODELSTM
from neuralode_lm.solvers import solve
from neuralode_lm.solvers.facade import _INSTALL_HINT
from odelm.timing import alternating, medians, seconds

__all__ = ["adjoint_memory", "ode_batching", "solver_overhead"]


# ----------------------------------------------------------------------------- ode-batching


class _PlainODEFunc(nn.Module):
    """The reference's vector field: the same MLP, called the torchdiffeq way."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def _plain_forward(model: ODELSTM, tokens: torch.Tensor) -> torch.Tensor:
    """ODE-LSTM written directly with PyTorch and ``torchdiffeq.odeint`` (same weights)."""
    import torchdiffeq

    encoder, head = model.encoder, model.head
    hidden = encoder.dropout(encoder.lstm(encoder.input_dropout(encoder.embedding(tokens)))[0])
    batch, length, dim = hidden.shape
    t = torch.tensor([0.0, head.integration_time])
    func = _PlainODEFunc(head.field.net)
    odeint = torchdiffeq.odeint_adjoint if head.solver.adjoint else torchdiffeq.odeint
    states = odeint(
        func,
        hidden.reshape(batch * length, dim),
        t,
        rtol=head.solver.rtol,
        atol=head.solver.atol,
        method="dopri5",
    )
    return head.proj(states[-1]).view(batch, length, -1)


def ode_batching() -> list[dict[str, Any]]:
    """Tokens/s of an ODE-LSTM training step at batch 32 over batch 1, library and plain.

    ODE-LSTM: 300-d LSTM (dropout 0.1), the report's MLP field (100 hidden), dopri5 with
    rtol 1e-3 and atol 1e-4, the adjoint (as in the report; the plain reference uses
    ``torchdiffeq.odeint_adjoint``), 10k vocabulary, 35-token sequences,
    cross-entropy + backward + Adam step. The same model's weights are used by the library
    forward and by a plain PyTorch + torchdiffeq forward.
    """
    torch.manual_seed(0)
    vocab, length = 10_000, 35
    solver = {"rtol": 1e-3, "atol": 1e-4, "adjoint": True}
    model = ODELSTM(vocab, embed_dim=300, hidden_dim=300, field_hidden=100, solver=solver)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.95, 0.999))
    loss_fn = nn.CrossEntropyLoss()
    nfe: dict[int, list[int]] = {32: [], 1: []}

    def step(forward: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor) -> None:
        logits = forward(tokens)
        loss = loss_fn(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def library(tokens: torch.Tensor) -> torch.Tensor:
        logits, aux = model(tokens)
        nfe[tokens.shape[0]].append(aux["nfe"])
        return logits

    def plain(tokens: torch.Tensor) -> torch.Tensor:
        return _plain_forward(model, tokens)

    batches = {b: torch.randint(0, vocab, (b, length)) for b in (32, 1)}
    steps = {32: 2, 1: 8}
    repeats = 6
    for impl in (library, plain):  # warm-up
        for b in (32, 1):
            step(impl, batches[b])
    callers = {
        (name, b): lambda impl=impl, b=b: [step(impl, batches[b]) for _ in range(steps[b])]
        for name, impl in (("library", library), ("plain", plain))
        for b in (32, 1)
    }
    times = alternating(callers, repeats)
    tps = {
        (name, b): steps[b] * b * length / median for (name, b), median in medians(times).items()
    }
    lib_ratio = tps["library", 32] / tps["library", 1]
    plain_ratio = tps["plain", 32] / tps["plain", 1]
    print(
        f"ode-batching  library: {tps['library', 1]:.0f} -> {tps['library', 32]:.0f} tokens/s "
        f"({lib_ratio:.2f}x)   plain PyTorch+torchdiffeq: {tps['plain', 1]:.0f} -> "
        f"{tps['plain', 32]:.0f} tokens/s ({plain_ratio:.2f}x)   NFE b32 "
        f"{statistics.median(nfe[32])}, b1 {statistics.median(nfe[1])}"
    )
    common = {
        "library_tokens_per_s_b1": tps["library", 1],
        "library_tokens_per_s_b32": tps["library", 32],
        "plain_tokens_per_s_b1": tps["plain", 1],
        "plain_tokens_per_s_b32": tps["plain", 32],
        "plain_ratio": plain_ratio,
        "nfe_b32": statistics.median(nfe[32]),
        "nfe_b1": statistics.median(nfe[1]),
        "iterations": f"{repeats} interleaved repeats of {steps[32]} steps at batch 32 and "
        f"{steps[1]} at batch 1, library and plain in alternating order, medians",
    }
    return [
        {
            "bench": "ode-batching",
            "metric": "tokens_per_s_batch32_over_batch1",
            "value": lib_ratio,
            "target": 4.0,
            "unit": "x",
            "better": "higher",
            **common,
        },
        {
            "bench": "ode-batching",
            "metric": "library_ratio_over_plain_ratio",
            "value": lib_ratio / plain_ratio,
            "target": 0.9,
            "unit": "x",
            "better": "higher",
            **common,
        },
    ]


# --------------------------------------------------------------------------- adjoint-memory


def _peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak CPU bytes allocated (all live tensors) while ``fn`` runs.

    Reads the memory events of the PyTorch profiler from its Chrome trace export
    (``Total Allocated`` after each allocation and free), which see every tensor
    allocation, unlike the process RSS.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/trace.json"
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as handle:
            events = json.load(handle)["traceEvents"]
    memory = [event["args"] for event in events if event.get("name") == "[memory]"]
    # "Device Type" 0 is the CPU in the trace's memory events
    return max((m["Total Allocated"] for m in memory if m.get("Device Type") == 0), default=0)


def adjoint_memory() -> list[dict[str, Any]]:
    """Peak memory of forward + backward for S = 1, 2, 4, 8: adjoint vs direct backprop.

    Field: an MLP of width 64 (hidden 128) on 512 states, dopri5 at rtol = atol = 1e-5,
    float32, torchdiffeq. The adjoint keeps only the states at the output times, so its
    peak should stay flat while direct backpropagation stores every stage of every step.
    """
    torch.manual_seed(0)
    field = MLPField(64, 128)
    y0 = torch.randn(512, 64)
    lengths = (1.0, 2.0, 4.0, 8.0)
    peaks: dict[tuple[str, float], int] = {}
    nfe: dict[tuple[str, float], tuple[int, int]] = {}

    def run(adjoint: bool, s: float) -> None:
        field.zero_grad(set_to_none=True)
        y = y0.clone().requires_grad_()
        states, stats = solve(field, y, [0.0, s], rtol=1e-5, atol=1e-5, adjoint=adjoint)
        states[-1].square().mean().backward()
        nfe["adjoint" if adjoint else "direct", s] = (stats.nfe_forward, stats.nfe_backward)

    run(True, 1.0)  # warm-up
    for adjoint in (True, False):
        for s in lengths:
            peaks["adjoint" if adjoint else "direct", s] = _peak_bytes(
                lambda adjoint=adjoint, s=s: run(adjoint, s)
            )
    mib = {key: value / 2**20 for key, value in peaks.items()}
    for name in ("adjoint", "direct"):
        row = "  ".join(f"S={s:g}: {mib[name, s]:.1f} MiB (NFE {nfe[name, s]})" for s in lengths)
        print(f"adjoint-memory {name:8s} {row}")
    detail = {f"{name}_peak_mib_S{s:g}": mib[name, s] for name, s in mib}
    detail.update({f"{name}_nfe_S{s:g}": list(nfe[name, s]) for name, s in nfe})
    return [
        {
            "bench": "adjoint-memory",
            "metric": "adjoint_peak_S8_over_S1",
            "value": peaks["adjoint", 8.0] / peaks["adjoint", 1.0],
            "target": 1.3,
            "unit": "x",
            "better": "lower",
            **detail,
        },
        {
            "bench": "adjoint-memory",
            "metric": "direct_peak_S8_over_S1",
            "value": peaks["direct", 8.0] / peaks["direct", 1.0],
            "target": 1.3,
            "unit": "x",
            "better": "higher",
            **detail,
        },
    ]


# -------------------------------------------------------------------------- solver-overhead


def _direct_callers(
    field: nn.Module, y0: torch.Tensor, t: torch.Tensor, rtol: float, atol: float
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each backend called without the facade on the same field, state and options."""

    def torchdiffeq_direct() -> torch.Tensor:
        import torchdiffeq

        return torchdiffeq.odeint(field, y0, t, rtol=rtol, atol=atol, method="dopri5")[-1]

    def torchdyn_direct() -> torch.Tensor:
        from torchdyn.numerics import odeint

        return odeint(field, y0, t, "dopri5", atol=atol, rtol=rtol)[1][-1]

    def torchode_direct() -> torch.Tensor:
        import torchode

        term = torchode.ODETerm(field)
        solver = torchode.AutoDiffAdjoint(
            torchode.Dopri5(term=term),
            torchode.IntegralController(atol=atol, rtol=rtol, term=term),
            backprop_through_step_size_control=False,  # as the facade calls it
        )
        problem = torchode.InitialValueProblem(y0=y0, t_eval=t.expand(y0.shape[0], -1).contiguous())
        return solver.solve(problem).ys[:, -1]

    callers = {"torchdiffeq": torchdiffeq_direct, "torchdyn": torchdyn_direct}
    callers["torchode"] = torchode_direct
    return {name: call for name, call in callers.items() if importlib.util.find_spec(name)}


def skipped_backends() -> list[dict[str, Any]]:
    """A record per optional backend that is not installed, saying how to install it."""
    missing = [name for name in ("torchdyn", "torchode") if not importlib.util.find_spec(name)]
    return [
        {"bench": "solver-overhead", "metric": f"facade_over_direct_{name}", "value": None}
        | {"target": 1.05, "unit": "x", "better": "lower"}
        | {"note": f"skipped: {name} is not installed ({_INSTALL_HINT[name]})"}
        for name in missing
    ]


def solver_overhead() -> list[dict[str, Any]]:
    """Facade time over direct backend time (forward + backward), per backend.

    512 states of width 256, the report's MLP field with 64 hidden units (kept narrow so
    that the run stays short; a cheaper field also makes any fixed per-call overhead of the
    facade weigh more), dopri5 at the facade's default rtol 1e-3 / atol 1e-4, float32,
    direct backpropagation; facade and direct calls alternate in order. Also lists the
    backends side by side (time and forward/backward NFE) and the adjoint's cost.
    """
    torch.manual_seed(0)
    field = MLPField(256, 64)
    y0 = torch.randn(512, 256)
    t = torch.tensor([0.0, 1.0])
    rtol, atol = 1e-3, 1e-4
    direct = _direct_callers(field, y0, t, rtol, atol)
    stats_of: dict[str, Any] = {}

    def through_facade(
        backend: str, adjoint: bool = False, states0: torch.Tensor = y0
    ) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            states, stats = solve(
                field, states0, t, rtol=rtol, atol=atol, backend=backend, adjoint=adjoint
            )
            stats_of[backend, adjoint] = stats
            return states[-1]

        return call

    def fwd_bwd(call: Callable[[], torch.Tensor]) -> None:
        field.zero_grad(set_to_none=True)
        call().square().mean().backward()

    repeats = 11
    for backend, call in _direct_callers(field, y0[:64], t, rtol, atol).items():
        fwd_bwd(through_facade(backend, states0=y0[:64]))  # warm-up: imports, first calls
        fwd_bwd(call)
    callers: dict[tuple[str, str], Callable[[], None]] = {}
    for backend, call in direct.items():
        callers[backend, "facade"] = lambda b=backend: fwd_bwd(through_facade(b))
        callers[backend, "direct"] = lambda c=call: fwd_bwd(c)
    times = alternating(callers, repeats)
    adjoint_time = {
        backend: seconds(lambda b=backend: fwd_bwd(through_facade(b, adjoint=True)))
        for backend in ("torchdiffeq", "torchdyn")
        if backend in direct
    }
    median = medians(times)
    records = []
    print(
        "solver-overhead  backend      facade_s  direct_s  ratio  NFE fwd/bwd  adjoint_s  NFE fwd/bwd"
    )
    for backend in direct:
        stats = stats_of[backend, False]
        # the median over repeats of facade / direct, each pair timed back to back, so a
        # change of machine load between repeats cancels out of the ratio
        ratio = statistics.median(
            facade / direct
            for facade, direct in zip(times[backend, "facade"], times[backend, "direct"])
        )
        record = {
            "bench": "solver-overhead",
            "metric": f"facade_over_direct_{backend}",
            "value": ratio,
            "target": 1.05,
            "unit": "x",
            "better": "lower",
            "facade_s": median[backend, "facade"],
            "direct_s": median[backend, "direct"],
            "nfe_forward": stats.nfe_forward,
            "nfe_backward": stats.nfe_backward,
            "iterations": f"{repeats} forward+backward repeats, facade and direct in "
            "alternating order; value: median of the paired ratios",
        }
        line = (
            f"solver-overhead  {backend:11s}  {record['facade_s']:8.3f}  {record['direct_s']:8.3f}"
            f"  {ratio:5.3f}  {stats.nfe_forward:4d}/{stats.nfe_backward:<4d}"
        )
        if backend in adjoint_time:
            adjoint_stats = stats_of[backend, True]
            record.update(
                adjoint_s=adjoint_time[backend],
                adjoint_nfe_forward=adjoint_stats.nfe_forward,
                adjoint_nfe_backward=adjoint_stats.nfe_backward,
                adjoint_over_direct=adjoint_time[backend] / median[backend, "facade"],
            )
            line += (
                f"   {adjoint_time[backend]:8.3f}  {adjoint_stats.nfe_forward:4d}/"
                f"{adjoint_stats.nfe_backward}"
            )
        print(line)
        records.append(record)
    for record in skipped_backends():
        print(f"solver-overhead  {record['note']}")
    return records + skipped_backends()
