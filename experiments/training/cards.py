"""A finished run's Hugging Face files: ``RUN/model`` and the tokenizer files
(``save_run_model``), and ``RUN/README.md``, its model card in the Hugging Face layout.

A run folder shared with someone else should say what it is without its reader parsing
``config.yaml`` and ``result.json``: ``write_card`` writes, through ``huggingface_hub``'s
``ModelCard`` / ``ModelCardData`` / ``EvalResult`` and the package's template
(``templates/model_card.md``), YAML front matter (``library_name: odelm``, ``tags``,
``datasets``, ``metrics`` and a valid ``model-index`` with the test perplexity per token,
then per word, as the Hub reads it) followed by sections on the
model, the data protocol, the training recipe, the results (test and validation perplexity,
per token first as in the tables, per word beside it; NFE and FLOPs per token),
the software (odelm version and git commit) and the command that reproduces the run.

The card is documentation only: ``load_run`` never reads it, its checksum is not recorded
(editing the card, as one does on the Hub, leaves the run loadable), and ``--overwrite``
deletes it with the rest of the run (it is one of ``runfolder.RUN_FILES``).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from torch import nn

from experiments.data.tokenization import Tokenizer
from experiments.training.config import RunConfig
from experiments.training.runs import MODEL_DIR, result_depth
from odelm import __version__, files
from odelm.hub import set_special_tokens

CARD_FILE = "README.md"
TEMPLATE = Path(__file__).with_name("templates") / "model_card.md"
"""The card's layout: a Jinja template ``huggingface_hub`` renders (the package ships it)."""
HUB_DATASETS = {"ptb": "ptb_text_only", "wikitext2": "wikitext", "wikitext2-raw": "wikitext"}
"""The Hugging Face dataset id of each shipped corpus (others keep their corpus name)."""


def git_commit(folder: Path | None = None) -> str | None:
    """The commit of the odelm checkout (``+dirty`` when it has uncommitted changes), or
    None when odelm is not run from a git checkout (an installed wheel)."""
    folder = folder or Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(folder), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def reproduce_command(run_dir: Path) -> str:
    """The command that trains this run again from its resolved config, into a new folder
    (the run's own folder would answer that it is already finished)."""
    return f"odelm train --config {shlex.quote(str(run_dir / 'config.yaml'))} --out_dir reproduced"


def _number(value: Any, digits: int = 2) -> str:
    """A result value for the card: floats rounded, missing values as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) >= 1 else f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def card_data(config: RunConfig, result: dict[str, Any]) -> ModelCardData:
    """The card's YAML header, as ``huggingface_hub`` builds it: library, tags, data,
    metrics and a ``model-index`` with the test perplexity per token, then per word."""
    corpus = config.data.corpus
    family = config.model.get("family", "unknown")
    tags = ["odelm", "language-modeling", family, str(result_depth(result)).replace(" ", "-")]
    test = {  # the per-token perplexity of the tables first, the per-word one beside it
        "Test perplexity (per token)": result.get("test_ppl"),
        "Test perplexity (per word)": result.get("test_ppl_per_word"),
    }
    results = [
        EvalResult(
            task_type="text-generation",
            task_name="Language modeling",
            dataset_type=corpus,
            dataset_name=result["protocol"],
            dataset_split="test",
            metric_type="perplexity",
            metric_value=value,
            metric_name=name,
        )
        for name, value in test.items()
    ]
    return ModelCardData(
        library_name="odelm",
        tags=tags,
        datasets=[HUB_DATASETS.get(corpus, corpus)],
        metrics=["perplexity"],
        model_name=config.name,
        eval_results=results,
    )


def card_text(config: RunConfig, result: dict[str, Any], commit: str | None = None) -> str:
    """The Markdown of a run's card: ``huggingface_hub``'s ``ModelCard`` from the package's
    template (``TEMPLATE``) and ``card_data``."""
    optim, trainer, data = config.optim, config.trainer, config.data
    limits = {"max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs}
    limits["max_time_s"] = trainer.max_time_s
    card = ModelCard.from_template(
        card_data(config, result),
        template_path=str(TEMPLATE),
        run_name=config.name,
        depth=result_depth(result),
        architecture=result["model"],
        model_family=config.model.get("family", "unknown"),
        parameters=_number(result["parameters"]),
        is_causal=result["is_causal"],
        corpus=data.corpus,
        protocol=result["protocol"],
        tokenizer=data.tokenizer,
        batching=data.batching,
        bptt=data.bptt,
        batch_size=data.batch_size,
        recipe=result["recipe"],
        optimizer=optim.optimizer,
        lr=optim.lr,
        schedule=optim.schedule,
        steps=_number(result["steps"]),
        budget=", ".join(f"{key} {value}" for key, value in limits.items() if value is not None),
        selected=result["selected"],
        seed=result["seed"],
        precision=trainer.precision,
        matmul_precision=trainer.matmul_precision,
        train_seconds=_number(result.get("train_seconds"), 1),
        result_rows=[  # validation's perplexity (val/ppl, which selects the weights) is per token
            ("Test", _number(result.get("test_ppl")), _number(result.get("test_ppl_per_word"))),
            ("Validation (selection)", _number(result.get("valid_ppl")), _number(None)),
        ],
        nfe=_number(result.get("test_nfe")),
        flops_per_token=_number(result.get("test_flops_per_token"), 0),
        bleu_tf=_number(result.get("test_bleu_tf")),
        run_dir=repr(str(config.run_dir)),
        reproduce=reproduce_command(config.run_dir),
        config_sha256=result["config_sha256"],
        version=__version__,
        commit=commit or "unknown (not run from a git checkout)",
    )
    return str(card) + "\n"


def write_card(config: RunConfig, result: dict[str, Any]) -> Path:
    """Write the run's ``README.md`` model card and return its path."""
    path = config.run_dir / CARD_FILE
    files.write_text(path, card_text(config, result, git_commit()))
    return path


def save_run_model(model: nn.Module, run_dir: Path, tokenizer: Tokenizer) -> list[str]:
    """Write the run's final model to ``RUN/model``, tagged with its tokenizer's fingerprint,
    and the tokenizer's Hugging Face files (``tokenizer.json``, ``tokenizer_config.json``) in
    ``RUN`` and ``RUN/model``: ``AutoTokenizer.from_pretrained(RUN)``, and
    ``pipeline("text-generation", model=RUN/model)`` finds its tokenizer. Returns the names
    written in ``RUN``."""
    from experiments.data.hf_tokenizer import HF_TOKENIZER_FILES, save_hf_tokenizer

    files.make_dir(run_dir / MODEL_DIR, root=run_dir)
    eos = tokenizer.eos_id  # BOS of every prompt, end of every line, padding
    set_special_tokens(model, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(  # type: ignore[operator]
        run_dir / MODEL_DIR, metadata={"tokenizer": tokenizer.fingerprint()}
    )
    limit = getattr(model, "max_positions", None)
    for folder in (run_dir, run_dir / MODEL_DIR):  # RUN/model alone is a Hugging Face folder too
        save_hf_tokenizer(tokenizer, folder, limit if isinstance(limit, int) else None, run_dir)
    return [MODEL_DIR, *HF_TOKENIZER_FILES]
