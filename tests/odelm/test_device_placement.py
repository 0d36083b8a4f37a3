"""The harness puts its tensors on the training device: what NCCL all-reduces, a
resumed stream state, generation's prompt and generator, evaluation after ``fit``. Each
test runs on a CPU machine, with ``meta`` tensors or monkeypatched CUDA queries."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from experiments.reference import BigramLM
from experiments.training.config import OptimConfig
from experiments.training.task import LMTask
from neuralode_lm import LSTMLM


def _attach(task: LMTask, reduce: Any) -> None:
    """A stand-in trainer whose strategy all-reduces with ``reduce``."""
    trainer = SimpleNamespace(strategy=SimpleNamespace(reduce=reduce), global_step=0)
    task.trainer = trainer  # type: ignore[assignment]


def test_pooled_perplexity_is_all_reduced_on_the_module_device() -> None:
    # NCCL has no CPU backend: the totals must be made on the module's device.
    task = LMTask(BigramLM(7), OptimConfig()).to(torch.device("meta"))
    seen: list[torch.device] = []

    def reduce(tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        seen.append(tensor.device)
        assert reduce_op == "sum" and tensor.dtype == torch.float64
        return torch.tensor([2.0 * 6, 6.0], dtype=torch.float64)  # what the ranks summed

    _attach(task, reduce)
    task.val_nll, task.val_tokens = 12.0, 6
    assert abs(task._pooled_ppl() - torch.e**2) < 1e-9
    assert seen == [torch.device("meta")]


def test_a_resumed_stream_state_follows_the_module_to_its_device() -> None:
    # Checkpoints are read on the CPU; the carried (h, c) must reach the training device.
    task = LMTask(LSTMLM(11, embed_dim=4, hidden_dim=4), OptimConfig(), stateful=True)
    state = (torch.zeros(1, 2, 4), torch.ones(1, 2, 4))
    task.on_load_checkpoint({"stream_state": state})
    task.to(torch.device("meta"))
    task.on_train_start()
    assert [s.device.type for s in task.train_state] == ["meta", "meta"]
    assert isinstance(task.train_state, tuple)


@pytest.mark.slow
def test_load_run_puts_the_model_on_the_device_asked(trained) -> None:
    import experiments

    for run in (
        experiments.load_run(trained, device="meta"),
        experiments.load_run(trained, map_location="meta"),
    ):
        assert all(p.is_meta for p in run.model.parameters())
    on_cpu = experiments.load_run(trained)  # the default is unchanged
    assert all(p.device.type == "cpu" for p in on_cpu.model.parameters())


@pytest.mark.slow
def test_generate_makes_its_prompt_and_generator_on_the_model_device(trained, monkeypatch) -> None:
    import experiments
    import odelm.decoding

    run = experiments.load_run(trained, device="meta")
    made: list[torch.device] = []
    calls: list[dict[str, Any]] = []

    class Generator:  # torch.Generator cannot be made on meta: record where it is asked for
        def __init__(self, device: Any = "cpu") -> None:
            made.append(torch.device(device))

        def manual_seed(self, seed: int) -> Generator:
            return self

    def decode(model: Any, prompt: torch.Tensor, *args: Any, **options: Any) -> list[int]:
        calls.append({"prompt": prompt.device, **options})
        return []

    monkeypatch.setattr(torch, "Generator", Generator)
    monkeypatch.setattr(odelm.decoding, "decode_continuation", decode)
    run.generate(run.decode([1, 2]), strategy="sample", seed=1)
    assert made == [torch.device("meta")] and calls[0]["prompt"] == torch.device("meta")


def test_decoding_moves_the_prompt_to_the_model_and_refuses_a_foreign_generator() -> None:
    from odelm.decoding import DecodingError, generate

    model = BigramLM(7).to(torch.device("meta"))
    out = generate(model, torch.tensor([[1, 2]]), 3)  # a CPU prompt for a meta model
    assert out.is_meta and out.shape == (1, 5)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(DecodingError, match="generator is on cpu but the model on meta"):
        generate(model, torch.tensor([[1]]), 2, strategy="sample", generator=generator)


def test_block_truncation_errors_make_positions_on_the_tokens_device() -> None:
    from experiments.evaluation.discretize import block_truncation_errors

    seen: list[torch.device] = []

    def positions_seen(positions: torch.Tensor) -> float:
        seen.append(positions.device)
        return 0.0

    lm = SimpleNamespace(
        token_embedding=torch.nn.Embedding(5, 2, device="meta"),
        position_embedding=positions_seen,
        stack=SimpleNamespace(layers=[]),
    )
    tokens = torch.zeros(1, 3, dtype=torch.long, device="meta")
    assert block_truncation_errors(lm, SimpleNamespace(fields=[]), tokens) == []
    assert seen == [torch.device("meta")]


class _Stop(Exception):
    """Ends a run once what the test checks has been seen."""


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
@pytest.mark.slow
def test_after_fit_the_test_evaluation_and_peak_memory_use_the_training_device(
    tmp_path, tiny_config, monkeypatch
) -> None:
    # Lightning moves the module to the CPU before ``on_fit_end`` (where ``RunFiles`` tests
    # it) when fitting on a GPU; here training "ran" on meta (the strategy's root device at
    # ``on_fit_end``) so a CPU model would show the fault.
    from experiments.training import result as result_module
    from experiments.training import train as train_module
    from experiments.training.config import parse_config

    real_end, seen = result_module.RunFiles.on_fit_end, {}

    def on_fit_end(files: Any, trainer: Any, task: Any) -> None:
        meta = property(lambda self: torch.device("meta"))
        monkeypatch.setattr(type(trainer.strategy), "root_device", meta)
        try:
            real_end(files, trainer, task)
        finally:  # Lightning's teardown after an error moves the model to the CPU again
            task.to_empty(device="cpu")

    def evaluate(model: torch.nn.Module, *args: Any, **kwargs: Any) -> dict[str, Any]:
        seen["evaluate"] = next(model.parameters()).device
        return {"ppl": 1.0, "is_causal": True, "protocol": "p", "split": "test"}

    def peak_memory_mb(device: torch.device) -> float:
        seen["peak_memory"] = device
        raise _Stop

    monkeypatch.setattr(result_module.RunFiles, "on_fit_end", on_fit_end)
    monkeypatch.setattr(result_module, "evaluate", evaluate)
    monkeypatch.setattr(result_module, "peak_memory_mb", peak_memory_mb)
    config = parse_config(tiny_config(tmp_path, "run", trainer={"max_steps": 2, "val_every": 2}))
    with pytest.raises(_Stop):
        train_module.train(config)
    assert seen == {"evaluate": torch.device("meta"), "peak_memory": torch.device("meta")}


def test_peak_memory_on_cuda_is_the_allocator_peak_of_this_fit(monkeypatch) -> None:
    from experiments.training.throughput import peak_memory_mb

    calls: list[tuple[str, torch.device]] = []

    def allocated(device: torch.device) -> int:
        calls.append(("peak", device))
        return 3 * 2**20

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))
    cuda = torch.device("cuda", 0)
    assert peak_memory_mb(cuda) == 3.0
    task = LMTask(BigramLM(7), OptimConfig())
    task._device = cuda  # what Lightning's .to(cuda) records
    task.on_fit_start()
    assert calls == [("peak", cuda), ("reset", cuda)]


class _CudaRngState(torch.Tensor):
    """A generator state as torch.cuda returns it; ``.to(cuda)`` (for NCCL) is recorded."""

    moved_to: ClassVar[list[Any]] = []

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        _CudaRngState.moved_to.append(args[0])
        return self.as_subclass(torch.Tensor)


def test_exact_resume_saves_and_restores_each_ranks_cuda_generator(monkeypatch) -> None:
    states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
    restored: list[tuple[list[int], torch.device]] = []
    own = states[0].as_subclass(_CudaRngState)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: own)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: restored.append((s.tolist(), d)))
    cuda = torch.device("cuda", 0)

    def on_rank(rank: int, world_size: int) -> LMTask:
        task = LMTask(BigramLM(7), OptimConfig())
        task._device = cuda  # what Lightning's .to(cuda) records
        strategy = SimpleNamespace(all_gather=lambda tensor: torch.stack(states))
        trainer = SimpleNamespace(world_size=world_size, global_rank=rank, strategy=strategy)
        task.trainer = trainer  # type: ignore[assignment]
        return task

    checkpoint: dict[str, Any] = {}
    on_rank(0, 1).on_save_checkpoint(checkpoint)
    assert [s.tolist() for s in checkpoint["cuda_rng_states"]] == [[1, 2]]
    on_rank(0, 2).on_save_checkpoint(checkpoint)  # two ranks: each rank's state, in order
    assert [s.tolist() for s in checkpoint["cuda_rng_states"]] == [[1, 2], [3, 4]]
    assert _CudaRngState.moved_to == [cuda]  # gathered from the device (NCCL)
    resumed = on_rank(1, 2)
    resumed.on_load_checkpoint(checkpoint)
    resumed.on_train_start()
    assert restored == [([3, 4], cuda)]

    on_cpu: dict[str, Any] = {}  # a CPU run's checkpoint is what it always was
    LMTask(BigramLM(7), OptimConfig()).on_save_checkpoint(on_cpu)
    assert sorted(on_cpu) == ["adjoint_nfe", "rng_state", "stream_state"]
