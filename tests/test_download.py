"""The downloader against a loopback HTTP server serving fixture archives built on the spot."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from experiments.data import download as dl
from experiments.data.download import (
    ARCHIVES,
    MANIFEST,
    ChecksumError,
    DownloadError,
    download_corpus,
    sha256_file,
    verify_file,
)

TEXTS = {
    "train": b" the cat sat on the mat \n a <unk> sat too \n",
    "valid": b" the dog ran \n",
    "test": b" a bird flew over the <unk> \n",
}


def _tgz() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for split, text in TEXTS.items():
            info = tarfile.TarInfo(f"./simple-examples/data/ptb.{split}.txt")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return buffer.getvalue()


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("wikitext-2-raw/README.txt", "not a split")
        for split, text in TEXTS.items():
            zf.writestr(f"wikitext-2-raw/wiki.{split}.raw", text)
    return buffer.getvalue()


class _Server:
    """Serves ``routes`` (path -> body); ``/short/...`` promises more bytes than it sends."""

    def __init__(self) -> None:
        self.routes: dict[str, bytes] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                truncated = self.path.startswith("/short/")
                body = server.routes.get(self.path.removeprefix("/short"))
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) + 1000 * truncated))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if truncated else body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.timeout = 5
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    srv = _Server()
    srv.routes = {"/simple-examples.tgz": _tgz(), "/wikitext-2-raw-v1.zip": _zip()}
    yield srv
    srv.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _finals(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.mark.parametrize(
    "name,path", [("ptb", "/simple-examples.tgz"), ("wikitext2-raw", "/wikitext-2-raw-v1.zip")]
)
def test_good_archive_is_extracted_verified_and_cached(server, tmp_path, name, path):
    body = server.routes[path]
    out = download_corpus(name, tmp_path, url=server.url(path), sha256=_sha(body), timeout=5)
    spec = ARCHIVES[name]
    assert out == tmp_path / spec.directory
    assert _finals(out) == sorted([*spec.members.values(), MANIFEST])  # no .part left over
    for split, text in TEXTS.items():
        (file_name,) = [n for n in spec.members.values() if f".{split}." in n]
        assert (out / file_name).read_bytes() == text
    # Present and verified: no second request.
    assert (
        download_corpus(name, tmp_path, url=server.url(path), sha256=_sha(body), timeout=5) == out
    )
    assert server.requests == [path]


def test_wrong_archive_checksum_raises_and_leaves_no_files(server, tmp_path):
    with pytest.raises(ChecksumError, match="expected sha256 " + "0" * 64):
        download_corpus(
            "ptb", tmp_path, url=server.url("/simple-examples.tgz"), sha256="0" * 64, timeout=5
        )
    assert _finals(tmp_path / "ptb") == []


def test_truncated_transfer_raises_and_leaves_no_files(server, tmp_path):
    body = server.routes["/simple-examples.tgz"]
    url = server.url("/short/simple-examples.tgz")
    with pytest.raises(DownloadError) as info:
        download_corpus("ptb", tmp_path, url=url, sha256=_sha(body), timeout=5)
    message = str(info.value)
    assert url in message and str(tmp_path / "ptb") in message and "ptb.train.txt" in message
    assert _finals(tmp_path / "ptb") == []


def test_canonical_file_hashes_reject_made_up_ptb(server, tmp_path):
    # Without a sha256 override the published per-file hashes apply: made-up text fails them
    # before anything is renamed into place.
    with pytest.raises(ChecksumError, match="ptb"):
        download_corpus("ptb", tmp_path, url=server.url("/simple-examples.tgz"), timeout=5)
    assert _finals(tmp_path / "ptb") == []


def test_corrupted_cached_file_is_detected_and_fetched_again(server, tmp_path):
    url, body = server.url("/wikitext-2-raw-v1.zip"), server.routes["/wikitext-2-raw-v1.zip"]
    out = download_corpus("wikitext2-raw", tmp_path, url=url, sha256=_sha(body), timeout=5)
    (out / "wiki.valid.raw").write_bytes(b" the dog ran \n tampered \n")
    dead = server.url("/missing.zip")  # 404: the corrupted copy must not be served instead
    with pytest.raises(DownloadError, match="checksum mismatch for .*wiki.valid.raw"):
        download_corpus("wikitext2-raw", tmp_path, url=dead, sha256=_sha(body), timeout=5)
    download_corpus("wikitext2-raw", tmp_path, url=url, sha256=_sha(body), timeout=5)
    assert (out / "wiki.valid.raw").read_bytes() == TEXTS["valid"]
    assert server.requests == ["/wikitext-2-raw-v1.zip", "/missing.zip", "/wikitext-2-raw-v1.zip"]


def test_offline_error_names_url_directory_and_files(tmp_path):
    with pytest.raises(DownloadError) as info:
        download_corpus(
            "wikitext2", tmp_path, url="http://127.0.0.1:9/wikitext-2-v1.zip", timeout=2
        )
    message = str(info.value)
    for part in (
        "http://127.0.0.1:9/wikitext-2-v1.zip",
        str(tmp_path / "wikitext-2"),
        "wiki.train.tokens",
    ):
        assert part in message


def test_unknown_corpus_lists_valid_names(tmp_path):
    with pytest.raises(KeyError, match="ptb, wikitext2, wikitext2-raw"):
        download_corpus("ptb2", tmp_path)


def test_verify_file_names_file_and_hashes(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"abc")
    verify_file(path, _sha(b"abc"))
    with pytest.raises(ChecksumError) as info:
        verify_file(path, "1" * 64)
    assert (
        str(path) in str(info.value)
        and "1" * 64 in str(info.value)
        and _sha(b"abc") in str(info.value)
    )


def test_known_hashes_match_the_shared_real_files(data_dir):
    checked = 0
    for sub in ("ptb", "wikitext-2"):
        for path in sorted((data_dir / sub).iterdir()):
            assert sha256_file(path) == dl.KNOWN_FILE_SHA256[path.name]
            checked += 1
    assert checked == 4
    # A user who copied the real PTB files by hand is served from them with no network.
    assert set(ARCHIVES["ptb"].file_sha256) == {"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"}


def test_corrupt_archive_raises_download_error_and_leaves_no_files(server, tmp_path):
    garbage = b"\x1f\x8b" + bytes(range(256)) * 4  # a gzip magic number, then noise
    server.routes["/bad.tgz"] = garbage
    with pytest.raises(DownloadError, match="corrupt"):
        download_corpus(
            "ptb", tmp_path, url=server.url("/bad.tgz"), sha256=_sha(garbage), timeout=5
        )
    assert _finals(tmp_path / "ptb") == []


def test_load_corpus_with_download_fetches_missing_files_into_the_cache(
    server, tmp_path, monkeypatch
):
    import dataclasses

    from experiments.data import corpora

    body = server.routes["/wikitext-2-raw-v1.zip"]
    mirror = dataclasses.replace(
        ARCHIVES["wikitext2-raw"], url=server.url("/wikitext-2-raw-v1.zip"), sha256=_sha(body)
    )
    monkeypatch.setitem(ARCHIVES, "wikitext2-raw", mirror)
    monkeypatch.setattr(corpora, "DEFAULT_CACHE_DIR", tmp_path)
    monkeypatch.delenv("ODELM_DATA_DIR", raising=False)
    with pytest.raises(corpora.CorpusError, match="wiki.train.raw"):
        corpora.load_corpus("wikitext2-raw")
    corpus = corpora.load_corpus("wikitext2-raw", download=True)
    assert corpus.split("valid") == [["the", "dog", "ran", "<eos>"]]
    assert server.requests == ["/wikitext-2-raw-v1.zip"]
