"""Progress of runs in flight: the JSON a training process keeps in its run folder,
the status line made from it, and the board that shows the lines (in place on a terminal,
periodic plain lines elsewhere)."""

from __future__ import annotations

import io
import json

import pytest

from experiments.training.config import parse_config
from experiments.training.progress import (
    PROGRESS_FILE,
    ProgressBoard,
    duration,
    eta_seconds,
    read_progress,
    status_line,
)
from experiments.training.train import train

TRAINING = {
    "phase": "training",
    "step": 120,
    "max_steps": 800,
    "max_time_s": None,
    "val_ppl": 45.2149,
    "tokens_per_s": 5432.4,
    "steps_per_s": 4.0,
    "seconds": 30.0,
}


def test_status_line_says_step_rate_eta_and_validation():
    assert status_line("[3/7] rk4 seed 0", TRAINING) == (
        "[3/7] rk4 seed 0: step 120/800 (15%), 5,432 tok/s, ETA 2 min 50 s, val ppl 45.21"
    )
    testing = {**TRAINING, "phase": "testing", "step": 800}
    assert status_line("rk4", testing) == "rk4: step 800/800 (100%), testing, val ppl 45.21"
    first = {**TRAINING, "step": 3, "val_ppl": None, "tokens_per_s": None, "steps_per_s": None}
    assert status_line("rk4", first) == "rk4: step 3/800 (0%)"
    assert status_line("rk4", None) == "rk4: starting"


def test_eta_is_the_steps_left_at_the_rate_or_the_time_budget_left():
    assert eta_seconds(TRAINING) == pytest.approx(170.0)  # 680 steps at 4 per second
    timed = {**TRAINING, "max_steps": None, "max_time_s": 100.0}
    assert eta_seconds(timed) == pytest.approx(70.0)
    assert eta_seconds({**TRAINING, "max_time_s": 50.0}) == pytest.approx(20.0)  # the sooner
    assert eta_seconds({"step": 5}) is None
    assert (
        status_line("x", {**timed, "val_ppl": None}) == "x: step 120, 5,432 tok/s, ETA 1 min 10 s"
    )


def test_durations_read_as_seconds_minutes_hours():
    assert [duration(s) for s in (0, 44.6, 65, 3599, 3600 * 3 + 125)] == [
        "0 s",
        "45 s",
        "1 min 05 s",
        "59 min 59 s",
        "3 h 02 min",
    ]


def test_plain_board_prints_indented_lines_at_most_once_per_interval():
    stream = io.StringIO()
    board = ProgressBoard(stream, every=3600, tty=False)
    board.event("[1/2] a seed 0: training")
    board.update(["[1/2] a seed 0: step 1/10 (10%)"])  # before the first interval: nothing
    assert stream.getvalue() == "[1/2] a seed 0: training\n"
    board.every = 0
    board.update(["[1/2] a seed 0: step 5/10 (50%)", "[2/2] b seed 0: starting"])
    board.update([])  # nothing in flight: no line
    assert stream.getvalue().splitlines()[1:] == [
        "  [1/2] a seed 0: step 5/10 (50%)",
        "  [2/2] b seed 0: starting",
    ]


def test_terminal_board_redraws_its_lines_in_place(monkeypatch):
    monkeypatch.setenv("COLUMNS", "19")  # lines are cut to the terminal's width
    stream = io.StringIO()
    board = ProgressBoard(stream, tty=True)
    board.update(["a: step 1/10 (10%), 900 tok/s", "b: starting"])
    board.update(["a: step 2/10 (20%)", "b: step 1/10 (10%)"])
    board.event("a: trained")
    board.close()
    up = "\x1b[1A\x1b[2K"
    assert stream.getvalue() == (
        "a: step 1/10 (10%)\nb: starting\n"
        + up * 2
        + "a: step 2/10 (20%)\nb: step 1/10 (10%)\n"
        + up * 2
        + "a: trained\n"
    )


def test_read_progress_is_none_until_written_or_when_unreadable(tmp_path):
    path = tmp_path / "progress.json"
    assert read_progress(path) is None
    path.write_text('{"step": 3')  # a torn write cannot happen (atomic), a stray file can
    assert read_progress(path) is None
    path.write_text(json.dumps({"step": 3}))
    assert read_progress(path) == {"step": 3}


@pytest.mark.slow
def test_training_keeps_a_progress_file_in_the_run_folder(tmp_path, tiny_config):
    values = tiny_config(tmp_path, "run", trainer={"max_steps": 6, "val_every": 3})
    result = train(parse_config(values))
    progress = read_progress(tmp_path / "run" / PROGRESS_FILE)
    assert progress["phase"] == "testing" and progress["step"] == result["steps"] == 6
    assert progress["max_steps"] == 6 and progress["tokens_per_s"] > 0
    assert progress["steps_per_s"] > 0 and progress["max_time_s"] is None
    assert progress["val_ppl"] >= result["valid_ppl"] > 1  # the last validation; the best
    assert status_line("run", progress).startswith("run: step 6/6 (100%), testing, val ppl ")
