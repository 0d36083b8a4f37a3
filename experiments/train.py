"""``train(config)``: one run from config to a tested model, resumable, with results on disk.

A run directory holds ``config.yaml``, the tokenizer, Lightning checkpoints (written
atomically), CSV and TensorBoard logs, the final weights (``model.pt``) and
``result.json`` (test perplexity, per-word perplexity, both BLEUs, NFE, throughput, peak
memory, parameters, protocol). A run whose ``result.json`` exists is finished; one with a
``last.ckpt`` resumes from it.
"""

from __future__ import annotations

import json
import os
import resource
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import yaml
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import Callback, EarlyStopping, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
from torch import nn

from experiments.config import RunConfig
from experiments.data.corpora import load_corpus
from experiments.data.tokenization import (
    LMData,
    build_tokenizer,
    check_tokenizer,
    encode_corpus,
)
from experiments.evaluate import evaluate
from experiments.models import build_model, count_parameters, depth_kind
from experiments.task import LMDataModule, LMTask
from odelm.errors import OdelmError

RESULT_FILE = "result.json"
WEIGHTS_FILE = "model.pt"


class OutputDirError(OdelmError, OSError):
    """The run directory cannot be written."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints go to a temporary file first and are renamed into place, so a crash
    mid-write never leaves a truncated checkpoint under the final name."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save(checkpoint, partial)
        os.replace(partial, path)


class CheckpointAverager(Callback):
    """Keeps the weights of the last ``n`` validations; the run ends with their average
    (the ODE Transformer paper averages its last checkpoints)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=n)

    def on_validation_end(self, trainer: pl.Trainer, task: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.snapshots.append(
                {k: v.detach().cpu().clone() for k, v in task.model.state_dict().items()}
            )

    def average(self) -> dict[str, torch.Tensor]:
        keys = self.snapshots[0].keys()
        return {
            k: torch.stack([s[k].double() for s in self.snapshots])
            .mean(0)
            .to(self.snapshots[0][k].dtype)
            for k in keys
        }

    def state_dict(self) -> dict[str, Any]:
        return {"snapshots": list(self.snapshots)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.snapshots = deque(state_dict["snapshots"], maxlen=self.n)


class ThroughputMeter(Callback):
    """Training tokens per second: logged per step and summed over the run (this process)."""

    def __init__(self) -> None:
        self.tokens, self.seconds, self._started = 0, 0.0, 0.0

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx) -> None:
        tokens = batch[0] if isinstance(batch, (tuple, list)) else batch
        seconds = time.perf_counter() - self._started
        count = tokens[:, 1:].numel() * trainer.world_size
        self.seconds += seconds
        self.tokens += count
        task.log("train/tokens_per_s", count / max(seconds, 1e-9))

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None


def prepare_data(config: RunConfig) -> LMData:
    """Load, tokenize and encode the run's corpus."""
    cfg = config.data
    corpus = load_corpus(
        cfg.corpus, cfg.data_dir, protocol=cfg.protocol, seed=cfg.seed, download=cfg.download
    )
    tokenizer = build_tokenizer(
        corpus, cfg.tokenizer, bpe_vocab_size=cfg.bpe_vocab_size, tokenizer_dir=cfg.tokenizer_dir
    )
    return encode_corpus(corpus, tokenizer)


def check_writable(folder: Path) -> None:
    """Fail before training when the run directory cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise OutputDirError(
            f"cannot write to run directory {folder} ({error.strerror}); pick another out_dir"
        ) from None


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(
    config: RunConfig,
    *,
    callbacks: list[Callback] | None = None,
    resume: bool = True,
    data: LMData | None = None,
) -> dict[str, Any]:
    """Train, select, evaluate on test, and write the run directory; returns the result."""
    run_dir = config.run_dir
    check_writable(run_dir)
    result_path = run_dir / RESULT_FILE
    if resume and result_path.is_file():
        return json.loads(result_path.read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    pl.seed_everything(config.seed, workers=True, verbose=False)
    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    data = data or prepare_data(config)
    data.tokenizer.save(run_dir / "tokenizer")
    model = build_model(config.model, data.tokenizer.vocab_size)
    task = LMTask(model, config.optim)

    trainer_cfg = config.trainer
    checkpoint_dir = run_dir / "checkpoints"
    meter = ThroughputMeter()
    best = ModelCheckpoint(
        dirpath=checkpoint_dir, filename="best", monitor="val/ppl", mode="min", save_top_k=1
    )
    periodic = ModelCheckpoint(
        dirpath=checkpoint_dir,
        filename="step{step}",
        every_n_train_steps=trainer_cfg.checkpoint_every,
        save_top_k=0,
        save_last=True,
    )
    all_callbacks: list[Callback] = [best, periodic, meter, *(callbacks or [])]
    averager = CheckpointAverager(trainer_cfg.average_last) if trainer_cfg.average_last else None
    if averager:
        all_callbacks.append(averager)
    if trainer_cfg.early_stopping_patience:
        all_callbacks.append(
            EarlyStopping(
                monitor="val/ppl", mode="min", patience=trainer_cfg.early_stopping_patience
            )
        )
    trainer = pl.Trainer(
        max_steps=trainer_cfg.max_steps,
        max_time={"seconds": trainer_cfg.max_time_s} if trainer_cfg.max_time_s else None,
        val_check_interval=trainer_cfg.val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=trainer_cfg.log_every,
        gradient_clip_val=config.optim.grad_clip,
        accelerator=trainer_cfg.accelerator,
        devices=trainer_cfg.devices,
        num_nodes=trainer_cfg.num_nodes,
        strategy=trainer_cfg.strategy,
        precision=trainer_cfg.precision,
        deterministic=trainer_cfg.deterministic,
        enable_progress_bar=trainer_cfg.progress_bar,
        enable_model_summary=False,
        use_distributed_sampler=False,
        logger=[
            CSVLogger(run_dir, name="logs", version=""),
            TensorBoardLogger(run_dir, name="tensorboard", version=""),
        ],
        callbacks=all_callbacks,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=run_dir,
    )
    datamodule = LMDataModule(data, config.data, config.seed, trainer_cfg.val_batches)
    last = checkpoint_dir / "last.ckpt"
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended.*")
        trainer.fit(
            task, datamodule=datamodule, ckpt_path=last if resume and last.is_file() else None
        )
    train_seconds = time.perf_counter() - started
    if trainer.global_rank != 0:
        return {}

    selected = "last"
    if averager and averager.snapshots:
        model.load_state_dict(averager.average())
        selected = f"average of last {len(averager.snapshots)} validations"
    elif best.best_model_path:
        model.load_state_dict(
            {
                k.removeprefix("model."): v
                for k, v in torch.load(best.best_model_path, weights_only=False)[
                    "state_dict"
                ].items()
            }
        )
        selected = "best validation"
    save_weights(model, run_dir, data)
    device = next(model.parameters()).device
    metrics = evaluate(
        model,
        data,
        "test",
        mode="sentences" if config.data.batching == "sentences" else "stream",
        window=config.data.eval_window,
        padding_side=config.data.padding_side,
        bleu_sentences=config.eval.bleu_sentences,
        continuation_sentences=config.eval.continuation_sentences,
        prompt_len=config.eval.prompt_len,
        decode=config.eval.decode,
        allow_noncausal=True,
    )
    valid_ppl = float(best.best_model_score) if best.best_model_score is not None else None
    result = {
        "name": config.name,
        "family": depth_kind(config.model, model),
        "model": describe_model(config.model),
        "parameters": count_parameters(model),
        **{
            f"test_{k}": v
            for k, v in metrics.items()
            if k not in ("protocol", "is_causal", "split")
        },
        "valid_ppl": valid_ppl,
        "is_causal": metrics["is_causal"],
        "protocol": metrics["protocol"],
        "selected": selected,
        "steps": trainer.global_step,
        "train_seconds": train_seconds,
        "train_tokens_per_s": meter.tokens_per_second,
        "peak_memory_mb": peak_memory_mb(device),
        "seed": config.seed,
    }
    tmp = result_path.with_suffix(".partial")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, result_path)
    return result


def describe_model(spec: dict[str, Any]) -> str:
    """A short label such as ``ode_transformer small block=rk2``."""
    rest = " ".join(f"{k}={v}" for k, v in spec.items() if k not in ("family", "preset", "name"))
    return " ".join(str(x) for x in (spec.get("preset") or spec.get("name", ""), rest) if x)


def save_weights(model: nn.Module, run_dir: Path, data: LMData) -> None:
    """Final weights with the tokenizer fingerprint they belong to."""
    payload = {"state_dict": model.state_dict(), "tokenizer": data.tokenizer.fingerprint()}
    tmp = run_dir / (WEIGHTS_FILE + ".partial")
    torch.save(payload, tmp)
    os.replace(tmp, run_dir / WEIGHTS_FILE)


def load_run(run_dir: str | Path) -> tuple[nn.Module, LMData, RunConfig]:
    """Rebuild a finished run's model and data, refusing a mismatched vocabulary."""
    from experiments.config import load_config

    run_dir = Path(run_dir)
    if not (run_dir / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} has no {WEIGHTS_FILE}; train it first (odelm train)")
    config = load_config(run_dir / "config.yaml")
    data = prepare_data(config)
    payload = torch.load(run_dir / WEIGHTS_FILE, weights_only=False)
    check_tokenizer(payload["tokenizer"], data.tokenizer)
    model = build_model(config.model, data.tokenizer.vocab_size)
    model.load_state_dict(payload["state_dict"])
    return model.eval(), data, config
