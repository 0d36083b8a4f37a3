"""Adding a run-config key takes its field (and its use), nothing else: an ``optim`` key added
at run time, a field whose default is the old behaviour, leaves every pinned identity hash
as it was and shows in ``odelm train --help`` with its range and help line."""

from __future__ import annotations

import dataclasses

import pytest
from test_config_identity import OTHER_GRIDS, TABLE5_FIELD, grid_hashes

from experiments.cli.options import train_parser
from experiments.training import config, identity, run_schema
from experiments.training.config import parse_config
from experiments.training.run_schema import Fraction, OptimConfig
from experiments.training.runs import config_sha256
from tests.experiments.comparison.test_study_identity import (
    STUDIES,
    WITHOUT_RECORDS,
    check_records,
)

EXAMPLE = {"model": {"family": "reference"}, "trainer": {"max_steps": 4}}


@pytest.fixture
def ema_decay(monkeypatch):
    """``OptimConfig`` with one more field, as if written in ``run_schema.py``:
    ``ema_decay: Fraction = 0.0`` (0: no weight averaging, the old behaviour) and its
    ``Attributes:`` line. The monkeypatching redoes only what importing the module does (the
    sections, the identity's fields, the cached parser): no table names the key."""

    @dataclasses.dataclass
    class WithEma(OptimConfig):
        ema_decay: Fraction = 0.0

    WithEma.__doc__ = (OptimConfig.__doc__ or "").rstrip() + (
        "\n        ema_decay: decay of a moving average of the weights (0: none)\n"
    )
    monkeypatch.setattr(run_schema, "OptimConfig", WithEma)
    monkeypatch.setitem(run_schema.SECTIONS, "optim", WithEma)
    monkeypatch.setattr(identity, "RUN_FIELDS", identity._fields())
    config.run_parser.cache_clear()
    yield WithEma
    config.run_parser.cache_clear()


def test_a_new_optim_key_is_an_option_with_its_range_and_hashes_nothing_at_its_default(
    ema_decay,
):
    before = config_sha256(parse_config(EXAMPLE))
    help_text = " ".join(train_parser().format_help().split())
    assert "--optim.ema_decay EMA_DECAY decay of a moving average of the weights (0: none)" in (
        help_text
    )
    assert "(type: float >=0, <1, default: 0.0)" in help_text
    read = parse_config(EXAMPLE)
    assert isinstance(read.optim, ema_decay) and read.optim.ema_decay == 0.0
    assert config_sha256(read) == before  # the old behaviour: the old hash
    on = parse_config({**EXAMPLE, "optim": {"ema_decay": 0.9}})
    assert identity.identity(on)["optim.ema_decay"] == 0.9 and config_sha256(on) != before
    with pytest.raises(config.ConfigError, match=r"optim.ema_decay = 1.5 is out of range"):
        parse_config({**EXAMPLE, "optim": {"ema_decay": 1.5}})


@pytest.mark.slow  # every pinned hash: about 20 s of CPU time
def test_a_new_optim_key_moves_no_pinned_hash(ema_decay):
    for grid, expected in {**TABLE5_FIELD, **OTHER_GRIDS}.items():
        hashes = grid_hashes(grid)
        assert {run: hashes[run] for run in expected} == expected, grid
    for study in sorted(set(STUDIES) - WITHOUT_RECORDS):
        check_records(study)
