"""Every script in examples/ runs as a user runs it (``python examples/NAME.py``, a
subprocess in another folder) at tiny size, exits 0 and prints a finite test perplexity."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = ["--max-steps", "5", "--batch-size", "4", "--bptt", "8", "--val-batches", "2"]
GRAMMAR_VOCAB = 110


def run_example(script: str, *args: str, cwd: Path) -> str:
    """Run ``examples/SCRIPT`` with ``args`` in ``cwd``; its output, after asserting exit 0."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def printed_perplexity(output: str, vocab_size: int) -> float:
    """The printed test perplexity: finite, and below twice the vocabulary after 5 steps."""
    match = re.search(r"test perplexity: (\S+)", output)
    assert match, output[-2000:]
    ppl = float(match.group(1))
    assert math.isfinite(ppl) and 1.0 < ppl < 2 * vocab_size, ppl
    return ppl


@pytest.mark.slow
def test_ode_transformer_with_a_plain_trainer(tmp_path):
    args = [*TINY, "--block", "rk4", "--layers", "1", "--d-model", "16", "--heads", "2"]
    output = run_example("ode_transformer_trainer.py", *args, cwd=tmp_path)
    printed_perplexity(output, GRAMMAR_VOCAB)
    assert re.search(r"parameters: [\d,]+", output)
    assert list(tmp_path.iterdir()) == []  # no logs or checkpoints left in the folder


@pytest.mark.slow
def test_ode_lstm_with_the_adjoint(tmp_path):
    output = run_example("ode_lstm_adjoint.py", *TINY, "--hidden", "16", cwd=tmp_path)
    printed_perplexity(output, GRAMMAR_VOCAB)
    evaluations = int(re.search(r"last test batch: (\d+) evaluations", output).group(1))
    assert evaluations >= 6  # dopri5: at least one step of six new evaluations


def tiny_gpt2_folder(path: Path) -> int:
    """A one-layer GPT-2 and a byte-level BPE tokenizer saved Hugging Face style in
    ``path``; the tokenizer's vocabulary size."""
    from tokenizers import pre_tokenizers
    from transformers import GPT2Config, GPT2Model

    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")]
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m) for m in merges]
    tokens.append("<|endoftext|>")
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    last = len(tokens) - 1
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=len(tokens))
    config.bos_token_id = config.eos_token_id = last
    GPT2Model(config).save_pretrained(path)
    return len(tokens)


@pytest.mark.slow
def test_ode_head_on_a_local_gpt2(tmp_path):
    vocab = tiny_gpt2_folder(tmp_path / "gpt2")
    work = tmp_path / "work"
    work.mkdir()
    output = run_example(
        "ode_head_on_gpt2.py", *TINY, "--gpt2-dir", str(tmp_path / "gpt2"), cwd=work
    )
    printed_perplexity(output, vocab + 1)  # the corpus tokenizer adds <unk>


@pytest.mark.slow
def test_lightning_cli_script_fits_from_a_config(tmp_path):
    config = yaml.safe_load((EXAMPLES / "lightning_cli.yaml").read_text())
    config["model"]["model"]["config"].update(d_model=16, d_ff=32, n_layers=1)
    config["data"]["config"].update(batch_size=4, bptt=8)
    config["trainer"].update(max_steps=3, val_check_interval=3, limit_val_batches=2)
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    args = ["fit", "--config", "fit.yaml", "--trainer.enable_progress_bar=false"]
    run_example("lightning_cli.py", *args, cwd=tmp_path)
    saved = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["max_steps"] == 3 and saved["data"]["config"]["bptt"] == 8
