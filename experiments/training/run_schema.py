"""The run configuration's schema: ``RunConfig``'s typed sections (a field's type is its
range, its ``Attributes:`` line its help, its metadata how the run's identity treats it), the
checks across fields, and the named recipes. Read by the one parser,
``experiments.training.config``; ``model`` is a free mapping (``experiments.models.schema``).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jsonargparse.typing as jt
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from experiments.config_errors import ConfigError, check_range

SEED_MAX = 2**32 - 1
"""The largest seed numpy (and so Lightning's seeding of a run) accepts."""
Seed = jt.restricted_number_type("Seed", int, [(">=", 0), ("<=", SEED_MAX)])
Fraction = jt.restricted_number_type("Fraction", float, [(">=", 0), ("<", 1)])
"""A number in [0, 1): a beta, a label smoothing."""
AtLeast2 = jt.restricted_number_type("AtLeast2", int, (">=", 2))
"""An evaluation window: one token of context, one predicted."""
BpeVocab = jt.restricted_number_type("BpeVocab", int, (">=", 258))
"""A trained byte-level BPE needs its 256 byte symbols plus ``<eos>`` and ``<unk>``."""
AboveOne = jt.restricted_number_type("AboveOne", float, (">", 1))


def key_range_check(key: str, value: Any, label: str | None = None) -> None:
    """``check_range`` of a dotted run-config key (``optim.lr``); another key passes."""
    section, _, name = key.rpartition(".")
    schema = SECTIONS.get(section) if section else RunConfig
    if schema is not None:
        check_range(typing.get_type_hints(schema).get(name), value, label or key)


def check_ranges(section: Any) -> None:
    """Each field of a config dataclass checked against its type's range: the sections'
    ``__post_init__`` (a plain function, so that jsonargparse reads them as dataclasses)."""
    hints, prefix = typing.get_type_hints(type(section)), section.SECTION
    for f in dataclasses.fields(section):
        check_range(hints[f.name], getattr(section, f.name), f"{prefix}.{f.name}".lstrip("."))


@dataclass
class DataConfig:
    """Data: which corpus, tokenized how, batched how.

    Attributes:
        corpus: the corpus: grammar (generated), ptb or wikitext2
        data_dir: folder holding the corpus files (null: $ODELM_DATA_DIR, then the cache)
        protocol: full (train/valid/test) or mini (train on 90% of valid; PTB-mini, WT2-mini)
        download: fetch missing PTB / WikiText-2 files into the cache
        verify_checksums: refuse a split file whose known checksum differs
        tokenizer: word or bpe
        bpe_vocab_size: vocabulary size of a trained BPE tokenizer
        tokenizer_dir: a local GPT-2 tokenizer directory for bpe (null: train one)
        batching: stream (BPTT windows over the token stream) or sentences (padded, masked)
        batch_size: training rows per step (streams when stateful)
        bptt: tokens per training window
        padding_side: right or left padding of sentence batches
        eval_window: tokens per evaluation window
        eval_batch_size: evaluation rows (streams when stateful)
        stateful: read the train split as batch_size contiguous streams in order, carrying the
            model's state (detached) across windows; evaluation carries it over a split
        shuffle: draw the training windows of each epoch in a seeded random order (true) or read
            them in stream order (false, as pytorch/examples word_language_model does); stateful
            data is always read in order
        order: version of the seeded window order: 2 gives every (seed, epoch) its own permutation
            stream; 1 is the order of runs published before it, where seed s's epoch e+1 repeats
            seed s+1's epoch e (kept so they reproduce)
        seed: seed of the generated grammar corpus
        grammar_depth: the grammar family of that depth (1-4: relative clauses nested up to that
            deep, with number agreement at each level), its training sentences streamed (never
            repeated) and its valid and test splits fixed samples of at least 100k tokens; null: the
            embedded grammar of fixed splits
    """

    SECTION = "data"
    __post_init__ = check_ranges

    corpus: str = "grammar"
    data_dir: str | None = field(default=None, metadata={"identity": False})
    protocol: str = "full"
    download: bool = field(default=False, metadata={"identity": False})
    verify_checksums: bool = True
    tokenizer: Literal["word", "bpe"] = "word"
    bpe_vocab_size: BpeVocab = 4000
    tokenizer_dir: str | None = field(default=None, metadata={"identity": False})
    batching: Literal["stream", "sentences"] = "stream"
    batch_size: PositiveInt = 16
    bptt: PositiveInt = 35
    padding_side: Literal["left", "right"] = "right"
    eval_window: AtLeast2 = 128
    eval_batch_size: PositiveInt = 16
    stateful: bool = False
    shuffle: bool = True
    order: Literal[1, 2] = field(default=2, metadata={"neutral": 1})
    seed: Seed = 0
    grammar_depth: Literal[1, 2, 3, 4] | None = None


@dataclass
class OptimConfig:
    """Optimization: optimizer, learning-rate schedule, clipping.

    Attributes:
        optimizer: adam, adamw or sgd
        lr: learning rate (peak rate after warmup)
        betas: Adam's two betas
        momentum: SGD momentum (sgd only)
        weight_decay: L2 penalty (adam, sgd) or decoupled decay (adamw)
        schedule: constant, inverse_sqrt (after a linear warmup), cosine (linear warmup, then a
            cosine decay to 0 at the run's last step: the validation curve never moves the rate) or
            plateau (the lr is divided by anneal_factor after anneal_patience validations without a
            new best)
        warmup_steps: steps of linear warmup
        anneal_factor: plateau schedule: divide the lr by this
        anneal_patience: plateau schedule: validations without a new best before dividing
        grad_clip: clip the gradient norm at this (null: no clipping)
        label_smoothing: label smoothing of the training loss
    """

    SECTION = "optim"
    __post_init__ = check_ranges

    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    lr: NonNegativeFloat = 1e-3
    betas: list[Fraction] = field(default_factory=lambda: [0.9, 0.999])
    momentum: NonNegativeFloat = 0.0
    weight_decay: NonNegativeFloat = 0.0
    schedule: Literal["constant", "inverse_sqrt", "cosine", "plateau"] = "constant"
    warmup_steps: NonNegativeInt = 0
    anneal_factor: AboveOne = 4.0
    anneal_patience: PositiveInt = 1
    grad_clip: PositiveFloat | None = 1.0
    label_smoothing: Fraction = 0.0


@dataclass
class TrainerConfig:
    """Training loop: budget, validation, checkpoints, Lightning's hardware settings.

    Attributes:
        max_steps: optimizer steps (null: max_epochs decides; with both, the first reached)
        max_epochs: passes over the train split (null: max_steps decides)
        max_time_s: wall-clock budget in seconds (null: none)
        max_time: the wall-clock budget as HH:MM:SS or DD:HH:MM:SS (e.g. 00:05:00; null: none); it
            sets max_time_s, where the resolved config keeps it
        val_every: validate every N steps, or epoch
        val_batches: validation windows per validation (null: the whole split)
        checkpoint_every: save a resumable checkpoint every N steps
        early_stopping_patience: stop after N validations without a new best (null: never)
        average_last: average the weights of the last N validation checkpoints (0: off)
        log_every: log the training loss every N steps
        accelerator: Lightning accelerator: auto (a GPU when CUDA sees one, else the CPU), cpu or
            gpu; not part of the run's identity at auto or cpu
        devices: Lightning devices: a count or auto
        num_nodes: Lightning nodes
        strategy: Lightning strategy, e.g. ddp
        precision: Lightning precision, e.g. 32-true or bf16-mixed
        deterministic: ask torch for deterministic algorithms
        progress_bar: show Lightning's progress bar
        logger: loggers: any of csv, tensorboard, wandb (offline)
        num_threads: torch CPU threads (null: the cores other work leaves free, printed)
        compile: train through torch.compile (ode_transformer, reference, lstm, gpt2 and fixed-grid
            node-transformer models); evaluation stays eager
        matmul_precision: float32 matrix products and cuDNN: highest (true fp32), high or medium
            (TF32 on CUDA; torch.set_float32_matmul_precision)
    """

    SECTION = "trainer"

    max_steps: PositiveInt | None = 1000
    max_epochs: PositiveInt | None = None
    max_time_s: PositiveFloat | None = None
    max_time: str | int | None = None
    val_every: PositiveInt | Literal["epoch"] = 100
    val_batches: PositiveInt | None = None
    checkpoint_every: PositiveInt = 100
    early_stopping_patience: PositiveInt | None = None
    average_last: NonNegativeInt = 0
    log_every: PositiveInt = 10
    accelerator: str = field(default="auto", metadata={"hashed_as": {"auto": "cpu"}})
    devices: int | str = 1
    num_nodes: PositiveInt = 1
    strategy: str = "auto"
    precision: str = "32-true"
    deterministic: bool = True
    progress_bar: bool = field(default=True, metadata={"identity": False})
    logger: list[str] = field(
        default_factory=lambda: ["csv", "tensorboard"], metadata={"identity": False}
    )
    num_threads: PositiveInt | None = field(default=None, metadata={"identity": False})
    compile: bool = False
    matmul_precision: Literal["highest", "high", "medium"] = "highest"

    def __post_init__(self) -> None:
        """``max_time`` (HH:MM:SS) read into ``max_time_s``, where the config keeps it."""
        if self.max_time is not None:
            seconds = max_time_seconds(self.max_time)
            if self.max_time_s is not None and float(self.max_time_s) != seconds:
                raise ConfigError(
                    f"trainer.max_time = {self.max_time!r} ({seconds:g} s) and "
                    f"trainer.max_time_s = {self.max_time_s!r} disagree; give one of them"
                )
            self.max_time_s, self.max_time = seconds, None
        for name in self.logger:
            if name not in LOGGERS:
                raise ConfigError(f"trainer.logger {name!r} is not one of {', '.join(LOGGERS)}")
        check_ranges(self)


LOGGERS = ("csv", "tensorboard", "wandb")
"""The loggers ``trainer.logger`` may name (built by ``experiments.training.loggers``)."""

_HMS = re.compile(r"(?:(\d+):)?(\d+):(\d+):(\d+)")


def max_time_seconds(value: Any) -> float:
    """A wall-clock budget (``[DD:]HH:MM:SS``, or seconds) in seconds, else a ``ConfigError``."""
    match = _HMS.fullmatch(str(value))
    if match:
        days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
        total = float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    elif isinstance(value, (int, float, datetime.timedelta)) and not isinstance(value, bool):
        total = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    else:
        raise ConfigError(
            f"trainer.max_time = {value!r} is not a time; it must be HH:MM:SS or "
            "DD:HH:MM:SS (e.g. 00:05:00) or null"
        )
    if total <= 0:
        raise ConfigError(f"trainer.max_time = {value!r} is out of range; it must be > 0 or null")
    return total


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation after training (also ``odelm eval``'s defaults).

    Attributes:
        bleu_sentences: teacher-forced BLEU over the first N test lines
        continuation_sentences: continuation BLEU decodes, so it uses fewer lines
        prompt_len: prompt tokens of continuation BLEU
        decode: decoding of continuation BLEU: greedy or beam
    """

    SECTION = "eval"
    __post_init__ = check_ranges

    bleu_sentences: NonNegativeInt = 200
    continuation_sentences: NonNegativeInt = 50
    prompt_len: PositiveInt = 3
    decode: Literal["greedy", "beam"] = "greedy"


@dataclass
class RunConfig:
    """One training run.

    Attributes:
        name: the run's name; it is written to out_dir/name (auto: the config file's name and the
            config's hash, so each changed config gets its own folder)
        recipe: a named recipe lying under this config: lstm-sgd, transformer-sgd, transformer-field
            or adam (null: none; the config's own settings win over the recipe's)
        seed: seed of initialization, batching and dropout
        out_dir: folder of run directories
        model: the model: family (ode_transformer, neuralode_lm, reference), name, and that model's
            typed keys (odelm models lists them)
    """

    SECTION = ""

    name: str = field(default="run", metadata={"identity": False})
    recipe: str | None = None
    seed: Seed = 0
    out_dir: str = field(default="runs", metadata={"identity": False})
    data: DataConfig = field(default_factory=DataConfig)
    model: dict[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        """Each field's range, then the checks across fields."""
        check_ranges(self)
        if len(self.optim.betas) != 2:
            raise ConfigError(f"optim.betas must hold two numbers, got {self.optim.betas}")
        if self.trainer.max_steps is None and self.trainer.max_epochs is None:
            raise ConfigError("set a budget: trainer.max_steps or trainer.max_epochs (or both)")
        if self.data.stateful and self.data.batching != "stream":
            raise ConfigError("data.stateful needs data.batching: stream (contiguous streams)")

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {
    k: s for k, s in typing.get_type_hints(RunConfig).items() if dataclasses.is_dataclass(s)
}
"""The config's sections that are dataclasses (``model`` is a free mapping)."""


RECIPE_DIR = Path(__file__).resolve().parents[1] / "configs" / "recipes"
"""The named recipes, ``NAME.yaml`` each (``--recipe NAME``, ``recipe: NAME``)."""
RECIPES = tuple(sorted(path.stem for path in RECIPE_DIR.glob("*.yaml")))
"""The recipes' names."""


def recipe_path(name: Any) -> Path:
    """The YAML file of a named recipe; a ``ConfigError`` lists the recipes."""
    path = RECIPE_DIR / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ConfigError(f"recipe = {name!r} is not one of {', '.join(RECIPES)}")
    return path
