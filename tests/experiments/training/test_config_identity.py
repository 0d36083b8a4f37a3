"""A run's identity hash survives the typed model configs and the key renames.

The expected hashes are the ``config_sha256`` of finished runs of the Table 5 field grids
(read from their ``result.json`` when the configs became typed), and of the LSTM, GPT-2
and node-transformer grids under the old key spellings (``num_layers``, ``n_blocks``): a
run made before the change resumes, and one made after it is the same run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.comparison.compare import expand_grid
from experiments.training.config import load_yaml, parse_config
from experiments.training.runs import config_sha256
from tests.support.paths import ROOT

GRIDS = ROOT / "experiments" / "configs" / "grids"

TABLE5_FIELD = {
    "table5-field-1layer": {
        "residual-seed1": "09fc517665dbf1ae6ab8713c0abd58ea7ee418d1ce79bf459929595c0a296df0",
        "rk2-seed1": "cd0187e540ad53927d7a1a4cbeada54eec0a3a3ad5f7fbaa42dd1f2a64e535ac",
        "rk2-gamma1-seed1": "fd26b03942715e65a1b8803ac8b23401ea4b87e90aae85705941ddbef7fa0829",
        "rk2-learnable-seed1": "2cec3c94d362342e3bd84f1e73da32c75904b3149350b132106ce37f36cfa60f",
        "rk4-seed1": "d9fc14512605ced59ae48f897d909aab22f9e19c3535670ad9e4b7c8155bbb30",
        "residual-2layer-seed1": "8dcee2d96c1cb88393728bd84612e6b8d8d2814fc76d3b6c5088c21af340bc76",
        "residual-4layer-seed1": "41a1f5335886286102340e839f4725bcf601fb15778e0f5e8ee274cc7556c3f1",
        "residual-seed2": "5cf7f3367edd675d136e2e7a9e159ea0197b5beb212ab205a28b5622811ea61b",
        "rk2-seed2": "a7a3d1aaf15615c2e18433619add5544b616582f03f0b66b076c8a9eeb5c2d56",
        "rk2-gamma1-seed2": "7d7adc1ff9a9b0c9044b085d22e4d1662a768818207d85e8a143ce31568a755f",
        "rk2-learnable-seed2": "4479fcb66d0fdd1c434f14dcba6cad1ba22233dab2dee56b4ee67806001876d3",
        "rk4-seed2": "70264f2a030b97ea8ed667519cb613c1b96316ef5db8729b49a6f5a8e25e3f3b",
        "residual-2layer-seed2": "12cde6b685416e87ae83eb45af5613433f3502549453cfcf56f06010dc64c14e",
    },
    "table5-field-2layer": {
        "residual-seed1": "8dcee2d96c1cb88393728bd84612e6b8d8d2814fc76d3b6c5088c21af340bc76",
        "rk2-seed1": "6d0348d74952818f0fbb98cdd7ea963cc74d2ae99216a175f30b22e143634c99",
        "rk2-gamma1-seed1": "878fdccc3584d9faad323ab7dfea4ec0d7e78ba6fa80b47ad4ba47c4e470b46f",
        "rk2-learnable-seed1": "770872ae2a258633fa9ab9f7d346ced1079c13ca29a7b0d1df309c6669698486",
        "rk4-seed1": "6f96235cc154a975a13c0871865b7bf1cf5d90ca5980bbf35fc1b8deb77fc02c",
        "residual-4layer-seed1": "41a1f5335886286102340e839f4725bcf601fb15778e0f5e8ee274cc7556c3f1",
        "residual-8layer-seed1": "9be25ed9226b4e4f9072c66351ecd081b2dcead97190403af214e23979692f9b",
        "reference-seed1": "5c1b5562eba04986d99e767edad69fd70a6f86353aa8c237963f696b060ba5ff",
        "residual-seed2": "12cde6b685416e87ae83eb45af5613433f3502549453cfcf56f06010dc64c14e",
        "rk2-seed2": "a9001c15142c1a0c0aa54230916fcd2a0f80f5837452c792dffb0c6d8c5bb328",
        "rk2-gamma1-seed2": "c7a0a70d7953d0f2dd5e3a182ae30b157a337c7f2280310cfb43d3216345f0b4",
        "rk2-learnable-seed2": "d8aca2345c2f62f91e914468c2ef6053e8e64cd5c989a932d4df00a68fc5cffb",
        "residual-seed3": "2619955af772d0efc4e748f45befd9e96a971317310cce8b10ce600c282d77fd",
        "rk2-seed3": "19a9acfe6da7b4dc9ee85b1ac4b6f069ded493cf27a0602a4b06375fa6d59dc5",
    },
}
"""``config_sha256`` of every finished run of the two grids, from its ``result.json``."""

OTHER_GRIDS = {
    # written with num_layers (the 3-seed grid, before the typed configs)
    "baselines-ptb-mini": {
        "lstm-untied-seed1": "5e63aab315102987e0fe49627649b366d91157c59c1363c5a051da1d7e55e8eb",
        "lstm-tied-seed1": "ae3d5f3e1769d324da04ae65d77d61ac802055caec3387f5db8ffe45695f5a20",
        "transformer-seed1": "f40b4c2fab1951c26313de5a2f377ac25fd5680dcd92f746b9b6b93758b0c898",
    },
    "node-lm-field": {
        "lstm-tied-seed1": "ae3d5f3e1769d324da04ae65d77d61ac802055caec3387f5db8ffe45695f5a20",
        "ode-lstm-tied-seed1": "64d9a1c601ecbfd49d10bbb09f6b3c3efe471a9a063c8859aab5f8e6f5f3c74a",
    },
    "node-lm-table1-cpu": {
        "base-lstm": "e237b71472e628877633185169c0b246636e435c8f08ed8799ab69f617b3e856",
        "ode-lstm": "57526fd71dbfb2983a08eea88615dda77bd1be8f299b7a509224d5f8e003176c",
        "base-gpt2": "8c8d2290870b2cb416da3fd3a8729a1066735a4971edc56fd40ff9ee749fbc49",
        "aug-ode-gpt2-causal": "7de08ae16570183b21e378ffb84fd97c635e1988f363f380921621941e9ec710",
    },
    "continuous-ptb-mini": {
        "node-dopri5-adjoint": "cbf6f841fa3a460e2abe43de3453648218c0d8d8b67d84ad8801a45c7e76f64d",
        "rk2": "f8e6ae617127fbf79fc718b2558909a8ae24f9c03ff71f9d31767afc08a4bca8",
    },
    "quick": {
        "ode-lstm": "968b642561cb0f8abb0271ae50d45db9c70d2dcbd3cd7b9755f7f09134d5628c",
        "ode-gpt2": "a16dc6ab67eec3c45744c00d35e5b70a609548c7a0219d6176818e6bdc23e445",
    },
}
"""Hashes of other grids' runs computed before the typed configs (old key spellings)."""


def grid_hashes(name: str) -> dict[str, str]:
    """``config_sha256`` of every run the grid file expands to, by run folder name."""
    grid = load_yaml(GRIDS / f"{name}.yaml")
    plans = expand_grid(grid, Path("out"), {}, None)
    return {plan.run: config_sha256(parse_config(plan.values)) for plan in plans}


@pytest.mark.parametrize("grid", sorted({**TABLE5_FIELD, **OTHER_GRIDS}))
@pytest.mark.slow
def test_grid_runs_keep_their_identity(grid: str) -> None:
    expected = {**TABLE5_FIELD, **OTHER_GRIDS}[grid]
    hashes = grid_hashes(grid)
    assert {run: hashes[run] for run in expected} == expected


@pytest.mark.slow
def test_ten_seed_baselines_rerun_the_three_seed_runs() -> None:
    """``baselines-ptb-mini-10seeds`` trains the very runs of ``baselines-ptb-mini`` (its
    docs compare them with the reference example): seeds 1-3 keep their identity."""
    three, ten = grid_hashes("baselines-ptb-mini"), grid_hashes("baselines-ptb-mini-10seeds")
    shared = {run: digest for run, digest in three.items() if not run.startswith("lstm-tied")}
    assert {run: ten[run] for run in shared} == shared
    assert sorted(ten) == sorted(
        f"{name}-seed{seed}" for name in ("lstm-untied", "transformer") for seed in range(1, 11)
    )
