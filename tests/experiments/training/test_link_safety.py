"""odelm writes and deletes only inside the folders it owns, whatever
symbolic links a user (or an attacker) plants there.

The paths are taken from the code, not listed by hand: a tiny run and a tiny comparison are
made once while ``odelm.files.check_inside`` (which every write and delete of
``odelm.files`` passes through) records each path, and whatever else the folders then hold
is added. Then a link to a file or folder outside is planted at each of those paths, the run
is trained (the comparison compared, discretize and the GPU check run) again in a fresh
folder, and everything outside must be byte for byte as it was, with nothing added. A
structural test keeps every write of the library inside ``odelm.files``, and a finished
run's ``odelm train`` writes nothing at all.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml

from experiments.cli.main import main
from experiments.training.config import parse_config
from experiments.training.runfolder import COMPARISON_MARKER, LOCK_FILE, RUN_MARKER
from odelm import files
from tests.support.paths import ROOT

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


def _names_path(message: str, path: Path) -> bool:
    """``message`` names ``path`` itself (not a longer name that starts with it)."""
    return re.search(re.escape(str(path)) + r"(?![\w.-])", message) is not None


def _planted_rounds(kinds, setup, capsys, outside: Path, model: Path) -> int:
    """Plant links at every file path at once in a fresh folder and run the command
    (``setup(round)`` makes both; the command returns an exit status); a link that ends the
    run (named in its one-line error) is tried again alone later, the rest go on to the next
    round. Then a link at each folder path alone, which must be refused. Nothing outside may
    change in any round. Returns the number of rounds."""
    pending = sorted(name for name, is_folder in kinds.items() if not is_folder)
    alone = [[name] for name, is_folder in sorted(kinds.items()) if is_folder]
    number = 0
    while pending or alone:
        names = pending or alone.pop()
        folder, command = setup(number)
        _plant(folder, names, kinds, outside / str(number), model)
        before = _snapshot(outside)
        code = command()
        err = _one_line(capsys)
        after = _snapshot(outside)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"{changed} outside changed through the links at {names}: {err}"
        assert code in (0, 2), err
        if names is pending and len(pending) > 1:
            ended = [name for name in pending if code == 2 and _names_path(err, folder / name)]
            assert code == 0 or ended, f"{err} names none of the links planted"
            alone += [[name] for name in ended]
            pending = [name for name in pending if name not in ended] if ended else []
        elif kinds[names[0]]:
            assert code == 2 and "symbolic link" in err and _names_path(err, folder / names[0]), err
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
    from tests.support.runs import make_tiny_config

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

    def setup(number: int) -> tuple[Path, Callable[[], int]]:
        out = tmp_path / f"try{number}"
        run = out / "run"
        run.mkdir(parents=True)
        (run / RUN_MARKER).write_text("{}")  # a folder odelm made, holding the links
        config = out / "run.yaml"
        config.write_text(yaml.safe_dump({**values, "out_dir": str(out)}))
        return run, partial(main, ["train", "--config", str(config), "--quiet"])

    capsys.readouterr()
    rounds = _planted_rounds(kinds, setup, capsys, tmp_path / "outside", model)
    assert rounds >= 1 + sum(kinds.values())


@pytest.mark.slow
def test_overwrite_removes_links_in_a_run_never_their_targets(tmp_path, capsys, finished_run):
    config_file, model = finished_run
    run = Path(shutil.copytree(model, tmp_path / "out" / "run", symlinks=True))
    outside = tmp_path / "outside"
    outside.mkdir()
    for path in sorted(run.iterdir()):  # every name the run holds but its marker
        if path.name != RUN_MARKER:
            target = outside / path.name
            shutil.move(path, target)
            path.symlink_to(target, target_is_directory=target.is_dir())
    before = _snapshot(outside)
    values = yaml.safe_load(config_file.read_text())
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({**values, "out_dir": str(run.parent)}))
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--quiet", "--overwrite"]) == 0
    _one_line(capsys)
    assert _snapshot(outside) == before
    assert not any(path.is_symlink() for path in run.rglob("*"))
    assert (run / "result.json").is_file() and (run / "checkpoints" / "last.ckpt").is_file()


GRID = {
    "shared": {
        "seed": 0,
        "data": {"corpus": "grammar", "batch_size": 8, "bptt": 16, "eval_window": 64},
        "trainer": {"max_steps": 2, "val_every": 2, "checkpoint_every": 2, "val_batches": 1},
        "eval": {"bleu_sentences": 0},
    },
    "runs": [{"name": "bigram", "model": {"family": "reference"}}],
}


@pytest.mark.slow
def test_a_link_at_any_path_a_comparison_writes_changes_nothing_outside(tmp_path, recorded, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    made = tmp_path / "made"
    assert main(["compare", "--grid", str(grid), "--out", str(made)]) == 0
    run = next((made / "runs").iterdir())
    kinds = _written(made, recorded, skip=str(run.relative_to(made)))  # its files: see above
    for name in ("configs", f"configs/{run.name}.yaml", f"logs/{run.name}.log", "results.csv"):
        assert name in kinds
    assert kinds[f"runs/{run.name}"]

    def setup(number: int) -> tuple[Path, Callable[[], int]]:
        out = tmp_path / f"try{number}"
        out.mkdir()
        (out / COMPARISON_MARKER).write_text("{}")  # a folder odelm made, holding the links
        return out, partial(main, ["compare", "--grid", str(grid), "--out", str(out)])

    capsys.readouterr()
    rounds = _planted_rounds(kinds, setup, capsys, tmp_path / "outside", run)
    assert rounds >= 1 + sum(kinds.values())


@pytest.mark.slow
def test_a_link_at_any_path_discretize_writes_changes_nothing_outside(
    tmp_path, recorded, capsys, finished_run
):
    _, model = finished_run
    options = ["--max-batches", "1", "--steps", "1"]
    made = Path(shutil.copytree(model, tmp_path / "made" / "run", symlinks=True))
    assert main(["discretize", str(made), *options]) == 0
    kinds = _written(made / "discretize", recorded)
    kinds = {f"discretize/{name}": kind for name, kind in kinds.items()} | {"discretize": True}
    assert "discretize/discretize.md" in kinds and "discretize/discretize.png.partial" in kinds

    def setup(number: int) -> tuple[Path, Callable[[], int]]:
        run = Path(shutil.copytree(model, tmp_path / f"try{number}" / "run", symlinks=True))
        return run, partial(main, ["discretize", str(run), *options])

    capsys.readouterr()
    assert _planted_rounds(kinds, setup, capsys, tmp_path / "outside", model) == 2


def test_a_link_in_the_gpu_checks_folder_changes_nothing_outside(tmp_path, recorded, capsys):
    from benchmarks.gpu_check import run_check

    def check(out: Path) -> int:
        run_check(out, phases=["environment"])
        return 0

    check(tmp_path / "made")
    kinds = _written(tmp_path / "made", recorded)
    assert "summary.json" in kinds and "summary.json.partial" in kinds
    model = tmp_path / "model"  # the folder a link to a folder would lead to (none here)
    model.mkdir()

    def setup(number: int) -> tuple[Path, Callable[[], int]]:
        out = tmp_path / f"try{number}"
        out.mkdir()
        return out, partial(check, out)

    assert _planted_rounds(kinds, setup, capsys, tmp_path / "outside", model) == 1


# What writes or deletes a file or folder: methods (on a path, a figure, a tokenizer or a
# model), functions by their dotted name, and ``open`` in a writing mode.
WRITE_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "mkdir", "rename", "touch"}
WRITE_METHODS |= {"symlink_to", "hardlink_to", "savefig", "save_pretrained"}
WRITE_FUNCTIONS = {"os.open", "os.replace", "os.rename", "os.remove", "os.unlink", "os.mkdir"}
WRITE_FUNCTIONS |= {"os.makedirs", "os.rmdir", "os.symlink", "os.link", "os.truncate"}
WRITE_FUNCTIONS |= {f"shutil.{name}" for name in ("rmtree", "copy", "copy2", "copyfile")}
WRITE_FUNCTIONS |= {"shutil.copytree", "shutil.move", "torch.save", "save_model", "save_file"}
OWN_WRITERS = {("tokenizer", "save"), ("bpe", "save"), ("model", "save_pretrained")}
"""The library's own writers, by receiver and method (``Tokenizer.save``, ``BPETokenizer.save``,
``PretrainedMixin.save_pretrained``), which write through ``odelm.files`` themselves."""
STAGING = {"files.atomic_write", "atomic_write", "tempfile.TemporaryDirectory"}
"""What hands out a new file or folder of odelm's own (a partial file, a fresh temporary
folder): a write into it, or into what is made from it, is the helper's."""
ALLOWED = {
    "odelm/files.py": "the helper itself",
    "experiments/data/download.py:__call__": "pooch's own temporary file of a download",
    "neuralode_lm/encoders.py:save_pretrained": "GPT2Encoder.save_pretrained: transformers' "
    "writer into the folder a user names, never one odelm made",
}
"""Modules (``FILE``) or functions (``FILE:NAME``) that may call the raw primitives, and why."""


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _writing_mode(call: ast.Call, position: int) -> bool:
    modes = [k.value for k in call.keywords if k.arg == "mode"] + call.args[position:][:1]
    return any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax+") for m in modes)


def _is_write(call: ast.Call) -> bool:
    name = _dotted(call.func)
    if name == "os.open" and [_dotted(a) for a in call.args[1:]] == ["os.O_RDONLY"]:
        return False  # opened to read (or to lock)
    if name in WRITE_FUNCTIONS or (name == "open" and _writing_mode(call, 1)):
        return True
    if not isinstance(call.func, ast.Attribute):
        return False
    method, receiver = call.func.attr, _dotted(call.func.value)
    if receiver == "files" or (receiver.rsplit(".", 1)[-1], method) in OWN_WRITERS:
        return False  # odelm.files itself, or a writer that goes through it
    if method == "open":
        return _writing_mode(call, 0)
    return method in WRITE_METHODS or (method == "save" and bool(call.args))


def _staged(function: ast.AST) -> set[str]:
    """Names bound to what a ``STAGING`` helper handed out, or made from such a name."""
    staged: set[str] = set()
    for _ in range(3):  # a name made from a name made from a partial file
        for node in ast.walk(function):
            if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
                helper = _dotted(node.context_expr.func) in STAGING
                if node.optional_vars and (helper or _names(node.context_expr) & staged):
                    staged |= _names(node.optional_vars)
            elif isinstance(node, ast.Assign) and _names(node.value) & staged:
                staged |= set().union(*(_names(target) for target in node.targets))
    return staged


def _raw_writes(path: Path, base: Path = ROOT) -> list[str]:
    """Each raw write in ``path`` that is not into what a ``STAGING`` helper handed out, as
    ``FILE:LINE CALL`` (``FILE`` relative to ``base``)."""
    text = path.read_text()
    words = {name.rsplit(".", 1)[-1] for name in WRITE_FUNCTIONS | WRITE_METHODS}
    pattern = "|".join(sorted(words | {"open", "save"}))
    if not re.search(rf"\b({pattern})\(", text):
        return []  # no call of any of them: nothing to parse
    found = []
    for function in ast.walk(ast.parse(text)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if f"{path.relative_to(base)}:{function.name}" in ALLOWED:
            continue
        writes = [c for c in ast.walk(function) if isinstance(c, ast.Call) and _is_write(c)]
        staged = _staged(function) if writes else set()
        for call in writes:
            receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
            touched = set().union(*(_names(a) for a in [receiver, *call.args] if a))
            if not touched & staged:
                found.append(f"{path.relative_to(base)}:{call.lineno} {ast.unparse(call)}")
    return sorted(set(found))


def test_every_write_goes_through_odelm_files():
    """No module but ``odelm/files.py`` (and the justified ``ALLOWED``) writes, renames or
    deletes by itself: a new write cannot bypass the rule of ``odelm.files``."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) not in ALLOWED:
                found += _raw_writes(path)
    assert not found, "write through odelm.files instead:\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_write(tmp_path):
    source = tmp_path / "writes.py"
    source.write_text(
        "import os, shutil, torch\nfrom odelm import files\n"
        "def f(path, figure):\n"
        "    path.write_text('x')\n    open(path, 'a')\n    path.open(mode='w')\n"
        "    os.replace(path, path)\n    shutil.rmtree(path)\n    figure.savefig(path)\n"
        "    torch.save({}, path)\n    path.mkdir()\n"
        "    with files.atomic_write(path) as partial, partial.open('wb') as handle:\n"
        "        torch.save({}, handle)\n        other = partial\n        other.write_text('y')\n"
        "    open(path).read()\n    path.open().read()\n"
    )
    found = sorted(line.split(" ", 1)[1] for line in _raw_writes(source, tmp_path))
    assert found == [
        "figure.savefig(path)", "open(path, 'a')", "os.replace(path, path)",
        "path.mkdir()", "path.open(mode='w')", "path.write_text('x')",
        "shutil.rmtree(path)", "torch.save({}, path)",
    ]  # fmt: skip


def _stat_snapshot(folder: Path) -> dict[str, tuple[bytes | str | None, int]]:
    """``_snapshot`` with each entry's mtime (of the link itself for a link)."""
    return {
        name: (value, (folder / name).lstat().st_mtime_ns)
        for name, value in _snapshot(folder).items()
    }


def _train_writes_nothing(config_file: Path, folder: Path, capsys) -> None:
    """``odelm train`` of the finished run ``config_file`` names, with a link to a file of the
    user's at its lock, changes nothing under ``folder`` (contents, links, mtimes)."""
    run = Path(yaml.safe_load(config_file.read_text())["out_dir"]) / "run"
    outside = folder / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "notes.txt").write_text("the user's file\n")
    (run / LOCK_FILE).unlink(missing_ok=True)
    (run / LOCK_FILE).symlink_to(outside / "notes.txt")  # the PID once went through it
    before = _stat_snapshot(folder)
    assert main(["train", "--config", str(config_file), "--quiet"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert _stat_snapshot(folder) == before


def test_train_on_a_finished_run_writes_nothing(tmp_path, tiny_config, capsys):
    values = tiny_config(tmp_path / "out", "run")
    run = tmp_path / "out" / "run"
    run.mkdir(parents=True)
    (run / RUN_MARKER).write_text("{}")
    config = yaml.safe_dump(parse_config(values).to_dict(), sort_keys=False)
    (run / "config.yaml").write_text(config)  # as odelm writes it
    (run / "result.json").write_text('{"test_ppl": 12.5}')
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(values))
    _train_writes_nothing(config_file, tmp_path, capsys)


@pytest.mark.slow
def test_train_on_a_trained_run_writes_nothing(finished_run, tmp_path, capsys):
    config_file, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy / "run", symlinks=True)
    values = yaml.safe_load(config_file.read_text())
    (copy / "run.yaml").write_text(yaml.safe_dump({**values, "out_dir": str(copy)}))
    _train_writes_nothing(copy / "run.yaml", tmp_path, capsys)
