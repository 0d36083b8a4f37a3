"""One of each: one ``ConfigError`` for a bad config in every package, one
``atomic_write``, one name for tying the output to the embedding (``tie_embeddings``; a run
saved with ``tie_weights`` loads and keeps its identity)."""

from __future__ import annotations

import pytest
import yaml

import neuralode_lm
import ode_transformer
from experiments.config_errors import ConfigError as HarnessConfigError
from experiments.training.config import RunConfig, load_run_config, parse_config
from experiments.training.runs import config_sha256
from odelm.errors import ConfigError
from odelm.files import atomic_write

LSTM = {"family": "neuralode_lm", "name": "lstm", "embed_dim": 8, "hidden_dim": 8}


def test_one_config_error_class():
    names = (
        neuralode_lm.ModelConfigError,
        neuralode_lm.SolverConfigError,
        ode_transformer.ODETransformerConfigError,
        HarnessConfigError,
    )
    assert all(name is ConfigError for name in names)
    assert issubclass(ConfigError, ValueError)


def test_atomic_write_renames_when_done_and_removes_the_partial_on_error(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(path) as partial:
        partial.write_text("half")
        raise RuntimeError
    assert path.read_text() == "old" and not partial.exists()
    with atomic_write(path) as partial:
        partial.write_text("new")
        assert path.read_text() == "old"  # nothing is seen half-written
    assert path.read_text() == "new" and not partial.exists()


def test_a_run_saved_with_tie_weights_loads_with_its_identity(tmp_path):
    saved = RunConfig(model={**LSTM, "tie_embeddings": True}).to_dict()
    new_hash = config_sha256(parse_config(saved))
    saved["model"] = {**LSTM, "tie_weights": True}  # what odelm 0.3 wrote
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    loaded = load_run_config(tmp_path / "config.yaml")
    assert loaded.model == {**LSTM, "tie_embeddings": True}
    assert config_sha256(loaded) == new_hash


def test_a_hand_written_tie_weights_names_the_new_key():
    with pytest.raises(ConfigError, match="tie_weights was renamed tie_embeddings"):
        parse_config({"model": {**LSTM, "tie_weights": True}})
    with pytest.raises(ConfigError, match="write tie_embeddings: True"):
        neuralode_lm.LSTMLM(20, embed_dim=8, hidden_dim=8, tie_weights=True)
