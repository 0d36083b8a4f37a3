"""Every script in examples/ runs as a user runs it after the README's install command
(``python examples/NAME.py``, a subprocess in another folder) at tiny size, exits 0 and
prints a finite test perplexity; and every package they import is one that install
(``pip install -e .``) installs.

How "after the README's install" is checked without building a venv: each script runs
through ``tests/support/readme_install.py``, which refuses every module the README's install would
not have installed (the installed distributions outside the closure of setup.cfg's
``install_requires``: test and docs extras, dev tools, optional solver backends), so an
import anywhere on the script's path, the library's lazy imports included, fails as it
would in that venv. A fresh venv per test run would download torch and some sixty other
wheels (gigabytes, a network); what this leaves out is the versions a fresh resolve picks
today, which ``.ci/run`` covers by installing the wheel in a fresh venv. The static check
below names the offending import without running anything.
"""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples"
README_INSTALL = ROOT / "tests" / "support" / "readme_install.py"
TINY = ["--max-steps", "5", "--batch-size", "4", "--bptt", "8", "--val-batches", "2"]
GRAMMAR_VOCAB = 110
PROJECT = {"odelm", "neuralode_lm", "ode_transformer", "experiments", "benchmarks", "_common"}
"""Imports the checkout itself provides (``_common`` is examples/_common.py)."""


def run_example(script: str, *args: str, cwd: Path) -> str:
    """Run ``examples/SCRIPT`` with ``args`` in ``cwd``, the README's install simulated
    (module docstring); its output, after asserting exit 0."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(README_INSTALL), str(EXAMPLES / script), *args],
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


TINY_GPT2_VOCAB = 256 + 4 + 1
"""The example's own tiny GPT-2 tokenizer: the byte alphabet, four merges, <|endoftext|>."""


@pytest.mark.slow
def test_ode_head_on_a_gpt2_it_builds_itself(tmp_path):
    output = run_example("ode_head_on_gpt2.py", *TINY, cwd=tmp_path)  # no --gpt2-dir
    assert "built a tiny untrained GPT-2" in output
    printed_perplexity(output, TINY_GPT2_VOCAB + 1)  # the corpus tokenizer adds <unk>
    assert list(tmp_path.iterdir()) == []  # the tiny GPT-2 lived in a temporary folder


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


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def install_requires() -> set[str]:
    """The distributions ``pip install -e .`` installs by name: setup.cfg's install_requires."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "setup.cfg")
    lines = [line.strip() for line in config["options"]["install_requires"].splitlines()]
    return {canonical(re.split(r"[\[<>=!~; ]", line)[0]) for line in lines if line}


def top_level_imports(path: Path) -> set[str]:
    """The top-level names ``path`` imports (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_example_import_is_an_install_requirement():
    distributions = importlib.metadata.packages_distributions()
    required = install_requires()
    assert {"torch", "lightning", "pytorch-lightning", "transformers"} <= required
    local = PROJECT | set(sys.stdlib_module_names) | {"__future__"}
    for script in sorted(EXAMPLES.glob("*.py")):
        for name in sorted(top_level_imports(script) - local):
            providers = {canonical(d) for d in distributions.get(name, [])}
            assert providers & required, (
                f"examples/{script.name} imports {name} (from {sorted(providers)}), "
                "which setup.cfg's install_requires does not name"
            )


def test_every_example_script_is_run_here():
    run = set(re.findall(r'run_example\(\s*"([^"]+)"', Path(__file__).read_text()))
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert scripts and scripts <= run, scripts - run


def test_the_readme_install_refuses_what_it_does_not_install(tmp_path):
    """The simulation itself: a module of the test extra (pytest) is refused, one of
    install_requires (yaml) and the standard library are not, in a script run as
    ``python SCRIPT`` runs it (its folder on ``sys.path``, ``__main__``)."""
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "script.py").write_text(
        "import json, sys, yaml\n"
        "from helper import VALUE\n"
        "try:\n    import pytest\nexcept ModuleNotFoundError as error:\n"
        "    print('refused', error.name, VALUE, __name__, sys.argv[1:])\n"
    )
    done = subprocess.run(
        [sys.executable, str(README_INSTALL), str(tmp_path / "script.py"), "--flag"],
        check=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == ["refused", "pytest", "7", "__main__", "['--flag']"]
