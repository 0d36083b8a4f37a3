"""DDP through the launcher researchers use: ``torchrun --nproc_per_node 3`` on
gloo runs ``odelm train`` to the end, with one ``result.json`` and one ``config.yaml`` written
by rank 0; the other ranks wait for rank 0 to clear the folder under ``--overwrite``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from experiments.training import rankorder
from experiments.training.runfolder import RUN_MARKER
from tests.support.paths import ROOT


@pytest.mark.slow
def test_torchrun_three_processes_train_to_the_end(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    stale = out / "example"  # a stale finished run that --overwrite must clear first
    stale.mkdir(parents=True)
    (stale / RUN_MARKER).write_text(json.dumps({"kind": "run", "files": {}}))
    (stale / "result.json").write_text(json.dumps({"name": "stale"}))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3",
        "-m", "experiments", "train", "--config", "experiments/configs/example.yaml",
        "--trainer.strategy", "ddp", "--trainer.devices", "3", "--trainer.max_steps", "20",
        "--trainer.val_every", "10", "--trainer.val_batches", "3",
        "--trainer.num_threads", "1",
        "--eval.bleu_sentences", "10", "--eval.continuation_sentences", "4",
        "--out_dir", str(out), "--overwrite", "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "SLURM_PROCID"):
        env.pop(key, None)
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(list(out.rglob("result.json"))) == 1
    assert len(list(out.rglob("config.yaml"))) == 1
    result = json.loads((stale / "result.json").read_text())
    assert result["name"] == "example" and result["steps"] == 20
    assert result["test_ppl"] > 1 and result["valid_ppl"] is not None  # validation and test
    printed = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1  # only rank 0 reports


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_other_ranks_wait_until_rank_0_has_readied_the_folder(tmp_path, monkeypatch) -> None:
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=20))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    order: list[str] = []

    def worker() -> None:
        with rankorder.rank_zero_first(tmp_path, is_worker=True):
            order.append("worker")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and order == []  # waiting for rank 0
    with rankorder.rank_zero_first(tmp_path, is_worker=False):
        order.append("rank 0")
    thread.join(20)
    assert order == ["rank 0", "worker"]
    del server


def test_outside_torchrun_nothing_waits(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert rankorder.launch_store() is None
    with rankorder.rank_zero_first(tmp_path, is_worker=True):
        pass


@pytest.mark.slow
def test_fewer_validation_batches_than_processes_is_one_line() -> None:
    from types import SimpleNamespace

    from experiments.data.corpora import load_corpus
    from experiments.data.tokenization import WordTokenizer, encode_corpus
    from experiments.training.config import DataConfig
    from experiments.training.datamodule import LMDataModule, TooFewBatchesError

    corpus = load_corpus("grammar")
    data = encode_corpus(corpus, WordTokenizer.from_corpus(corpus))
    module = LMDataModule(data, DataConfig(batch_size=3, bptt=5), seed=0, val_batches=2)
    fake = SimpleNamespace(world_size=3, global_rank=2)
    module.trainer = fake
    with pytest.raises(TooFewBatchesError, match=r"trainer.val_batches \(2\) is below"):
        module.val_dataloader()
