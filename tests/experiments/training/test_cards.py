"""Model cards: every finished run writes ``RUN/README.md`` in the Hugging Face layout, its
command reproduces the run, ``load_run`` ignores the card and ``--overwrite`` removes it."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

import experiments
from experiments.cli.main import main
from experiments.training.cards import CARD_FILE, card_text, git_commit
from experiments.training.config import parse_config
from experiments.training.runfolder import RUN_FILES, clear_run
from experiments.training.train import train
from odelm import __version__
from tests.support.runs import make_tiny_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cards")
    values = make_tiny_config(out / "runs", "card-run", trainer={"max_steps": 6, "val_every": 3})
    result = train(parse_config(values))
    return out / "runs" / "card-run", result


def split_card(text: str) -> tuple[dict, str]:
    """The card's YAML front matter and its Markdown body."""
    match = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, flags=re.DOTALL)
    assert match, "the card does not start with YAML front matter"
    return yaml.safe_load(match.group(1)), match.group(2)


@pytest.mark.slow
def test_a_finished_run_has_a_hugging_face_model_card(finished):
    run_dir, result = finished
    header, body = split_card((run_dir / CARD_FILE).read_text())
    card = ModelCard.load(run_dir / CARD_FILE)  # huggingface_hub reads it
    assert [r.metric_value for r in card.data.eval_results] == [
        result["test_ppl"],
        result["test_ppl_per_word"],
    ]
    assert header["library_name"] == "odelm"
    assert {"odelm", "language-modeling", "ode_transformer", "discrete-depth"} <= set(
        header["tags"]
    )
    assert header["datasets"] == ["grammar"] and header["metrics"] == ["perplexity"]
    (entry,) = header["model-index"]
    assert entry["name"] == "card-run"
    per_token, per_word = entry["results"][0]["metrics"]  # the tables' per-token one first
    assert per_token == {
        "type": "perplexity",
        "value": result["test_ppl"],
        "name": "Test perplexity (per token)",
    }
    assert per_word["value"] == result["test_ppl_per_word"] and "per word" in per_word["name"]
    headings = re.findall(r"^## (.+)$", body, flags=re.MULTILINE)
    assert headings == [
        "Model",
        "Data",
        "Training recipe",
        "Results",
        "Use",
        "Reproduce",
        "Software",
    ]
    assert f"| Parameters | {result['parameters']:,} |" in body
    assert f"| Protocol | {result['protocol']} |" in body
    assert "| Split | Perplexity per token | Perplexity per word |" in body
    assert f"| Test | {result['test_ppl']:,.2f} | {result['test_ppl_per_word']:,.2f} |" in body
    assert f"| Validation (selection) | {result['valid_ppl']:,.2f} | – |" in body  # val/ppl
    assert f"| NFE (function evaluations per forward) | {result['test_nfe']:,.2f} |" in body
    assert f"| FLOPs per token (forward) | {result['test_flops_per_token']:,.0f} |" in body
    assert f"| odelm | {__version__} |" in body
    commit = git_commit()
    assert commit is not None and re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", commit)
    assert f"| Git commit | {commit} |" in body
    assert result["config_sha256"] in body


@pytest.mark.slow
def test_the_cards_command_reproduces_the_run(finished, tmp_path, monkeypatch, capsys):
    run_dir, result = finished
    body = (run_dir / CARD_FILE).read_text()
    (command,) = re.findall(r"```bash\n(.+)\n```", body)
    argv = shlex.split(command)
    assert argv[:4] == ["odelm", "train", "--config", str(run_dir / "config.yaml")]
    monkeypatch.chdir(tmp_path)
    assert main(argv[1:]) == 0
    again = json.loads((tmp_path / "reproduced" / "card-run" / "result.json").read_text())
    for key in ("test_ppl", "test_ppl_per_word", "valid_ppl", "parameters", "config_sha256"):
        assert again[key] == result[key], key
    assert (tmp_path / "reproduced" / "card-run" / CARD_FILE).is_file()


def test_load_run_ignores_the_card(finished, tmp_path):
    run_dir = Path(shutil.copytree(finished[0], tmp_path / "copy"))
    (run_dir / CARD_FILE).write_text("# my own notes on this run\n")  # edited, as on the Hub
    assert experiments.load_run(run_dir).perplexity(split="test") > 1
    (run_dir / CARD_FILE).unlink()
    assert experiments.load_run(run_dir).model.num_parameters() == finished[1]["parameters"]


def test_overwrite_removes_the_card_but_not_a_users_file(finished, tmp_path):
    run_dir = Path(shutil.copytree(finished[0], tmp_path / "copy"))
    (run_dir / "my-notes.md").write_text("mine")
    assert CARD_FILE in RUN_FILES
    clear_run(run_dir)
    assert not (run_dir / CARD_FILE).exists()
    assert (run_dir / "my-notes.md").read_text() == "mine"


def test_outside_a_git_checkout_the_commit_is_unknown(tmp_path):
    assert git_commit(tmp_path) is None


RESULT = {  # what finish_run records, made up
    "depth": "discrete depth",
    "model": "ode_transformer rk4, 2 layers",
    "parameters": 12345,
    "is_causal": True,
    "protocol": "grammar-v1",
    "recipe": "custom",
    "steps": 24,
    "selected": "best (step 16)",
    "seed": 3,
    "config_sha256": "ab" * 32,
    "test_ppl": 12.3456,
    "test_ppl_per_word": 15.25,
    "valid_ppl": 11.5,
    "train_seconds": 4.25,
    "test_nfe": None,
    "test_flops_per_token": 9876.0,
    "test_bleu_tf": 0.125,
}


def test_the_card_is_huggingface_hubs_model_card_with_a_valid_model_index(tmp_path):
    from huggingface_hub import EvalResult
    from huggingface_hub.repocard_data import model_index_to_eval_results

    config = parse_config(make_tiny_config(tmp_path / "runs", "card-run"))
    text = card_text(config, RESULT, "0" * 40)
    card = ModelCard(text)  # huggingface_hub parses the front matter and the model-index
    assert card.data.library_name == "odelm" and card.data.model_name == "card-run"
    assert card.data.datasets == ["grammar"] and card.data.metrics == ["perplexity"]
    common = {"task_type": "text-generation", "task_name": "Language modeling"}
    common |= {"dataset_type": "grammar", "dataset_name": "grammar-v1", "dataset_split": "test"}
    assert card.data.eval_results == [
        EvalResult(
            **common,
            metric_type="perplexity",
            metric_value=12.3456,
            metric_name="Test perplexity (per token)",
        ),
        EvalResult(
            **common,
            metric_type="perplexity",
            metric_value=15.25,
            metric_name="Test perplexity (per word)",
        ),
    ]
    header, body = split_card(text)
    name, results = model_index_to_eval_results(header["model-index"])
    assert name == "card-run" and results == card.data.eval_results
    assert "| Test | 12.35 | 15.25 |" in body and "| Validation (selection) | 11.50 | – |" in body
    assert "| NFE (function evaluations per forward) | – |" in body
    assert "| Parameters | 12,345 |" in body and "| Git commit | " + "0" * 40 + " |" in body
    assert f"run = experiments.load_run({str(config.run_dir)!r})" in body
    assert text.endswith("|\n") and CARD_FILE == "README.md"
