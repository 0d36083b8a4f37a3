"""Global rank 0 first: under ``torchrun`` every rank starts at once, and the others must not
read the run folder (``result.json``, ``last.ckpt``) before rank 0 has claimed it and, under
``--overwrite``, cleared it; otherwise a worker resumes from (or returns the result of) a run
rank 0 is deleting, and the ranks disagree.

The ranks meet in torchrun's own key-value store (the agent's ``TCPStore`` at
``MASTER_ADDR:MASTER_PORT``), before Lightning makes the process group: rank 0 sets one key
when the folder is ready, the others wait for it. Lightning's ``ddp`` launcher needs no wait
(it starts the other processes from ``trainer.fit``, after rank 0's setup), and outside a
torchrun launch nothing happens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

WAIT = timedelta(minutes=30)
"""How long a rank waits for rank 0 (PyTorch's default process-group timeout); torchrun
stops the other ranks as soon as rank 0 fails."""


def launch_store(timeout: timedelta = WAIT) -> Any | None:
    """A client of torchrun's agent store when this process is one rank of several launched
    by torchrun, else None."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(os.environ.get("WORLD_SIZE", "1") or 1) < 2:
        return None
    from torch.distributed import TCPStore

    return TCPStore(
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timeout,
    )


def _key(run_dir: Path) -> str:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"odelm/run-folder-ready/{restart}/{run_dir.resolve()}"


@contextmanager
def rank_zero_first(run_dir: Path, is_worker: bool, store: Any | None = None) -> Iterator[None]:
    """Run the body on global rank 0 first: the other ranks wait until it has ended (or
    raised: rank 0's error then stops the launch)."""
    store = store if store is not None else launch_store()
    if store is None:
        yield
        return
    key = _key(run_dir)
    if is_worker:
        store.wait([key])
        yield
        return
    yield
    store.set(key, "ready")
