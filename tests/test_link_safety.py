"""Issue 49, item 1: odelm writes and deletes only inside the folders it owns, whatever
symbolic links a user (or an attacker) plants there.

The paths are taken from the code, not listed by hand: a tiny run and a tiny comparison are
made once while ``odelm.files.check_inside`` (which every write and delete of
``odelm.files`` passes through) records each path, and whatever else the folders then hold
is added. Then a link to a file or folder outside is planted at each of those paths, the run
is trained (the comparison compared) again in a fresh folder, and everything outside must be
byte for byte as it was, with nothing added. A structural test keeps every write of the
library inside ``odelm.files``, and a finished run's ``odelm train`` writes nothing at all.
"""

from __future__ import annotations

import ast
import sys
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from experiments.cli.main import main
from experiments.training.config import parse_config
from experiments.training.runfolder import COMPARISON_MARKER, LOCK_FILE, RUN_MARKER
from odelm import files

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("odelm", "experiments", "neuralode_lm", "ode_transformer", "benchmarks")
Snapshot = dict[str, bytes | str | None]


def _snapshot(folder: Path) -> Snapshot:
    """Every entry under ``folder``: a file's bytes, a link's target, ``None`` for a folder
    (links are never followed)."""
    found: Snapshot = {}
    for parent, folders, names in os.walk(folder):
        for name in folders + names:
            path = Path(parent, name)
            key = str(path.relative_to(folder))
            if path.is_symlink():
                found[key] = "-> " + os.readlink(path)
            else:
                found[key] = None if path.is_dir() else path.read_bytes()
    return found


@pytest.fixture
def recorded(monkeypatch) -> Iterator[list[tuple[Path, bool]]]:
    """Each ``(path, is a folder)`` that ``odelm.files`` checks while the test runs."""
    paths: list[tuple[Path, bool]] = []
    check = files.check_inside

    def spy(path, root, *, follow_last=False):
        paths.append((Path(os.path.abspath(path)), follow_last))
        return check(path, root, follow_last=follow_last)

    monkeypatch.setattr(files, "check_inside", spy)
    yield paths


def _written(folder: Path, paths: list[tuple[Path, bool]], skip: str | None = None):
    """The paths under ``folder`` that odelm wrote, checked or deleted (recorded, and all the
    folder now holds), as ``{relative path: is a folder}``, without the random names of a
    staging folder that is gone (nothing can be planted there in advance) or those under
    ``skip``."""
    found = {str(p.relative_to(folder)): p.is_dir() for p in folder.rglob("*")}
    for path, is_folder in paths:
        if folder in path.parents and path.parent.is_dir():
            key = str(path.relative_to(folder))
            found[key] = found.get(key, False) or is_folder or path.is_dir()
    return {k: v for k, v in found.items() if not (skip and k.startswith(skip + "/"))}


def _plant(folder: Path, names: list[str], kinds: dict[str, bool], outside: Path, model: Path):
    """A link at each of ``names`` under ``folder`` to something of the user's in ``outside``:
    a file for a file, a copy of the finished run ``model`` for a folder."""
    for index, name in enumerate(sorted(names)):
        target = outside / f"{index}-{Path(name).name}"
        if kinds[name]:
            shutil.copytree(model, target, symlinks=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"the user's file {index}\n")
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)  # the marker setup wrote
        link.symlink_to(target, target_is_directory=kinds[name])


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out, captured.err
    return captured.err.strip()


def _planted_rounds(kinds, setup, capsys, outside: Path, model: Path) -> int:
    """Plant links at every file path at once in a fresh folder and run the command
    (``setup(round)`` makes both); a link that ends the run (named in its one-line error) is
    tried again alone later, the rest go on to the next round. Then a link at each folder
    path alone, which must be refused. Nothing outside may change in any round. Returns the
    number of rounds."""
    pending = sorted(name for name, is_folder in kinds.items() if not is_folder)
    alone = [[name] for name, is_folder in sorted(kinds.items()) if is_folder]
    number = 0
    while pending or alone:
        names = pending or alone.pop()
        folder, args = setup(number)
        _plant(folder, names, kinds, outside / str(number), model)
        before = _snapshot(outside)
        code = main(args)
        err = _one_line(capsys)
        print("DEBUGR", len(names), names[:2], code, err[-150:], file=sys.__stderr__)
        after = _snapshot(outside)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"{changed} outside changed through the links at {names}: {err}"
        assert code in (0, 2), err
        if names is pending and len(pending) > 1:
            ended = [name for name in pending if code == 2 and str(folder / name) in err]
            assert code == 0 or ended, f"{err} names none of the links planted"
            alone += [[name] for name in ended]
            pending = [name for name in pending if name not in ended] if ended else []
        elif kinds[names[0]]:
            assert code == 2 and "symbolic link" in err and str(folder / names[0]) in err, err
        else:
            pending = []
        number += 1
    return number


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny finished run made with a validation, a checkpoint and metrics (each file odelm
    writes) and its config file."""
    out = tmp_path_factory.mktemp("model")
    trainer = {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "log_every": 1}
    return _train_config(out, "run", trainer), out / "run"


def _train_config(out: Path, name: str, trainer: dict) -> Path:
    from conftest import make_tiny_config

    config_file = out / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(make_tiny_config(out, name, trainer=trainer)))
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    return config_file


@pytest.mark.slow
def test_a_link_at_any_path_a_run_writes_changes_nothing_outside(
    tmp_path, recorded, capsys, finished_run
):
    config_file, model = finished_run
    trainer = {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "log_every": 1}
    made = tmp_path / "made"
    made.mkdir()
    _train_config(made, "run", trainer)
    kinds = _written(made / "run", recorded)
    for name in ("checkpoints/best.ckpt", "logs/metrics.csv", "result.json.partial", LOCK_FILE):
        assert name in kinds  # the run wrote all it writes
    values = yaml.safe_load(config_file.read_text())

    def setup(number: int) -> tuple[Path, list[str]]:
        out = tmp_path / f"try{number}"
        run = out / "run"
        run.mkdir(parents=True)
        (run / RUN_MARKER).write_text("{}")  # a folder odelm made, holding the links
        config = out / "run.yaml"
        config.write_text(yaml.safe_dump({**values, "out_dir": str(out)}))
        return run, ["train", "--config", str(config), "--quiet"]

    capsys.readouterr()
    rounds = _planted_rounds(kinds, setup, capsys, tmp_path / "outside", model)
    print("DEBUG", rounds, kinds)
    assert rounds >= 1 + sum(kinds.values())
