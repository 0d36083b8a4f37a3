"""Lightning training for any contract model: the task (the research code), the
``LightningModule`` that ``experiments.training.trainer`` fits.

``LMTask`` holds the model, the loss, the optimizer and schedule, and what is logged each
step (loss, perplexity, NFE, gradient norm per block, tokens per second). Its data comes
from [`experiments.training.datamodule.LMDataModule`][experiments.training.datamodule.LMDataModule],
which serves BPTT windows or padded sentence batches in a seeded order that depends only on the seed
and the step, so a run resumed from a checkpoint sees exactly the batches the uninterrupted run
would have seen.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from experiments.data.batching import lm_nll
from experiments.training.allocator import keep_freed_memory
from experiments.training.compiled import CompiledModel, compiled_loss_applies
from experiments.training.config import OptimConfig
from experiments.training.datamodule import StreamWindow
from experiments.training.losses import (
    fused_loss_dtype,
    fused_training_nll,
    training_inputs,
    training_nll,
)
from experiments.training.optimizers import (
    PlateauAnnealer,
    build_optimizer,
    inverse_sqrt_lambda,
    warmup_cosine_lambda,
)
from experiments.training.progress import step_description
from neuralode_lm.solvers.monitor import loss_scaling
from odelm.contract import call_model, check_stateful, detach_state
from odelm.errors import OdelmError
from odelm.lightning import pl

Timer = pl.callbacks.Timer


class NonFiniteLossError(OdelmError, FloatingPointError):
    """The training loss became NaN or infinite."""


def trainer_timer(trainer: pl.Trainer | None) -> pl.callbacks.Timer | None:
    """The trainer's ``Timer`` callback, which counts the run's training time, if it has one."""
    callbacks = trainer.callbacks if trainer is not None else []
    return next((c for c in callbacks if isinstance(c, Timer)), None)


class LMTask(pl.LightningModule):
    """Trains a contract model with next-token cross-entropy.

    ``model`` is a model, or the ``{"architecture", "config"}`` dict of a model that
    saves itself ([`odelm.pretrained.PretrainedMixin`][odelm.pretrained.PretrainedMixin]); ``optim``
    an [`OptimConfig`][experiments.training.config.OptimConfig] or its dict. Both are saved as
    hyperparameters, so ``LMTask.load_from_checkpoint(path)`` rebuilds the task from a checkpoint
    alone (pass ``model=...`` for a model class without ``save_pretrained``).

    With ``stateful=True`` the model must support the stateful extension of the contract:
    training carries its state across the ``StreamWindow`` batches (reset at each epoch's
    first window) and validation across consecutive windows; checkpoints keep the training
    state so a resumed run continues the streams exactly.
    """

    def __init__(
        self,
        model: nn.Module | dict[str, Any],
        optim: OptimConfig | dict[str, Any],
        *,
        stateful: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(model, dict):
            from odelm.pretrained import build_from_config

            model = build_from_config(model)
        if isinstance(optim, dict):
            optim = OptimConfig(**optim)
        if stateful:
            check_stateful(model)
        hyperparameters: dict[str, Any] = {
            "optim": dataclasses.asdict(optim),
            "stateful": stateful,
        }
        if hasattr(model, "model_spec"):
            hyperparameters["model"] = model.model_spec()
        self.save_hyperparameters(hyperparameters)
        self.model, self.optim, self.stateful = model, optim, stateful
        self.compiled = CompiledModel(model) if compile else None  # training steps only
        self.val_nll = 0.0
        self.val_tokens = 0
        self._restored_rng: torch.Tensor | None = None
        self._restored_cuda_rng: list[torch.Tensor] | None = None
        self.train_state: Any = None  # the state carried to the next training window
        self._val_state: Any = None
        self.annealer: PlateauAnnealer | None = None
        self._restored_annealer: dict[str, Any] | None = None
        self.adjoint_nfe = [0, 0]  # the adjoint's backward NFE summed over steps, and steps

    def configure_callbacks(self) -> list[Any]:
        """The progress bar counts steps when the budget is in steps; a trainer without a
        ``Timer`` (a plain ``Trainer`` without ``max_time``) gets one, which counts the
        training time (``elapsed``). A trainer's own Timer is kept: Lightning would replace
        it by one returned here."""
        timer = [] if trainer_timer(self.trainer) else [Timer()]
        return [*step_description(self.trainer), *timer]

    def on_fit_start(self) -> None:
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults on each step's fresh logit-sized buffers
        elif self.device.type == "cuda":  # the run's peak, not an earlier run's in this process
            torch.cuda.reset_peak_memory_stats(self.device)

    def elapsed(self) -> float:
        """Wall-clock seconds of training so far, across resumptions: the trainer's
        ``Timer``, whose state the checkpoints keep."""
        timer = trainer_timer(self.trainer)
        return timer.time_elapsed("train") if timer is not None else 0.0

    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        return call_model(self.model, tokens, mask)

    def _stateful_forward(
        self, tokens: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, dict[str, Any], Any]:
        """Logits for ``tokens[:, :-1]`` (the last token opens the next window) and the
        detached state after them."""
        model = self._training_model()
        logits, aux = call_model(model, tokens[:, :-1], stateful=True, state=state)
        return logits, aux, detach_state(aux["state"])

    def _training_model(self) -> nn.Module | CompiledModel:
        """The compiled model in training steps when asked for, else the model."""
        return self.compiled if self.compiled is not None and self.training else self.model

    def _loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        if isinstance(batch, StreamWindow):
            tokens, mask = batch.tokens, None
            state = None if batch.starts_epoch else self.train_state
            logits, aux, self.train_state = self._stateful_forward(tokens, state)
        else:
            tokens, mask = batch if isinstance(batch, (tuple, list)) else (batch, None)
            model = self._training_model()
            if isinstance(model, CompiledModel) and compiled_loss_applies(tokens, mask):
                return model.loss(tokens, self.optim.label_smoothing)  # one graph on a GPU
            dtype = None  # a compiled model computes its logits; the eager one may fuse them
            if model is self.model:
                dtype = fused_loss_dtype(model, tokens, mask, self.optim.label_smoothing)
            if dtype is not None:  # mixed precision: the output layer and the loss as one
                loss, aux = fused_training_nll(model, tokens, dtype)
                return (loss + aux["reg"] if "reg" in aux else loss), aux
            logits, aux = call_model(model, training_inputs(model, tokens, mask), mask)
        loss = training_nll(logits, tokens, mask, self.optim.label_smoothing)
        if "reg" in aux:
            loss = loss + aux["reg"]
        return loss, aux

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, aux = self._loss(batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at step {self.global_step}; stopping. The last "
                "good checkpoint is kept (last.ckpt); lower optim.lr or set optim.grad_clip"
            )
        # Lightning writes step logs every log_every_n_steps; between them each self.log
        # only costs time, unless a progress bar shows the values.
        if self.logs_this_step() or self.trainer.progress_bar_callback is not None:
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/ppl", torch.exp(loss.detach().clamp(max=50)))
            if "nfe" in aux:
                self.log("train/nfe", float(aux["nfe"]), prog_bar=True)
        return loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's backward; under a loss scaler (``16-mixed``) an adjoint's scaled
        gradient that overflows skips the step instead of stopping the run
        (``neuralode_lm.solvers.monitor.loss_scaling``)."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        with loss_scaling(scaler is not None):
            super().backward(loss, *args, **kwargs)

    def logs_this_step(self) -> bool:
        """Whether Lightning writes the step logs of the current training step."""
        return (self.global_step + 1) % self.trainer.log_every_n_steps == 0

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        stats = getattr(self.model, "solver_stats", None)
        if stats is not None and getattr(stats, "adjoint", "direct") != "direct":
            self.adjoint_nfe = [self.adjoint_nfe[0] + stats.nfe_backward, self.adjoint_nfe[1] + 1]
        if not self.logs_this_step():
            return  # Lightning writes step logs only at this cadence; skip the norms
        blocks = self.model.block_modules() if hasattr(self.model, "block_modules") else []
        for index, block in enumerate(blocks):
            grads = [p.grad.detach().norm() for p in block.parameters() if p.grad is not None]
            if grads:
                self.log(f"grad_norm/block_{index}", torch.stack(grads).norm())
        # Continuous-depth models expose the latest solve's statistics; the backward NFE of
        # this step is known only now, after backward and before the optimizer step.
        if stats is not None and stats.nfe_backward:
            self.log("train/nfe_backward", float(stats.nfe_backward))

    def adjoint_record(self) -> dict[str, float]:
        """``{"train_nfe_backward": mean backward NFE per step}`` where training used the
        adjoint (its backward solve's evaluations), else ``{}``."""
        total, steps = self.adjoint_nfe
        return {"train_nfe_backward": total / steps} if steps else {}

    def on_validation_epoch_start(self) -> None:
        self.val_nll, self.val_tokens, self._val_state = 0.0, 0, None

    def validation_step(
        self, batch: tuple[torch.Tensor, torch.Tensor | None], batch_idx: int
    ) -> None:
        tokens, mask = batch
        if self.stateful:
            logits, aux, self._val_state = self._stateful_forward(tokens, self._val_state)
        else:
            logits, aux = self(tokens, mask)
        nll, count = lm_nll(logits, tokens, mask)
        self.val_nll += float(nll)
        self.val_tokens += count
        if "nfe" in aux:
            stage = "test" if self.trainer.testing else "val"
            self.log(f"{stage}/nfe", float(aux["nfe"]), batch_size=tokens.shape[0])

    # trainer.test: the validation pass over the test split, logged as test/ppl
    on_test_epoch_start, test_step = on_validation_epoch_start, validation_step

    def on_test_epoch_end(self) -> None:
        self.log("test/ppl", self._pooled_ppl())

    def _pooled_ppl(self) -> float:
        # On the module's device: NCCL all-reduces CUDA tensors only (no CPU backend).
        totals = torch.tensor(
            [self.val_nll, float(self.val_tokens)], dtype=torch.float64, device=self.device
        )
        totals = self.trainer.strategy.reduce(totals, reduce_op="sum").cpu()
        mean_nll = float(totals[0] / max(totals[1], 1.0))
        if not mean_nll < math.log(torch.finfo(torch.float64).max):  # NaN, or exp overflows
            raise NonFiniteLossError(
                f"validation loss is {mean_nll:.4g} nats per token at step {self.global_step}: "
                "training diverged (the perplexity overflows); lower optim.lr"
            )
        return math.exp(mean_nll)

    def on_validation_epoch_end(self) -> None:
        ppl = self._pooled_ppl()
        self.log("val/ppl", ppl, prog_bar=True)
        self.log("val/elapsed_s", self.elapsed())
        if self.annealer is not None and not self.trainer.sanity_checking:
            self.annealer.step(ppl)
            self.log("val/lr", self.annealer.optimizer.param_groups[0]["lr"])

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model.parameters(), self.optim)  # type: ignore[union-attr]  # a saved model builds an nn.Module
        if self.optim.schedule == "plateau":
            self.annealer = PlateauAnnealer(
                optimizer, self.optim.anneal_factor, self.optim.anneal_patience
            )
        if self.optim.schedule in ("constant", "plateau"):
            return {"optimizer": optimizer}
        if self.optim.schedule == "cosine":
            total = self.trainer.estimated_stepping_batches  # max_steps, or epochs x batches
            if not math.isfinite(total):
                raise OdelmError(
                    "optim.schedule cosine decays over the run's step budget, and this run "
                    "has none: set trainer.max_steps or trainer.max_epochs"
                )
            factor = warmup_cosine_lambda(self.optim.warmup_steps, int(total))
        else:
            factor = inverse_sqrt_lambda(self.optim.warmup_steps)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> LMTask:  # type: ignore[override]
        """Lightning's loader, always weights-only: reading a checkpoint runs no code, and a
        file that would need pickle is refused (``read_checkpoint``)."""
        from experiments.training.checkpoints import read_checkpoint

        read_checkpoint(checkpoint_path)
        kwargs["weights_only"] = True
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_state"] = torch.get_rng_state()
        if self.device.type == "cuda":  # dropout on CUDA draws from each rank's own generator
            checkpoint["cuda_rng_states"] = self._cuda_rng_states()
        checkpoint["stream_state"] = self.train_state
        checkpoint["adjoint_nfe"] = self.adjoint_nfe
        if self.annealer is not None:
            checkpoint["annealer"] = self.annealer.state_dict()

    def _cuda_rng_states(self) -> list[torch.Tensor]:
        """The CUDA generator state of each rank's device, in rank order (every rank saves
        the checkpoint's contents; rank 0 writes them)."""
        state = torch.cuda.get_rng_state(self.device)
        if self.trainer.world_size == 1:
            return [state]
        gathered = self.trainer.strategy.all_gather(state.to(self.device))  # [ranks, size]
        return [row.cpu() for row in gathered]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._restored_rng = checkpoint.get("rng_state")
        self._restored_cuda_rng = checkpoint.get("cuda_rng_states")
        self._restore_old_elapsed(checkpoint)
        self.train_state = checkpoint.get("stream_state")
        self.adjoint_nfe = checkpoint.get("adjoint_nfe", [0, 0])
        self._restored_annealer = checkpoint.get("annealer")

    def _restore_old_elapsed(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint written before the ``Timer`` kept the training time as ``elapsed_s``:
        the trainer's Timer resumes from it (Lightning restores the callbacks after this hook,
        and leaves a Timer without state in the checkpoint unchanged)."""
        timer = trainer_timer(self._trainer) if "elapsed_s" in checkpoint else None
        if timer is not None and timer.state_key not in checkpoint.get("callbacks", {}):
            timer.load_state_dict({"time_elapsed": {"train": float(checkpoint["elapsed_s"])}})

    def on_train_start(self) -> None:
        # A resumed stream state was read on the CPU; the module is on its device only now.
        self.train_state = state_to(self.train_state, self.device)
        if self._restored_rng is not None:
            torch.set_rng_state(self._restored_rng)
        states = self._restored_cuda_rng
        if self.device.type == "cuda" and states is not None and self.global_rank < len(states):
            torch.cuda.set_rng_state(states[self.global_rank], self.device)
        if self.annealer is not None and self._restored_annealer is not None:
            self.annealer.load_state_dict(self._restored_annealer)


def state_to(state: Any, device: torch.device) -> Any:
    """A carried state (a tensor, or nested tuples/lists of tensors) moved to ``device``."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return type(state)(state_to(s, device) for s in state)
