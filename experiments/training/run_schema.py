"""The run configuration's schema: typed sections (read by ``odelm train``'s parser,
``experiments.training.run_parser``; ``experiments.training.config.parse_config``), the
named recipes, a saved run's spelling, and the checks the parser's types cannot say.

A run config has five sections: ``data``, ``model`` (a typed union keyed by ``family`` and
``name``: each model's config dataclass, checked by ``experiments.models.schema`` when the
config is parsed), ``optim``, ``trainer`` and ``eval``, plus ``name``, ``recipe``, ``seed``
and ``out_dir``. ``model`` is kept as written and passed to ``experiments.models.build.build_model``.
The dataclasses below are the schema: jsonargparse reads their types (``1e-3`` is a float)
and their ``Attributes:`` docstrings (the help line of every ``--section.key`` option).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from experiments.config_errors import ConfigError
from experiments.models.schema import check_model
from experiments.training.config_checks import RANGES, check_range
from experiments.training.lightning_form import renamed_key
from experiments.training.yamlfiles import Replace, load_yaml, merge  # noqa: F401 (re-exported)


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
        stateful: read the train split as batch_size contiguous streams in order, carrying
            the model's state (detached) across windows; evaluation carries it over a split
        shuffle: draw the training windows of each epoch in a seeded random order (true) or
            read them in stream order (false, as pytorch/examples word_language_model
            does); stateful data is always read in order
        order: version of the seeded window order: 2 gives every (seed, epoch) its own
            permutation stream; 1 is the order of runs published before it, where seed s's
            epoch e+1 repeats seed s+1's epoch e (kept so they reproduce)
        seed: seed of the generated grammar corpus
        grammar_depth: the grammar family of that depth (1-4: relative clauses nested up
            to that deep, with number agreement at each level), its training sentences
            streamed (never repeated) and its valid and test splits fixed samples of at
            least 100k tokens; null: the embedded grammar of fixed splits
    """

    corpus: str = "grammar"
    data_dir: str | None = field(default=None, metadata={"identity": False})
    protocol: str = "full"
    download: bool = field(default=False, metadata={"identity": False})
    verify_checksums: bool = True
    tokenizer: Literal["word", "bpe"] = "word"
    bpe_vocab_size: int = 4000
    tokenizer_dir: str | None = field(default=None, metadata={"identity": False})
    batching: Literal["stream", "sentences"] = "stream"
    batch_size: int = 16
    bptt: int = 35
    padding_side: Literal["left", "right"] = "right"
    eval_window: int = 128
    eval_batch_size: int = 16
    stateful: bool = False
    shuffle: bool = True
    order: Literal[1, 2] = field(default=2, metadata={"neutral": 1})
    seed: int = 0
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
        schedule: constant, inverse_sqrt (after a linear warmup), cosine (linear warmup,
            then a cosine decay to 0 at the run's last step: the validation curve never moves
            the rate) or plateau (the lr is divided by anneal_factor after anneal_patience
            validations without a new best)
        warmup_steps: steps of linear warmup
        anneal_factor: plateau schedule: divide the lr by this
        anneal_patience: plateau schedule: validations without a new best before dividing
        grad_clip: clip the gradient norm at this (null: no clipping)
        label_smoothing: label smoothing of the training loss
    """

    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    momentum: float = 0.0
    weight_decay: float = 0.0
    schedule: Literal["constant", "inverse_sqrt", "cosine", "plateau"] = "constant"
    warmup_steps: int = 0
    anneal_factor: float = 4.0
    anneal_patience: int = 1
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0


@dataclass
class TrainerConfig:
    """Training loop: budget, validation, checkpoints, Lightning's hardware settings.

    Attributes:
        max_steps: optimizer steps (null: max_epochs decides; with both, the first reached)
        max_epochs: passes over the train split (null: max_steps decides)
        max_time_s: wall-clock budget in seconds (null: none)
        max_time: the wall-clock budget as Lightning spells it, HH:MM:SS or DD:HH:MM:SS
            (e.g. 00:05:00; null: none); it sets max_time_s, where the resolved config keeps it
        val_every: validate every N steps, or epoch
        val_batches: validation windows per validation (null: the whole split)
        checkpoint_every: save a resumable checkpoint every N steps
        early_stopping_patience: stop after N validations without a new best (null: never)
        average_last: average the weights of the last N validation checkpoints (0: off)
        log_every: log the training loss every N steps
        accelerator: Lightning accelerator: auto (a GPU when CUDA sees one, else the CPU),
            cpu or gpu; not part of the run's identity at auto or cpu
        devices: Lightning devices: a count or auto
        num_nodes: Lightning nodes
        strategy: Lightning strategy, e.g. ddp
        precision: Lightning precision, e.g. 32-true or bf16-mixed
        deterministic: ask torch for deterministic algorithms
        progress_bar: show Lightning's progress bar
        logger: loggers: any of csv, tensorboard, wandb (offline)
        num_threads: torch CPU threads (null: the cores other work leaves free, printed)
        compile: train through torch.compile (ode_transformer, reference, lstm, gpt2 and
            fixed-grid node-transformer models); evaluation stays eager
        matmul_precision: float32 matrix products and cuDNN: highest (true fp32), high or
            medium (TF32 on CUDA; torch.set_float32_matmul_precision)
    """

    max_steps: int | None = 1000
    max_epochs: int | None = None
    max_time_s: float | None = None
    max_time: str | int | None = None
    val_every: int | str = 100
    val_batches: int | None = None
    checkpoint_every: int = 100
    early_stopping_patience: int | None = None
    average_last: int = 0
    log_every: int = 10
    accelerator: str = field(default="auto", metadata={"hashed_as": {"auto": "cpu"}})
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    deterministic: bool = True
    progress_bar: bool = field(default=True, metadata={"identity": False})
    logger: list[str] = field(
        default_factory=lambda: ["csv", "tensorboard"], metadata={"identity": False}
    )
    num_threads: int | None = field(default=None, metadata={"identity": False})
    compile: bool = False
    matmul_precision: Literal["highest", "high", "medium"] = "highest"


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation after training (also ``odelm eval``'s defaults).

    Attributes:
        bleu_sentences: teacher-forced BLEU over the first N test lines
        continuation_sentences: continuation BLEU decodes, so it uses fewer lines
        prompt_len: prompt tokens of continuation BLEU
        decode: decoding of continuation BLEU: greedy or beam
    """

    bleu_sentences: int = 200
    continuation_sentences: int = 50
    prompt_len: int = 3
    decode: Literal["greedy", "beam"] = "greedy"


@dataclass
class RunConfig:
    """One training run.

    Attributes:
        name: the run's name; it is written to out_dir/name (auto: the config file's name
            and the config's hash, so each changed config gets its own folder)
        recipe: a named recipe lying under this config: lstm-sgd, transformer-sgd,
            transformer-field or adam
            (null: none; the config's own settings win over the recipe's)
        seed: seed of initialization, batching and dropout
        out_dir: folder of run directories
        model: the model: family (ode_transformer, neuralode_lm, reference), name, and
            that model's typed keys (odelm models lists them)
    """

    name: str = field(default="run", metadata={"identity": False})
    recipe: str | None = None
    seed: int = 0
    out_dir: str = field(default="runs", metadata={"identity": False})
    data: DataConfig = field(default_factory=DataConfig)
    model: dict[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {
    key: schema
    for key, schema in typing.get_type_hints(RunConfig).items()
    if dataclasses.is_dataclass(schema)
}
"""The config's sections that are dataclasses (``model`` is a free mapping)."""


RECIPE_DIR = Path(__file__).resolve().parents[1] / "configs" / "recipes"
"""The named recipes: ``NAME.yaml`` each (``odelm train --recipe NAME``, or ``recipe: NAME``
in a config or grid, lies under the config's own settings)."""


def recipe_path(name: Any) -> Path:
    """The YAML file of a named recipe; a ``ConfigError`` lists the recipes."""
    path = RECIPE_DIR / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ConfigError(f"recipe = {name!r} is not one of {', '.join(RECIPES)}")
    return path


RECIPES: dict[str, dict[str, Any]] = {
    path.stem: {k: v for k, v in load_yaml(path).items() if k != "recipe"}
    for path in sorted(RECIPE_DIR.glob("*.yaml"))
}
"""Each recipe's settings (its file's, less its ``recipe:`` label)."""


def checked_config(run: dict[str, Any]) -> RunConfig:
    """The ``RunConfig`` of a whole run-form mapping that ``odelm train``'s parser has read
    (``experiments.training.lightning_form.from_lightning`` of it), checked
    (``check_values``, the model section's keys)."""
    sections = {key: schema(**run[key]) for key, schema in SECTIONS.items()}
    config = RunConfig(**{k: v for k, v in run.items() if k not in SECTIONS}, **sections)
    check_values(config)
    check_model(config.model)
    return config


LIGHTNING_RANGED = tuple(key for key in RANGES if renamed_key(key).startswith("trainer."))
"""The ranged keys that ``odelm train`` spells as Lightning ``Trainer`` arguments: Lightning's
types carry no range (``max_steps: -1`` is its "no budget"), so ``check_values`` checks
them; every other range is a constrained type of ``odelm train``'s parser."""


def check_values(config: RunConfig) -> None:
    """The checks the parser's types cannot say: the ranges of Lightning's ``Trainer``
    arguments, the betas, the budget and combinations."""
    for key in LIGHTNING_RANGED:
        value = getattr(config.trainer, key.partition(".")[2])
        check_range(key, None if isinstance(value, str) else value)  # val_every: epoch
    for index, beta in enumerate(config.optim.betas):
        check_range("optim.betas", beta, f"optim.betas[{index}]")
    if len(config.optim.betas) != 2:
        raise ConfigError(f"optim.betas must hold two numbers, got {config.optim.betas}")
    if config.optim.anneal_factor <= 1 or config.optim.anneal_patience < 1:
        raise ConfigError(
            "optim.anneal_factor must be > 1 (the lr is divided by it) and "
            f"optim.anneal_patience >= 1, got {config.optim.anneal_factor} and "
            f"{config.optim.anneal_patience}"
        )
    trainer = config.trainer
    if trainer.max_steps is None and trainer.max_epochs is None:
        raise ConfigError("set a budget: trainer.max_steps or trainer.max_epochs (or both)")
    if config.data.stateful and config.data.batching != "stream":
        raise ConfigError("data.stateful needs data.batching: stream (contiguous streams)")
    if not config.model:
        raise ConfigError("the config has no model section; e.g. model: {family: ode_transformer}")
