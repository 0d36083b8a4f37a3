"""What makes a run config valid beyond its types: the range of every numeric setting, checked by
``odelm train``'s parser (constrained number types) and, for Lightning's ``Trainer``
arguments, by ``experiments.training.config.check_values``. Errors are ``experiments.config_errors.ConfigError``, one line each."""

from __future__ import annotations

import dataclasses

from experiments.config_errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Interval:
    """The values a setting may take: ``low`` to ``high``, each end included or not."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        if self.high is None:
            return above
        return above and (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low}, {self.high}{right}"


SEED_MAX = 2**32 - 1
"""The largest seed numpy (and so Lightning's ``seed_everything``) accepts."""
BPE_MIN_VOCAB = 258
"""A trained byte-level BPE needs its 256 byte symbols plus ``<eos>`` and ``<unk>``."""
RANGES: dict[str, Interval] = {
    "seed": Interval(0, SEED_MAX),
    "data.seed": Interval(0, SEED_MAX),
    "data.batch_size": Interval(1),
    "data.bptt": Interval(1),
    "data.eval_batch_size": Interval(1),
    "data.eval_window": Interval(2),  # one token of context, one predicted
    "data.bpe_vocab_size": Interval(BPE_MIN_VOCAB),
    "optim.lr": Interval(0),
    "optim.betas": Interval(0, 1, high_open=True),
    "optim.weight_decay": Interval(0),
    "optim.momentum": Interval(0),
    "optim.warmup_steps": Interval(0),
    "optim.grad_clip": Interval(0, low_open=True),
    "optim.label_smoothing": Interval(0, 1, high_open=True),
    "trainer.max_steps": Interval(1),
    "trainer.max_epochs": Interval(1),
    "trainer.max_time_s": Interval(0, low_open=True),
    "trainer.val_every": Interval(1),
    "trainer.val_batches": Interval(1),
    "trainer.checkpoint_every": Interval(1),
    "trainer.early_stopping_patience": Interval(1),
    "trainer.average_last": Interval(0),
    "trainer.log_every": Interval(1),
    "trainer.num_nodes": Interval(1),
    "trainer.num_threads": Interval(1),
    "eval.bleu_sentences": Interval(0),
    "eval.continuation_sentences": Interval(0),
    "eval.prompt_len": Interval(1),
}
"""The one range of every numeric setting: the config and the command line both check it."""
NULLABLE = {
    "optim.grad_clip",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time_s",
    "trainer.val_batches",
    "trainer.early_stopping_patience",
    "trainer.num_threads",
}
"""The settings that may be unset (null): their ranges admit None too."""


def check_range(key: str, value: float | None, label: str | None = None) -> None:
    """Raise ``ConfigError`` naming ``label`` (default: ``key``) unless ``value`` lies in
    ``RANGES[key]`` (None passes: the setting is unset)."""
    if value is not None and value not in RANGES[key]:
        unset = " or null" if key in NULLABLE else ""
        raise ConfigError(
            f"{label or key} = {value!r} is out of range; it must be {RANGES[key]}{unset}"
        )
