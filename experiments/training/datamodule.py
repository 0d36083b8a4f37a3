"""The data side of training: a Lightning data module over one corpus's train, validation
and test batches, and the seeded, resumable order it reads the training batches in.

``LMDataModule.from_corpus(name, ...)`` builds everything from a corpus name (load,
tokenize, encode: what ``odelm train`` does); ``LMDataModule(data, config)`` takes data
already encoded. Stateful batching yields ``StreamWindow`` batches whose model state
carries across windows ([`experiments.training.task.LMTask`][experiments.training.task.LMTask]
handles it).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from experiments.config_errors import ConfigError
from experiments.data.batching import (
    evaluation_windows,
    sentence_batches,
    stateful_evaluation_windows,
    stream_windows,
)
from experiments.data.corpora import Corpus, load_corpus
from experiments.data.grammar_family import STREAM_EPOCH
from experiments.data.registry import CorpusError
from experiments.data.tokenization import (
    EncodedStream,
    LMData,
    Tokenizer,
    build_tokenizer,
    encode_corpus,
)
from experiments.training.config import DataConfig, EvalConfig, RunConfig
from experiments.training.run_schema import key_range_check
from odelm.errors import OdelmError
from odelm.lightning import pl


class StatefulDistributedError(OdelmError, ValueError):
    """Stateful batching was asked of a distributed run."""


class TooFewBatchesError(OdelmError, ValueError):
    """An evaluation split has fewer batches than a distributed run has processes."""


class StreamWindow(NamedTuple):
    """A training window of ``batch_size`` contiguous streams, read in order (stateful)."""

    tokens: torch.Tensor
    starts_epoch: bool  # the first window of the streams: the carried state starts fresh


DATA_ORDERS = (1, 2)
"""Versions of the training-window order (``data.order``): 1 seeds epoch ``e`` of seed ``s``
with ``s + e`` (so seed ``s``'s epoch ``e + 1`` is seed ``s + 1``'s epoch ``e``: the order of
every run published before version 2); 2 draws each (seed, epoch) permutation from its own
stream, ``numpy.random.SeedSequence([s, e])``, so no two seeds share an epoch's order."""


def epoch_generator(seed: int, epoch: int, order: int = 2) -> torch.Generator:
    """The generator of one epoch's window permutation under data order version ``order``."""
    if order == 1:
        return torch.Generator().manual_seed(seed + epoch)
    if order != 2:
        raise ValueError(f"data order version must be one of {DATA_ORDERS}, got {order}")
    state = np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0]))


class SeededResumableSampler(Sampler[int]):
    """Seeded epoch permutations read from a given step on, one epoch's worth per iteration.

    Batch ``k`` of the run is ``permutation(epoch = k // n)[k % n]``, a pure function of the
    seed, the order version (``DATA_ORDERS``) and ``k``, so resuming at step ``k`` needs
    nothing but ``k``; with
    ``shuffle=False`` it is batch ``k % n`` (the stateful order), with ``stream=True`` batch
    ``k`` itself (a streamed corpus draws batch ``k`` from its own seeded stream). ``start`` is the step
    (or a function returning it, read when an iteration begins): each iteration yields the
    next ``len(self)`` batches, so every Lightning epoch, and the validation at its end
    under a default ``pl.Trainer``, continues the same sequence. Each rank of a distributed
    run takes every ``world_size``-th batch.
    """

    def __init__(
        self,
        size: int,
        seed: int,
        start: int | Callable[[], int] = 0,
        rank: int = 0,
        world_size: int = 1,
        *,
        shuffle: bool = True,
        order: int = 2,
        stream: bool = False,
    ) -> None:
        self.size, self.seed, self.start = size, seed, start
        self.rank, self.world_size, self.shuffle, self.order = rank, world_size, shuffle, order
        self.stream = stream

    def _index(self, global_batch: int) -> int:
        epoch, position = divmod(global_batch, self.size)
        if self.stream:
            return global_batch
        if not self.shuffle:
            return position
        generator = epoch_generator(self.seed, epoch, self.order)
        return int(torch.randperm(self.size, generator=generator)[position])

    def __iter__(self) -> Iterator[int]:
        first = self.start() if callable(self.start) else self.start
        for step in range(first, first + len(self)):
            yield self._index(step * self.world_size + self.rank)

    def __len__(self) -> int:
        return max(1, self.size // self.world_size)


class StreamedBatches:
    """The training batches of a streamed corpus: item ``k`` is batch ``k`` of the run seed
    (``EncodedStream.batch``), never read twice; a nominal epoch is ``STREAM_EPOCH``."""

    def __init__(self, stream: EncodedStream, seed: int, config: DataConfig) -> None:
        self.stream, self.seed, self.config = stream, seed, config

    def __len__(self) -> int:
        return STREAM_EPOCH

    def __getitem__(self, index: int) -> Any:
        cfg = self.config
        sentences = cfg.batching == "sentences"
        return self.stream.batch(self.seed, index, cfg.batch_size, cfg.bptt, sentences=sentences)


def config_corpus(config: DataConfig, **overrides: Any) -> Corpus:
    """The corpus a data section names, loaded as ``odelm train`` loads it; ``overrides``
    replace ``load_corpus`` settings (``data_dir`` for a corpus moved since training)."""
    settings = {
        "data_dir": config.data_dir,
        "protocol": config.protocol,
        "seed": config.seed,
        "download": config.download,
        "verify_checksums": config.verify_checksums,
        "grammar_depth": config.grammar_depth,
    }
    return load_corpus(config.corpus, **(settings | overrides))


def load_data(config: DataConfig) -> LMData:
    """Load, tokenize and encode a data section's corpus (what ``odelm train`` does):
    ``config_corpus`` -> ``build_tokenizer`` -> ``encode_corpus``."""
    corpus = config_corpus(config)
    tokenizer = build_tokenizer(
        corpus,
        config.tokenizer,
        bpe_vocab_size=config.bpe_vocab_size,
        tokenizer_dir=config.tokenizer_dir,
    )
    return encode_corpus(corpus, tokenizer)


class LMDataModule(pl.LightningDataModule):
    """Training batches in a resumable seeded order; validation and test windows in a fixed
    order. Build one from a corpus name with
    [`from_corpus`][experiments.training.datamodule.LMDataModule.from_corpus]; with ``data=None``
    the module loads ``config``'s corpus itself (what ``LightningCLI`` builds from a config)."""

    def __init__(
        self,
        data: LMData | None = None,
        config: DataConfig | None = None,
        seed: int = 0,
        val_batches: int | None = None,
    ) -> None:
        super().__init__()
        config = config if config is not None else DataConfig()
        data = data if data is not None else load_data(config)
        self.data, self.config, self.seed, self.val_batches = data, config, seed, val_batches

    @classmethod
    def from_corpus(
        cls,
        name: str,
        data_dir: str | None = None,
        protocol: str = "full",
        tokenizer: Literal["word", "bpe"] = "word",
        batch_size: int = 16,
        bptt: int = 35,
        *,
        val_batches: int | None = None,
        corpus_seed: int = 0,
        seed: int = 0,
        **options: Any,
    ) -> LMDataModule:
        """Load corpus ``name`` (grammar, ptb, wikitext2, ...), build its tokenizer, encode it.

        ``options`` are further [`DataConfig`][experiments.training.config.DataConfig] fields
        (``batching``, ``eval_window``, ``eval_batch_size``, ``download``, ...); ``corpus_seed``
        generates the grammar corpus, ``seed`` orders the training batches, ``val_batches`` caps
        validation batches. The model's vocabulary size is
        [`vocab_size`][experiments.training.datamodule.LMDataModule.vocab_size].
        """
        valid = [f.name for f in dataclasses.fields(DataConfig) if f.name != "seed"]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ConfigError(f"unknown data option(s) {unknown}; valid: {', '.join(valid)}")
        config = DataConfig(
            corpus=name,
            data_dir=data_dir,
            protocol=protocol,
            tokenizer=tokenizer,
            batch_size=batch_size,
            bptt=bptt,
            seed=corpus_seed,
            **options,
        )
        return cls(load_data(config), config, seed, val_batches)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer that encoded the data."""
        return self.data.tokenizer

    @property
    def vocab_size(self) -> int:
        """The vocabulary size a model of this data needs."""
        return self.data.tokenizer.vocab_size

    def train_batches(self) -> list[Any] | StreamedBatches:
        """One epoch of training batches (in stateful order when ``data.stateful``; drawn
        on the fly, each index its own batch, for a streamed corpus)."""
        cfg = self.config
        if self.data.stream is not None:
            if cfg.stateful:
                raise ConfigError(
                    "a streamed corpus draws every batch afresh, so there is no stream to "
                    "carry a state along: set data.stateful: false"
                )
            return StreamedBatches(self.data.stream, self.seed, cfg)
        split = self.data.split("train")
        if not split.sentences:
            hint = ""
            if "-mini (" in self.data.protocol:
                hint = (
                    "; protocol mini trains on the first 90% of the valid split's lines: give "
                    "a valid split of at least 2 lines, or use protocol full"
                )
            raise CorpusError(f"the train split of {self.data.protocol} is empty{hint}")
        if cfg.batching == "stream":
            windows = stream_windows(split.ids, cfg.batch_size, cfg.bptt)
            if cfg.stateful:
                return [StreamWindow(w, index == 0) for index, w in enumerate(windows)]
            return windows
        eos = self.data.tokenizer.eos_id
        return sentence_batches(split.sentences, cfg.batch_size, eos, side=cfg.padding_side)

    def _step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        rank = trainer.global_rank if trainer is not None else 0
        world = trainer.world_size if trainer is not None else 1
        if self.config.stateful and world > 1:
            raise StatefulDistributedError(
                "data.stateful reads each stream in order in one process; train it on one "
                "device (trainer.devices: 1, num_nodes: 1) or set data.stateful: false"
            )
        batches = self.train_batches()
        sampler = SeededResumableSampler(
            len(batches),
            self.seed,
            self._step,
            rank,
            world,
            shuffle=self.config.shuffle and not self.config.stateful,
            order=self.config.order,
            stream=isinstance(batches, StreamedBatches),
        )
        # A generator of its own: starting an epoch's iterator must not draw from torch's
        # global RNG (dropout's), or a resumed run would diverge from the uninterrupted one.
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(batches, sampler=sampler, batch_size=None, generator=generator)

    def val_dataloader(self) -> DataLoader:
        return self._evaluation_loader("valid", self.val_batches)

    def test_dataloader(self) -> DataLoader:
        return self._evaluation_loader("test", None)

    def _evaluation_loader(self, split: str, limit: int | None) -> DataLoader:
        batches = evaluation_batches(self.data, split, EvalSettings.from_config(self.config))
        if limit:
            batches = batches[:limit]
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            if len(batches) < trainer.world_size:  # Lightning refuses a rank with no batch
                what = "trainer.val_batches" if limit else f"the {split} split's batch count"
                raise TooFewBatchesError(
                    f"{what} ({len(batches)}) is below the number of processes "
                    f"({trainer.world_size}), so a rank would get no {split} batch; "
                    "raise trainer.val_batches or use fewer devices"
                )
            batches = batches[trainer.global_rank :: trainer.world_size]
        return DataLoader(batches, batch_size=None)


DATA_KEYS = ("batching", "eval_window", "eval_batch_size", "padding_side", "stateful")
"""The batching settings, named as the run config's ``data:`` section names them."""


@dataclasses.dataclass(frozen=True)
class EvalSettings(EvalConfig):
    """How a split is evaluated: the run config's ``eval:`` section (BLEU and decoding)
    plus the evaluation batching of its ``data:`` section (``DATA_KEYS``, the same names).

    Attributes:
        batching: stream (BPTT-style windows of ``eval_window`` tokens) or sentences (each
            line alone, padded on ``padding_side``), matching how the model was trained
        eval_window: tokens per evaluation window (cropped to the model's positions)
        eval_batch_size: evaluation rows (contiguous streams when ``stateful``)
        padding_side: right or left padding of sentence batches (left only for models
            that take the attention mask)
        stateful: carry a stateful model's state across the windows of each stream
    """

    batching: Literal["stream", "sentences"] = "stream"
    eval_window: int = 128
    eval_batch_size: int = 16
    padding_side: Literal["left", "right"] = "right"
    stateful: bool = False

    @classmethod
    def from_config(cls, config: RunConfig | DataConfig) -> EvalSettings:
        """The settings a run config gives (a ``data:`` section alone: BLEU's defaults)."""
        data = config.data if isinstance(config, RunConfig) else config
        bleu = dataclasses.asdict(config.eval) if isinstance(config, RunConfig) else {}
        return cls(**bleu, **{key: getattr(data, key) for key in DATA_KEYS})

    def with_overrides(self, *, flags: bool = False, **given: Any) -> EvalSettings:
        """These settings with those ``given`` (None keeps this one), each checked as its
        config key is; errors name the setting, or its command-line flag with ``flags``."""
        given = {key: value for key, value in given.items() if value is not None}
        types = typing.get_type_hints(EvalSettings)
        for key, value in given.items():
            label = "--" + key.replace("_", "-") if flags else key
            if key not in types:
                raise ConfigError(f"unknown evaluation setting {label}; valid: {', '.join(types)}")
            choices = typing.get_args(types[key])
            if choices and value not in choices:
                raise ConfigError(f"{label} must be one of {', '.join(choices)}, got {value!r}")
            key_range_check(f"data.{key}" if key in DATA_KEYS else f"eval.{key}", value, label)
        return dataclasses.replace(self, **given)


def evaluation_batches(
    data: LMData, split: str, settings: EvalSettings = EvalSettings()
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Batches in which every token of ``split`` is predicted exactly once.

    ``stream``: non-overlapping windows of the token stream (an ``<eos>`` before the first
    token gives it a context); with ``stateful``, consecutive windows of ``eval_batch_size``
    contiguous rows, for a model that carries its state from one to the next.
    ``sentences``: each line alone, after an ``<eos>``, padded (right by default; left only
    for models that take the attention mask).
    """
    eos, batch_size, window = data.tokenizer.eos_id, settings.eval_batch_size, settings.eval_window
    if settings.stateful:
        return stateful_evaluation_windows(data.split(split).ids, eos, batch_size, window)
    if settings.batching == "sentences":
        sentences = data.split(split).sentences
        return sentence_batches(sentences, batch_size, eos, side=settings.padding_side)
    if settings.batching != "stream":
        raise ValueError(f"unknown batching {settings.batching!r}; valid: stream, sentences")
    windows = evaluation_windows(data.split(split).ids, eos, window)
    # All windows but the last have one length: batch them, then the remainder alone.
    last_differs = windows[-1].numel() != windows[0].numel()
    groups = [windows[:-1], windows[-1:]] if last_differs else [windows]
    return [
        (torch.stack(group[i : i + batch_size]), None)
        for group in groups
        for i in range(0, len(group), batch_size)
    ]
