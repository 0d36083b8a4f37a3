"""Every load checks what the run's record promises, and every YAML
odelm reads is bounded. Each case ends in one line naming what was wrong (the CLI prints
``odelm: error: ...`` and exits 2; the library raises its ``OdelmError``), never a traceback,
a hang, or a silently different model, tokenizer or split."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from experiments.cli.main import main
from experiments.data.checksums import RUN_MARKER, RunFilesChangedError
from experiments.data.hf_tokenizer import HFTokenizerError, hf_tokenizer
from experiments.data.tokenization import WordTokenizer
from experiments.evaluation.hub import ExportError, export_run
from experiments.evaluation.trained import DataChangedError, load_run
from experiments.safe_yaml import parse_yaml
from experiments.training.config import load_config, load_run_config, parse_config
from odelm.errors import ConfigError, OdelmError
from odelm.pretrained import CorruptModelError
from tests.support.runs import make_tiny_config

BOMB = "\n".join(
    [
        "a: &a [x, x, x, x, x, x, x, x, x]",
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)
"""A billion laughs: 9**9 values once its aliases are expanded, a few hundred bytes written."""


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step run of the tiny model on a small text corpus of its own."""
    from experiments.training.train import train

    out = tmp_path_factory.mktemp("loads")
    corpus = out / "corpus"
    corpus.mkdir()
    for split, text in {
        "train": "the cat sat\nthe dog ran\na cat ran\n" * 4,
        "valid": "the dog sat\na cat sat\n",
        "test": "the cat ran\n",
    }.items():
        (corpus / f"{split}.txt").write_text(text)
    data = {"corpus": "text", "data_dir": str(corpus), "eval_window": 8, "bptt": 4}
    trainer = {"max_steps": 2, "val_every": 2}
    values = make_tiny_config(out, data=data, trainer=trainer, eval={"bleu_sentences": 0})
    train(parse_config(values))
    return out / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("odelm: error: "), err
    assert expected in err, err
    return err


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))


# Item 3: loads check the record ------------------------------------------------------------


def test_export_refuses_weights_that_differ_from_the_record(text_run, tmp_path):
    run = _copy(text_run, tmp_path)
    _flip(run / "model" / "model.safetensors")
    with pytest.raises(RunFilesChangedError, match="does not match its recorded SHA-256"):
        export_run(run, tmp_path / "export")
    assert not (tmp_path / "export").exists()  # refused before anything was written


def test_export_onto_a_file_is_refused_before_any_work(text_run, tmp_path):
    target = tmp_path / "export"
    target.write_text("the user's notes\n")
    with pytest.raises(ExportError, match="is a file, not a folder"):
        export_run(text_run, target)
    assert target.read_text() == "the user's notes\n"


def _other_tokenizer(run: Path, tmp_path: Path) -> None:
    """Put another run's Hugging Face tokenizer (a bigger vocabulary) into ``run``."""
    from experiments.data.hf_tokenizer import save_hf_tokenizer

    other = tmp_path / "other"
    other.mkdir()
    save_hf_tokenizer(WordTokenizer(["<eos>", *(f"w{i}" for i in range(300))]), other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(other / name, run / name)


def test_hf_tokenizer_refuses_another_runs_tokenizer(text_run, tmp_path):
    run = _copy(text_run, tmp_path)
    _other_tokenizer(run, tmp_path)
    with pytest.raises(RunFilesChangedError, match="tokenizer.json does not match its recorded"):
        hf_tokenizer(run)
    (run / RUN_MARKER).write_text("{}")  # a run written before checksums: the sizes decide
    with pytest.raises(HFTokenizerError, match="has 301 tokens but its model's vocabulary has"):
        hf_tokenizer(run)


@pytest.mark.parametrize("content", [b"", b'{"model": ', b"\x00\xff binary"])
def test_hf_tokenizer_on_a_damaged_file_is_one_error(text_run, tmp_path, content):
    run = _copy(text_run, tmp_path)
    (run / RUN_MARKER).write_text("{}")
    (run / "tokenizer.json").write_bytes(content)
    with pytest.raises(HFTokenizerError, match="is not a tokenizer transformers can read"):
        hf_tokenizer(run)


def test_eval_checks_the_splits_against_the_marker_when_result_json_is_damaged(
    text_run, tmp_path, capsys
):
    run = _copy(text_run, tmp_path)
    corpus = tmp_path / "corpus"
    shutil.copytree(text_run.parent / "corpus", corpus)
    (corpus / "test.txt").write_text("the dog ran\n")  # an edited test split
    (run / "result.json").write_text("{damaged")
    _one_line(capsys, ["eval", str(run), "--data-dir", str(corpus)], "the test split of")
    record = json.loads((run / RUN_MARKER).read_text())
    record.pop("data_sha256")  # a marker written before it recorded the splits
    (run / RUN_MARKER).write_text(json.dumps(record))
    with pytest.raises(DataChangedError, match="result.json is damaged"):
        load_run(run).data(data_dir=str(corpus))


def test_a_damaged_marker_is_refused_not_skipped(text_run, tmp_path):
    run = _copy(text_run, tmp_path)
    (run / RUN_MARKER).write_text('{"files": {"model/model.safetensors"')  # cut short
    with pytest.raises(RunFilesChangedError, match="is damaged"):
        load_run(run)


def test_a_config_json_whose_model_type_differs_from_its_architecture_is_refused(
    text_run, tmp_path
):
    run = _copy(text_run, tmp_path)
    (run / RUN_MARKER).write_text("{}")
    path = run / "model" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "odelm-gpt2"}))
    with pytest.raises(CorruptModelError, match="says model_type 'odelm-gpt2' but"):
        load_run(run)
    with pytest.raises(CorruptModelError, match="says model_type"):
        export_run(run, tmp_path / "export")


@pytest.mark.parametrize(
    "text, line",
    [
        ("model: {family: reference}\noptim: {lr: 0.1}\noptim: {lr: 0.2}\n", "line 3"),
        ("model: {family: reference, family: reference}\n", "line 1 column 28"),
    ],
)
def test_a_key_given_twice_is_refused_at_its_second_place(tmp_path, text, line):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{line}.*given twice in one mapping"):
        load_config(path)


# Item 4: YAML bounded and clear ------------------------------------------------------------


def _budget_error(where: str) -> str:
    return f"{where} holds more than 200,000 values once its aliases"


def test_an_alias_bomb_is_refused_within_a_second_everywhere(tmp_path, capsys):
    config = tmp_path / "bomb.yaml"
    config.write_text(BOMB + "\nmodel: {family: reference}\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=_budget_error(str(config))):
        load_config(config)  # configs, grids and run folders' config.yaml read this way
    with pytest.raises(ConfigError, match="--model holds more than"):
        parse_yaml("{" + BOMB.replace("\n", ", ") + "}", "--model")
    assert time.perf_counter() - start < 1.0
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(BOMB)
    with pytest.raises(ConfigError, match="holds more than"):
        load_run_config(run / "config.yaml")
    err = _one_line(capsys, ["train", "--config", str(config)], _budget_error(str(config)))
    assert len(err) < 300  # never echoed


@pytest.mark.parametrize(
    "content, expected",
    [
        ("model: {family: reference}\n".encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
        ("name: caf\xe9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 9)"),
        (b"seed: " + b"9" * 5000 + b"\n", "an integer of more than 100 digits"),
        (b"model: " + b"{a: " * 5000 + b"1" + b"}" * 5000 + b"\n", "line 1"),
        (b"model: " + b"[" * 80 + b"]" * 80 + b"\n", "nests lists and mappings deeper than 64"),
    ],
    ids=["utf-16", "latin-1", "5000 digits", "5000 deep", "80 deep"],
)
def test_odd_yaml_files_are_one_error(tmp_path, content, expected):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(OdelmError) as caught:
        load_config(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_section_that_is_not_a_mapping_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model: {family: reference}\ndata: 5\n")
    _one_line(capsys, ["train", "--config", str(config)], f"{config}.data must be a mapping")


# Item 4: environment, output locations, budgets, other libraries' tracebacks ------------


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({"ODELM_DATA_DIR": "FILE"}, "ODELM_DATA_DIR="),
        ({"ODELM_DATA_DIR": "/tmp/" + "x" * 300}, "cannot be used (File name too long)"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer rank"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, "RANK=1, WORLD_SIZE=2 are set but no launcher"),
        ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1 are set but no launcher"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number"),
        ({"HF_HUB_OFFLINE": "maybe"}, "HF_HUB_OFFLINE='maybe' is neither on nor off"),
    ],
    ids=["data dir a file", "data dir too long", "slurm rank", "leftover", "local", "size", "hf"],
)
def test_an_invalid_environment_variable_is_named_in_one_line(
    tmp_path, monkeypatch, capsys, variables, expected
):
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "FILE").write_text("not a folder\n")
    for key, value in variables.items():
        monkeypatch.setenv(key, str(tmp_path / value) if value == "FILE" else value)
    _one_line(capsys, ["data", "info", "--corpus", "ptb"], expected)


def test_a_non_ascii_prompt_on_an_ascii_output_is_one_line(tmp_path, monkeypatch, capsys):
    import io
    import sys

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    argv = ["generate", str(tmp_path / "no-run"), "--prompt", "caf\xe9"]
    _one_line(capsys, argv, "--prompt holds characters the output's encoding ascii cannot")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["discretize", "RUN", "--plot", "--out", "FILE/sub"], "lies under"),
        (["bench", "gpu", "--out", "FILE"], "--out FILE is a file"),
    ],
)
def test_an_output_location_is_checked_before_any_work(tmp_path, capsys, argv, expected):
    (tmp_path / "FILE").write_text("the user's file\n")
    argv = [str(tmp_path / a) if a.startswith(("FILE", "RUN")) else a for a in argv]
    _one_line(capsys, argv, expected.replace("FILE", str(tmp_path / "FILE")))
    assert (tmp_path / "FILE").read_text() == "the user's file\n"


def test_generation_over_its_budget_is_refused_before_it_runs(text_run, capsys, monkeypatch):
    from experiments.cli import eval_generate

    argv = ["generate", str(text_run), "--prompt", "the", "--strategy", "beam"]
    argv += ["--num-beams", "64", "--max-new-tokens", "10000"]
    err = _one_line(capsys, argv, "token positions, over odelm generate's budget of 20,000,000")
    assert "64 beam(s) reads 159,678,464 token positions" in err  # the window slides past 256
    monkeypatch.setitem(eval_generate.GENERATE_FLOP_BUDGET, "cpu", 1e6)  # as if the model were big
    argv = ["generate", str(text_run), "--prompt", "the", "--max-new-tokens", "100"]
    _one_line(capsys, argv, "forward FLOPs (101 token positions x 2 x")


def test_long_generation_shows_progress(text_run, capsys):
    argv = ["generate", str(text_run), "--prompt", "the", "--max-new-tokens", "300"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "[generate] 300/300 tokens" in err


def test_discretize_steps_over_the_budget_are_refused_before_loading(tmp_path):
    from experiments.evaluation.discretize import DiscretizeError, discretize

    with pytest.raises(DiscretizeError, match="over the budget of 1000 steps per solve"):
        discretize(tmp_path / "no-run", steps=[10**9])
    with pytest.raises(DiscretizeError, match="field evaluations per token"):
        discretize(tmp_path / "no-run", steps=[1000, 1000, 1000])


def test_the_harness_turns_bad_paths_and_tasks_into_one_line(tmp_path):
    from odelm.harness import HarnessError, _one_line, check_model_args

    (tmp_path / "file").write_text("x")
    with pytest.raises(HarnessError, match="is a file; give the folder of a saved model"):
        check_model_args(["--model_args", f"pretrained={tmp_path / 'file'}"])
    with pytest.raises(HarnessError, match="no such folder"):
        check_model_args([f"--model_args=pretrained={tmp_path / 'none'},dtype=float32"])
    check_model_args(["--model_args", f"pretrained={tmp_path},tokenizer=owner/name"])
    assert "ls tasks" in str(_one_line(ValueError("Tasks not found: nosuchtask")))
    repo = OSError(
        f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{tmp_path}'."
    )
    assert (
        _one_line(repo)
        == f"{tmp_path} is neither a folder of a saved model nor a Hub id (owner/name)"
    )
    assert _one_line(ValueError("anything else")) is None  # a bug keeps its traceback


# Item 5: errors name the key as the user wrote it ----------------------------------------


@pytest.mark.parametrize(
    "section, expected",
    [
        ({"trainer": {"val_every": -5}}, "trainer.val_every = -5 is out of range"),
        ({"trainer": {"num_threads": 0}}, "trainer.num_threads = 0 is out of range"),
        ({"seed": -1}, "seed = -1 is out of range"),
        (
            {"trainer": {"checkpoint_every": "x"}},
            "trainer.checkpoint_every must be int >=1, got 'x'",
        ),
        ({"trainer": {"val_batches": "x"}}, "trainer.val_batches must be int >=1 or null, got 'x'"),
        ({"optim": {"lr": "x"}}, "optim.lr must be float >=0, got 'x'"),
        (
            {"trainer": {"val_check_interval": 5}},
            (
                ": trainer.val_check_interval is the Lightning form of odelm train, which is "
                "gone; write trainer.val_every (the run form)"
            ),
        ),
        ({"run": {"num_threads": 1}}, ": run is the Lightning form of odelm train, which is gone"),
        ({"seed_everything": 1}, ": seed_everything is the Lightning form of odelm train"),
        ({"model": {"class_path": "x"}}, ": model.class_path is the Lightning form of odelm train"),
    ],
    ids=[
        *("val_every", "num_threads", "seed", "checkpoint_every", "val_batches", "lr"),
        *("lightning", "run", "seed_everything", "class_path"),
    ],
)
def test_a_config_files_error_names_the_key_as_written(tmp_path, capsys, section, expected):
    import yaml

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model": {"family": "reference"}, **section}))
    _one_line(capsys, ["train", "--config", str(config), "--print_config"], expected)
