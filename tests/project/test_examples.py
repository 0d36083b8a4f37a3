"""Every README and ``--help`` example runs as written.

The examples run in a fresh folder holding a copy of ``experiments/configs`` (they name
``experiments/configs/example.yaml``) and a link to ``docs`` (``odelm verdicts`` reads
``docs/results``), after the README's main job has made ``runs/quick``
(``odelm compare --preset quick --out runs/quick``, at 4 steps), so ``runs/quick/runs/rk4``
exists as the examples expect. Budgets are tiny: ``odelm train`` gets ``--max-steps 4
--num-threads 1`` appended, the quick grid also ``--jobs 2`` (two runs at a time give the
results of one at a time: tests/experiments/comparison/test_launchers.py); any other grid is only resolved and
checked (``--print_config``): the seed-paper grids train 12-20 min each on PTB. Shell lines run
through bash, with ``odelm`` a function that records each call's arguments as bash expanded
them (loops, quotes); the calls then run in that order in one Python process, through the
CLI's ``main`` (one interpreter start for all of them, not one per call: each start imports
torch, Lightning and transformers).

README: the ``python`` blocks run whole; of the ``bash`` blocks, the ``odelm`` commands run
and the install steps (python3 -m venv, activate, pip install) and the test run (pytest)
are left out: they set up an environment, which this test already runs in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli.main import build_parser, subcommands
from experiments.cli.options import compare_parser
from experiments.cli.options import train_parser as cli_parser
from experiments.evaluation.trained import RunNotFoundError, load_run
from experiments.training.runfolder import COMPARISON_MARKER
from tests.support.paths import ROOT

README = (ROOT / "README.md").read_text()
SUBCOMMANDS = sorted({path.split()[0] for path in subcommands()})
"""Every subcommand of ``odelm`` (``data`` for ``data info`` and ``data download``)."""
SETUP_STEPS = ("python3 -m venv", ". .venv", "pip install", "pytest")
"""README shell steps left out: environment setup and the test run."""

ODELM = r"""
odelm() {
  local extra=()
  case "$*" in
    train*) extra=(--max-steps 4 --num-threads 1) ;;
    *"--preset quick"*) extra=(--max-steps 4 --num-threads 1 --jobs 2) ;;
    compare*) extra=(--print_config) ;;
  esac
  printf '%s\x1f' "$@" "${extra[@]}" >> "$ODELM_CALLS"
  printf '\x1e' >> "$ODELM_CALLS"
}
set -e
"""
"""``odelm`` for the examples: records each call with its tiny budget (module docstring)."""

RUNNER = """
import contextlib, io, json, sys, traceback
from experiments.cli.main import main

results = []
for argv in json.load(open(sys.argv[1])):
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            code = main(argv)
    except SystemExit as exit:
        code = exit.code or 0
    except BaseException:
        code, _ = "traceback", output.write(traceback.format_exc())
    results.append({"argv": argv, "code": code, "output": output.getvalue()[-3000:]})
json.dump(results, open(sys.argv[2], "w"))
"""
"""Runs recorded ``odelm`` calls in order in one process; each call's exit code and output."""


def help_text(command: str) -> str:
    """What ``odelm COMMAND --help`` prints."""
    if command in ("train", "compare"):
        return (cli_parser if command == "train" else compare_parser)().format_help()
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[command].format_help()


def help_examples(command: str) -> list[str]:
    return [line.strip() for line in help_text(command).splitlines() if line.startswith("  odelm ")]


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.DOTALL | re.MULTILINE)


def readme_shell() -> list[str]:
    """The README's shell blocks, their setup steps left out (module docstring)."""
    scripts = []
    for block in readme_blocks("bash"):
        steps = [step.strip() for line in block.splitlines() for step in line.split("&&")]
        kept = "\n".join(s for s in steps if s and not s.startswith(SETUP_STEPS))
        if "odelm " in kept:
            scripts.append(kept)
    return scripts


HELP_EXAMPLES = [(command, line) for command in SUBCOMMANDS for line in help_examples(command)]


def recorded_calls(folder: Path, script: str) -> list[list[str]]:
    """The ``odelm`` calls a shell example makes, as bash expands them (``ODELM``)."""
    calls = folder / "calls"
    calls.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-c", ODELM + script],
        check=False,
        cwd=folder,
        env={**os.environ, "ODELM_CALLS": str(calls)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{script}\n{done.stderr[-2000:]}"
    records = calls.read_text().split("\x1e")[:-1] if calls.exists() else []
    return [record.split("\x1f")[:-1] for record in records]


QUICK = "odelm compare --preset quick --out runs/quick"
EXAMPLES = [QUICK, *(line for _, line in HELP_EXAMPLES), *readme_shell()]
"""Every shell example, the main job first (the others use its runs)."""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """The folder the examples ran in, and each example's calls with exit code and output."""
    folder = tmp_path_factory.mktemp("examples")
    shutil.copytree(ROOT / "experiments" / "configs", folder / "experiments" / "configs")
    (folder / "docs").symlink_to(ROOT / "docs")  # read by odelm verdicts, written by nothing
    calls = {script: recorded_calls(folder, script) for script in EXAMPLES}
    (folder / "calls.json").write_text(
        json.dumps([c for script in EXAMPLES for c in calls[script]])
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, "calls.json", "results.json"],
        check=False,
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = iter(json.loads((folder / "results.json").read_text()))
    return folder, {script: [next(results) for _ in calls[script]] for script in EXAMPLES}


def assert_ran(outcomes: tuple[Path, dict[str, list[dict]]], script: str) -> None:
    """Every ``odelm`` call of ``script`` exited 0 (a failure shows the call's output)."""
    results = outcomes[1][script]
    assert results, f"{script} makes no odelm call"
    for result in results:
        assert result["code"] == 0, f"{' '.join(result['argv'])}\n{result['output']}"


def test_every_subcommand_help_has_examples():
    for command in SUBCOMMANDS:
        examples = help_examples(command)
        assert examples and all(line.startswith(f"odelm {command}") for line in examples), command


def test_the_readme_examples_are_found():
    assert len(readme_blocks("python")) == 1  # the Lightning scripts are examples/ (tested)
    first_run = [QUICK in script.splitlines() for script in readme_shell()]
    assert first_run.count(True) == 1  # the main job, in the README's first run
    assert readme_shell()[first_run.index(True)].splitlines() == [
        "odelm train --config experiments/configs/example.yaml",
        QUICK,
        "odelm eval runs/quick/runs/rk4",
    ]


def test_the_field_strength_loop_names_grids_that_exist():
    """docs/results/README.md's loop over the field-strength grids names only presets."""
    page = (ROOT / "docs" / "results" / "README.md").read_text()
    (loop,) = re.findall(r"for grid in (.*?); do", page, re.DOTALL)
    names = loop.replace("\\\n", " ").split()
    assert len(names) == 10
    missing = [n for n in names if not (ROOT / "experiments/configs/grids" / f"{n}.yaml").is_file()]
    assert not missing


def test_load_run_on_a_comparison_folder_names_its_runs(tmp_path):
    quick = tmp_path / "quick"
    quick.mkdir()
    (quick / COMPARISON_MARKER).touch()
    for name in ("rk4", "lstm"):
        (quick / "runs" / name).mkdir(parents=True)
    with pytest.raises(RunNotFoundError) as error:
        load_run(quick)
    assert str(error.value) == (
        f"{quick} is a comparison folder (odelm compare), not a run; pick one of its runs "
        f"(lstm, rk4) as {quick}/runs/NAME, e.g. {quick}/runs/lstm"
    )


@pytest.mark.slow
@pytest.mark.parametrize("command, line", HELP_EXAMPLES, ids=[line for _, line in HELP_EXAMPLES])
def test_help_example_runs(outcomes, command, line):
    assert_ran(outcomes, line)


@pytest.mark.slow
@pytest.mark.parametrize("script", readme_shell())
def test_readme_shell_example_runs(outcomes, script):
    assert_ran(outcomes, script)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(readme_blocks("python"))))
def test_readme_python_example_runs(outcomes, index):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", readme_blocks("python")[index]],
        check=False,
        cwd=outcomes[0],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
