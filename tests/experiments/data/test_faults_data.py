"""Data faults: each test fails on the old behaviour.

- a cached split whose known checksum does not match is an error, not a PTB-mini result;
- a stalling mirror ends in one error within a bounded time and leaves no partial file;
- ``--download`` under the mini protocol fetches only valid and test, and needs no
  network when they are present.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import yaml

from experiments.cli.main import main
from experiments.data import corpora
from experiments.data.checksums import ChecksumError
from experiments.data.corpora import SPECS, load_corpus
from experiments.data.download import (
    DownloadError,
    DownloadStallError,
    StallGuardDownloader,
    download_corpus,
)
from tests.support.loopback import TEXTS, LoopbackServer, sha256, wikitext_raw_zip

ZIP = "/wikitext-2-raw-v1.zip"


@pytest.fixture
def server():
    srv = LoopbackServer(stall_interval=0.05)
    srv.routes = {ZIP: wikitext_raw_zip()}
    yield srv
    srv.close()


@pytest.fixture
def truncated_ptb(tmp_path: Path) -> Path:
    """PTB's valid and test files with the valid file cut short: they fail the published hashes."""
    folder = tmp_path / "data" / "ptb"
    folder.mkdir(parents=True)
    (folder / "ptb.valid.txt").write_text(" the dog ran \n the cat sa")
    (folder / "ptb.test.txt").write_text(" a bird flew \n")
    return folder.parent


def test_corrupt_cached_split_is_an_error_for_train(truncated_ptb, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ODELM_DATA_DIR", raising=False)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "corrupt",
                "out_dir": str(tmp_path / "runs"),
                "data": {"corpus": "ptb", "protocol": "mini", "data_dir": str(truncated_ptb)},
                "model": {"family": "ode_transformer", "preset": "small", "n_layers": 1},
                "trainer": {"max_steps": 1},
            }
        )
    )
    assert main(["train", "--config", str(config)]) != 0
    message = capsys.readouterr().err
    assert "ptb.valid.txt does not match its known checksum" in message
    assert "data.verify_checksums: false" in message
    assert not (tmp_path / "runs" / "corrupt" / "result.json").exists()
    # data info still describes the file, and says what is wrong with it.
    info = main(["data", "info", "--corpus", "ptb", "--data-dir", str(truncated_ptb), "--json"])
    assert info == 0
    assert '"checksum": "MISMATCH"' in capsys.readouterr().out


def test_corrupt_split_is_used_only_when_the_user_says_so(truncated_ptb, monkeypatch):
    monkeypatch.delenv("ODELM_DATA_DIR", raising=False)
    with pytest.raises(ChecksumError, match="truncated or corrupt"):
        load_corpus("ptb", truncated_ptb, protocol="mini")
    corpus = load_corpus("ptb", truncated_ptb, protocol="mini", verify_checksums=False)
    assert corpus.protocol.startswith("PTB-mini")
    assert corpus.split("test") == [["a", "bird", "flew", "<eos>"]]


def _download_in_thread(**kwargs) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            download_corpus(**kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=60)  # a liveness bound: the old downloader never returned
    return thread, errors


def test_trickling_mirror_ends_in_a_stall_error_and_leaves_no_part_file(server, tmp_path):
    # One byte every 0.05 s never trips a 5 s read timeout; the rate guard must end it.
    body = server.routes[ZIP]
    thread, errors = _download_in_thread(
        name="wikitext2-raw",
        cache_dir=tmp_path,
        url=server.url("/stall" + ZIP),
        sha256=sha256(body),
        downloader=StallGuardDownloader(
            timeout=5, stall_seconds=0.5, min_bytes_per_s=1024, progressbar=False
        ),
    )
    assert not thread.is_alive()
    (error,) = errors
    assert isinstance(error, DownloadError) and "stalled" in str(error)
    assert sorted(p.name for p in (tmp_path / "wikitext-2-raw").iterdir()) == []


def test_silent_mirror_ends_in_a_read_timeout(server, tmp_path):
    server.stall_interval = 20.0  # one byte, then 20 s of silence: a stalling mirror
    thread, errors = _download_in_thread(
        name="wikitext2-raw",
        cache_dir=tmp_path,
        url=server.url("/stall" + ZIP),
        downloader=StallGuardDownloader(timeout=0.5, progressbar=False),
    )
    assert not thread.is_alive()
    (error,) = errors
    assert isinstance(error, DownloadStallError) and "sent no data for 0.5 s" in str(error)
    assert sorted(p.name for p in (tmp_path / "wikitext-2-raw").iterdir()) == []


def _point_at(server_url: str, body: bytes, monkeypatch, cache: Path) -> None:
    spec = SPECS["wikitext2-raw"]
    archive = dataclasses.replace(spec.archive, url=server_url, sha256=sha256(body))
    monkeypatch.setitem(SPECS, "wikitext2-raw", dataclasses.replace(spec, archive=archive))
    monkeypatch.setattr(corpora, "DEFAULT_CACHE_DIR", cache)
    monkeypatch.delenv("ODELM_DATA_DIR", raising=False)


def test_mini_download_fetches_only_valid_and_test(server, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _point_at(server.url(ZIP), server.routes[ZIP], monkeypatch, cache)
    corpus = load_corpus("wikitext2-raw", protocol="mini", download=True)
    assert corpus.split("test") == [["a", "bird", "flew", "over", "the", "<unk>", "<eos>"]]
    assert server.requests == [ZIP]
    names = sorted(p.name for p in (cache / "wikitext-2-raw").iterdir())
    assert names == [".verified.json", "wiki.test.raw", "wiki.valid.raw"]  # no train split
    # The full protocol later fetches the train split it needs.
    full = load_corpus("wikitext2-raw", protocol="full", download=True)
    assert full.split("train")[0] == ["the", "cat", "sat", "on", "the", "mat", "<eos>"]
    assert server.requests == [ZIP, ZIP]


def test_mini_download_works_offline_when_valid_and_test_are_present(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("valid", "test"):
        (data / f"wiki.{split}.raw").write_bytes(TEXTS[split])
    _point_at("http://127.0.0.1:9/offline.zip", b"", monkeypatch, tmp_path / "cache")
    corpus = load_corpus("wikitext2-raw", data, protocol="mini", download=True)
    assert corpus.split("test") == [["a", "bird", "flew", "over", "the", "<unk>", "<eos>"]]
    assert not (tmp_path / "cache").exists()
