"""Every model family's forward on (fake) CUDA places every tensor it makes on CUDA:
parameters, buffers and tokens are fake CUDA tensors under
``FakeTensorMode(allow_non_fake_inputs=False)``, so a tensor a forward makes on the CPU
(``torch.arange`` without a device), or keeps on the CPU outside its buffers, raises a
device mismatch or a non-fake-input error. Runs on a CPU-only build (``tests/support/fake_cuda.py``
supplies indexing and the values read back to the host). ``torch.tensor(data,
device="cuda")`` shows as a CPU tensor (``aten.lift_fresh``): a copy from the host at each
call, which the ODE heads' ``[0, T]`` no longer make.

Generation too: ``odelm.decoding.generate`` (greedy, whose ``argmax`` reads nothing back) of
every family, and with the per-stage KV cache of ode_transformer and node-transformer.
Sampling (top-k, top-p) and beam search run for two families: beam search reads its scores
back every step (replayed from the real run, as the ODE heads' checks are) and copies its
result from the host once, at the end."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from experiments.models.build import build_model
from tests.support.fake_cuda import fake_cuda, recorded_reads, to_fake_cuda

pytestmark = pytest.mark.slow  # many small models: the full suite runs them, the fast tier not

RK4 = {"method": "rk4", "step_size": 0.5}
GPT2 = {"n_layer": 1, "n_embd": 8, "n_head": 2, "n_positions": 16}
FAMILIES: dict[str, dict[str, Any]] = {
    "ode_transformer rk2": {"family": "ode_transformer", "preset": "small", "n_layers": 1,
                            "d_model": 16, "d_ff": 32, "n_heads": 2, "block": "rk2"},
    "reference bigram": {"family": "reference"},
    "reference transformer": {"family": "reference", "name": "transformer", "d_model": 16,
                              "n_heads": 2, "d_ff": 32, "n_layers": 1},
    "lstm": {"family": "neuralode_lm", "name": "lstm", "embed_dim": 8, "hidden_dim": 8},
    "ode-lstm rk4": {"family": "neuralode_lm", "name": "ode-lstm", "embed_dim": 8,
                     "hidden_dim": 8, "field_hidden": 8, "solver": RK4},
    "gpt2": {"family": "neuralode_lm", "name": "gpt2", "config": GPT2},
    "ode-gpt2": {"family": "neuralode_lm", "name": "ode-gpt2", "config": GPT2,
                 "field_hidden": 8, "solver": RK4},
    "aug-ode-gpt2": {"family": "neuralode_lm", "name": "aug-ode-gpt2", "config": GPT2,
                     "field_hidden": 8, "solver": RK4},
    "node-transformer": {"family": "neuralode_lm", "name": "node-transformer", "d_model": 8,
                         "n_heads": 2, "d_ff": 16, "solver": RK4},
}  # fmt: skip
"""One model of each family and name. The ODE heads solve on a fixed grid: torchdiffeq's
adaptive solvers run data-dependent ops (``unique`` of the step times, step acceptance)
that fake tensors have no values for; their host syncs are counted in
``tests/odelm/test_host_syncs.py``."""
VOCAB = 30


class DeviceLog(TorchDispatchMode):
    """The devices of every tensor each op returns (intermediates included)."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:  # 0-dim CPU scalars mix
                self.devices.setdefault(str(func), set()).add(leaf.device.type)
        return out


def _fake_cuda_forward(spec: dict[str, Any]) -> tuple[Any, DeviceLog, dict[str, int]]:
    torch.manual_seed(0)
    model = build_model(spec, VOCAB).eval()
    tokens = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad(), recorded_reads() as reads:
        model(tokens)  # the values a real forward reads back, replayed below
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=False):
        to_fake_cuda(model)
        fake_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, device="cuda")
        with fake_cuda(reads) as replayer, DeviceLog() as log:
            out = model(fake_tokens)
    return out, log, replayer


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_forward_keeps_every_tensor_on_cuda(name: str) -> None:
    out, log, _ = _fake_cuda_forward(FAMILIES[name])
    logits = out[0] if isinstance(out, tuple) else out
    assert isinstance(logits, FakeTensor) and logits.device == torch.device("cuda", 0)
    assert logits.shape == (2, 6, VOCAB)
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            assert leaf.device.type == "cuda", leaf
    off_cuda = {op: devices for op, devices in log.devices.items() if devices != {"cuda"}}
    assert log.devices and off_cuda == {}


def test_a_tensor_made_on_the_cpu_inside_a_forward_is_caught() -> None:
    class Positions(torch.nn.Module):  # the bug: positions made without the tokens' device
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(VOCAB, 4)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.embedding(tokens) + torch.arange(tokens.shape[1])[:, None]

    model = Positions()
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=False):
        to_fake_cuda(model)
        tokens = torch.empty(2, 6, dtype=torch.long, device="cuda")
        with fake_cuda(), pytest.raises(RuntimeError, match="cuda:0 and cpu"):
            model(tokens)


def _fake_cuda_generate(spec: dict[str, Any], **options: Any) -> tuple[Any, DeviceLog]:
    """``odelm.decoding.generate`` of ``spec``'s model on fake CUDA, as on the CPU: greedy
    decoding reads no value back (``argmax`` stays on the device), so the only values
    replayed are those the model's own forwards read (the ODE heads' one check a solve)."""
    from odelm.decoding import generate

    torch.manual_seed(0)
    model = build_model(spec, VOCAB).eval()
    prompt = torch.randint(0, VOCAB, (2, 3))

    def decode(prompt: torch.Tensor) -> torch.Tensor:  # one call site: reads replay by site
        return generate(model, prompt, 3, **options)

    with recorded_reads() as reads:
        real = decode(prompt)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=False):
        to_fake_cuda(model)
        fake_prompt = torch.empty(prompt.shape, dtype=prompt.dtype, device="cuda")
        with fake_cuda(reads), DeviceLog() as log:
            out = decode(fake_prompt)
    assert out.shape == real.shape == (2, 6)
    return out, log


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_generates_greedily_on_cuda(name: str) -> None:
    out, log = _fake_cuda_generate(FAMILIES[name])
    assert isinstance(out, FakeTensor) and out.device == torch.device("cuda", 0)
    off_cuda = {op: devices for op, devices in log.devices.items() if devices != {"cuda"}}
    assert log.devices and off_cuda == {}


@pytest.mark.parametrize("name", ["ode_transformer rk2", "node-transformer"])
def test_a_cached_family_generates_with_its_per_stage_cache_on_cuda(name: str) -> None:
    from odelm.decoding import StepFunction

    spec = FAMILIES[name]
    assert StepFunction(build_model(spec, VOCAB)).cached  # the KV cache path, not recomputation
    for use_cache in (True, False):
        out, log = _fake_cuda_generate(spec, use_cache=use_cache)
        off_cuda = {op: devices for op, devices in log.devices.items() if devices != {"cuda"}}
        assert out.device.type == "cuda" and off_cuda == {}


STRATEGIES = {"sample": {"strategy": "sample", "top_k": 5, "top_p": 0.9},
              "beam": {"strategy": "beam", "num_beams": 2}}  # fmt: skip


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", ["ode_transformer rk2", "lstm"])
def test_sampling_and_beam_search_run_on_cuda(name: str, strategy: str) -> None:
    out, log = _fake_cuda_generate(FAMILIES[name], **STRATEGIES[strategy])
    off_cuda = {op: devices for op, devices in log.devices.items() if devices != {"cuda"}}
    # beam search ranks its finished rows on the host and copies the result back once
    expected = {"aten.lift_fresh.default": {"cpu"}} if strategy == "beam" else {}
    assert out.device.type == "cuda" and off_cuda == expected
