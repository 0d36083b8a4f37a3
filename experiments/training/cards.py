"""``RUN/README.md``: a finished run's model card, in the Hugging Face layout.

A run folder shared with someone else should say what it is without its reader parsing
``config.yaml`` and ``result.json``: ``write_card`` writes YAML front matter
(``library_name: odelm``, ``tags``, ``datasets``, ``metrics`` and a ``model-index`` with the
test perplexity per token, then per word, as the Hub reads it) followed by sections on the
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

import yaml

from experiments.training.config import RunConfig
from odelm import __version__, files

CARD_FILE = "README.md"
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


def front_matter(config: RunConfig, result: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML header: what the Hub indexes (library, tags, data, metrics)."""
    corpus = config.data.corpus
    family = config.model.get("family", "unknown")
    tags = ["odelm", "language-modeling", family, result["family"].replace(" ", "-")]
    metrics = [  # the per-token perplexity of the tables first, the per-word one beside it
        {
            "type": "perplexity",
            "value": result.get("test_ppl"),
            "name": "Test perplexity (per token)",
        },
        {
            "type": "perplexity",
            "value": result.get("test_ppl_per_word"),
            "name": "Test perplexity (per word)",
        },
    ]
    return {
        "library_name": "odelm",
        "tags": tags,
        "datasets": [HUB_DATASETS.get(corpus, corpus)],
        "metrics": ["perplexity"],
        "model-index": [
            {
                "name": config.name,
                "results": [
                    {
                        "task": {"type": "text-generation", "name": "Language modeling"},
                        "dataset": {"type": corpus, "name": result["protocol"], "split": "test"},
                        "metrics": metrics,
                    }
                ],
            }
        ],
    }


def card_text(config: RunConfig, result: dict[str, Any], commit: str | None = None) -> str:
    """The Markdown of a run's card (front matter, then sections)."""
    run_dir = config.run_dir
    optim, trainer = config.optim, config.trainer
    rows = [  # validation's perplexity (val/ppl, which selects the weights) is per token
        ("Test", result.get("test_ppl"), result.get("test_ppl_per_word")),
        ("Validation (selection)", result.get("valid_ppl"), None),
    ]
    results = "\n".join(f"| {name} | {_number(t)} | {_number(w)} |" for name, t, w in rows)
    limits = {"max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs}
    limits["max_time_s"] = trainer.max_time_s
    budget = ", ".join(f"{key} {value}" for key, value in limits.items() if value is not None)
    header = yaml.safe_dump(front_matter(config, result), sort_keys=False)
    return f"""---
{header}---

# {config.name}

A {result["family"]} language model trained with odelm: {result["model"]}.

## Model

| | |
|---|---|
| Architecture | {result["model"]} |
| Family | {config.model.get("family", "unknown")} ({result["family"]}) |
| Parameters | {_number(result["parameters"])} |
| Causal | {result["is_causal"]} |

## Data

| | |
|---|---|
| Corpus | {config.data.corpus} |
| Protocol | {result["protocol"]} |
| Tokenizer | {config.data.tokenizer} |
| Batching | {config.data.batching} (bptt {config.data.bptt}, batch {config.data.batch_size}) |

## Training recipe

| | |
|---|---|
| Recipe | {result["recipe"]} |
| Optimizer | {optim.optimizer}, lr {optim.lr}, schedule {optim.schedule} |
| Steps | {_number(result["steps"])} (budget: {budget}) |
| Weights | {result["selected"]} |
| Seed | {result["seed"]} |
| Precision | {trainer.precision}, float32 matmuls {trainer.matmul_precision} |
| Training time | {_number(result.get("train_seconds"), 1)} s |

## Results

| Split | Perplexity per token | Perplexity per word |
|---|---|---|
{results}

| Test cost | |
|---|---|
| NFE (function evaluations per forward) | {_number(result.get("test_nfe"))} |
| FLOPs per token (forward) | {_number(result.get("test_flops_per_token"), 0)} |
| Teacher-forced BLEU | {_number(result.get("test_bleu_tf"))} |

## Use

```python
import experiments

run = experiments.load_run({str(run_dir)!r})
run.perplexity(["some new text"], per="token")  # as in the tables; per="word" beside it
run.generate("the", 20, strategy="sample", seed=1)
```

## Reproduce

```bash
{reproduce_command(run_dir)}
```

The config is the run's resolved one (every default and override written out); the data
folder is `data.data_dir`, else `$ODELM_DATA_DIR`. The config's SHA-256 is
`{result["config_sha256"]}`.

## Software

| | |
|---|---|
| odelm | {__version__} |
| Git commit | {commit or "unknown (not run from a git checkout)"} |
"""


def write_card(config: RunConfig, result: dict[str, Any]) -> Path:
    """Write the run's ``README.md`` model card and return its path."""
    path = config.run_dir / CARD_FILE
    files.write_text(path, card_text(config, result, git_commit()))
    return path
