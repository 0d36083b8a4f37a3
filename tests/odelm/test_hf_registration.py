"""Registration on import: ``import odelm`` alone, in a fresh process, is enough for
``AutoModelForCausalLM.from_pretrained`` to load a saved model, and costs no ``transformers``
import until the process makes one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT


def _python(code: str, *arguments: object) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, arguments)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_import_odelm_imports_no_transformers():
    assert _python("import sys, odelm; print('transformers' in sys.modules)") == "False"


@pytest.mark.slow  # a fresh process imports torch and transformers
@pytest.mark.parametrize("order", ["odelm first", "transformers first"])
def test_import_odelm_is_all_auto_classes_need(tmp_path, order):
    from neuralode_lm.models import LSTMLM

    LSTMLM(11, embed_dim=4, hidden_dim=4, dropout=0.0).save_pretrained(tmp_path)
    imports = ["import odelm", "from transformers import AutoModelForCausalLM, AutoConfig"]
    if order != "odelm first":
        imports.reverse()
    code = "; ".join(
        [
            *imports,
            f"model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})",
            f"config = AutoConfig.from_pretrained({str(tmp_path)!r})",
            "print(type(model).__name__, config.model_type)",
        ]
    )
    assert _python(code) == "LSTMLM odelm-lstm"


@pytest.mark.slow  # a fresh process imports torch and transformers
def test_a_process_that_imports_only_transformers_gets_transformers_own_error(tmp_path):
    # transformers resolves a model_type only from its own table, classes registered in the
    # process, or code named by auto_map (files run as code, trust_remote_code): a saved
    # folder is data and names no code, so without `import odelm` transformers refuses it
    # with its own message, which names the odelm-* model type (docs/usage.md says so)
    from neuralode_lm.models import LSTMLM

    LSTMLM(11, embed_dim=4, hidden_dim=4, dropout=0.0).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "auto_map" not in config and config["model_type"] == "odelm-lstm"
    code = (
        "import sys\n"
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        "    AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "print('odelm' in sys.modules)\n"
    )
    lines = _python(code, tmp_path)
    assert "model type `odelm-lstm` but Transformers does not recognize this" in lines
    assert lines.endswith("False")  # nothing of odelm ran
