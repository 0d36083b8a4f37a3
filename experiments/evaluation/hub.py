"""A run as a Hugging Face model folder: ``export_run`` (any run, old ones included) and
``push_run_to_hub`` (the Hub's usual layout, the run's model card as its README).

The folder holds ``config.json`` (with ``model_type``) and ``model.safetensors`` (the run's
``model/``), ``tokenizer.json`` and ``tokenizer_config.json`` (the run's tokenizer), and
``README.md`` (the run's card), so ``AutoModelForCausalLM.from_pretrained(folder)``,
``AutoTokenizer.from_pretrained(folder)`` and ``pipeline("text-generation", model=folder)``
all read the one folder. The run itself is only read, and only after its recorded files
(weights, tokenizer, config) are checked against their SHA-256 in the run's marker.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from experiments.data.hf_tokenizer import save_hf_tokenizer
from experiments.data.tokenization import load_tokenizer
from experiments.training.runfolder import verify_run_files
from odelm import files
from odelm.errors import OdelmError
from odelm.hub import MODEL_TYPES, SPECIAL_TOKEN_IDS
from odelm.pretrained import CONFIG_FILE, WEIGHTS_FILE, read_config


class ExportError(OdelmError, FileExistsError):
    """The export folder exists and is not empty, or is a file."""


def export_run(run_dir: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path:
    """Write the Hugging Face folder of a run (the module docstring) to ``folder`` (new or
    empty); a run saved before ``model_type`` (or its special token ids) existed gets them in
    the copy. A run whose recorded files changed is refused before anything is written."""
    run, out = Path(run_dir), Path(folder)
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file, not a folder; export a run into a new folder")
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty; export a run into a new folder")
    saved = read_config(run / "model")  # checks that the run has a saved model
    verify_run_files(run)  # the weights, tokenizer and config the run recorded
    files.make_dir(out, root=out)  # the folder named; no write leaves it (odelm.files)
    files.copy_file(run / "model" / WEIGHTS_FILE, out / WEIGHTS_FILE)
    model_type = MODEL_TYPES.get(saved["architecture"])
    if model_type is not None:
        saved = {"model_type": model_type, **saved}
    tokenizer = load_tokenizer(run / "tokenizer")
    saved = {**{key: tokenizer.eos_id for key in SPECIAL_TOKEN_IDS}, **saved}
    files.write_text(out / CONFIG_FILE, json.dumps(saved, indent=2) + "\n")
    limit = saved["config"].get("max_positions")
    save_hf_tokenizer(tokenizer, out, limit)
    if (run / "README.md").is_file():
        files.copy_file(run / "README.md", out / "README.md")
    return out


def push_run_to_hub(
    run_dir: str | os.PathLike[str], repo_id: str, *, private: bool = True, **options: Any
) -> str:
    """Upload a run's Hugging Face folder to the Hub repository ``repo_id`` (created if
    needed; ``options`` go to ``HfApi.upload_folder``, e.g. ``commit_message``); returns the
    commit URL. Needs a Hub token (``huggingface-cli login``)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        folder = export_run(run_dir, Path(staging) / "export")
        return str(api.upload_folder(repo_id=repo_id, folder_path=str(folder), **options))
