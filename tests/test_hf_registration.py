"""Registration on import (issue 47): ``import odelm`` alone, in a fresh process, is enough for
``AutoModelForCausalLM.from_pretrained`` to load a saved model, and costs no ``transformers``
import until the process makes one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code],
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
