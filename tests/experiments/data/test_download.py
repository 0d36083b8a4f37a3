"""The downloader (pooch underneath) against a loopback server serving fixture archives."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path

import pytest

from experiments.cli.main import main
from experiments.data.checksums import MANIFEST, ChecksumError, sha256_file, verify_file
from experiments.data.corpora import SPECS, CorpusError
from experiments.data.download import DownloadError, StallGuardDownloader, download_corpus
from experiments.data.extract import MAX_MEMBER_BYTES, STAGING
from tests.support.loopback import TEXTS, LoopbackServer, ptb_tgz, sha256, wikitext_raw_zip

FAST = StallGuardDownloader(timeout=5, progressbar=False)


@pytest.fixture
def server():
    srv = LoopbackServer()
    srv.routes = {"/simple-examples.tgz": ptb_tgz(), "/wikitext-2-raw-v1.zip": wikitext_raw_zip()}
    yield srv
    srv.close()


def _finals(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.mark.parametrize(
    "name,path", [("ptb", "/simple-examples.tgz"), ("wikitext2-raw", "/wikitext-2-raw-v1.zip")]
)
def test_good_archive_is_extracted_verified_and_cached(server, tmp_path, name, path):
    body, spec = server.routes[path], SPECS[name]
    out = download_corpus(
        name, tmp_path, url=server.url(path), sha256=sha256(body), downloader=FAST
    )
    assert out == tmp_path / spec.cache_subdir
    # Only the split files and the manifest: no archive, no temporary file left over.
    assert _finals(out) == sorted([*spec.files.values(), MANIFEST])
    for split, text in TEXTS.items():
        assert (out / spec.files[split]).read_bytes() == text
    # Present and verified: no second request.
    again = download_corpus(
        name, tmp_path, url=server.url(path), sha256=sha256(body), downloader=FAST
    )
    assert again == out
    assert server.requests == [path]


def test_wrong_archive_checksum_raises_and_leaves_no_files(server, tmp_path):
    with pytest.raises(ChecksumError, match="expected sha256 " + "0" * 64):
        download_corpus(
            "ptb",
            tmp_path,
            url=server.url("/simple-examples.tgz"),
            sha256="0" * 64,
            downloader=FAST,
        )
    assert _finals(tmp_path / "ptb") == []


def test_truncated_transfer_raises_and_leaves_no_files(server, tmp_path):
    body = server.routes["/simple-examples.tgz"]
    url = server.url("/short/simple-examples.tgz")
    with pytest.raises(DownloadError) as info:
        download_corpus("ptb", tmp_path, url=url, sha256=sha256(body), downloader=FAST)
    message = str(info.value)
    assert url in message and str(tmp_path / "ptb") in message and "ptb.train.txt" in message
    assert "IncompleteRead" in message
    assert _finals(tmp_path / "ptb") == []


def test_canonical_file_hashes_reject_made_up_ptb(server, tmp_path):
    # Without a sha256 override the published per-file hashes apply: made-up text fails them
    # before anything is renamed into place.
    with pytest.raises(ChecksumError, match="ptb"):
        download_corpus("ptb", tmp_path, url=server.url("/simple-examples.tgz"), downloader=FAST)
    assert _finals(tmp_path / "ptb") == []


def test_corrupted_cached_file_is_detected_and_fetched_again(server, tmp_path):
    url, body = server.url("/wikitext-2-raw-v1.zip"), server.routes["/wikitext-2-raw-v1.zip"]
    out = download_corpus("wikitext2-raw", tmp_path, url=url, sha256=sha256(body), downloader=FAST)
    (out / "wiki.valid.raw").write_bytes(b" the dog ran \n tampered \n")
    dead = server.url("/missing.zip")  # 404: the corrupted copy must not be served instead
    with pytest.raises(DownloadError, match="checksum mismatch for .*wiki.valid.raw"):
        download_corpus("wikitext2-raw", tmp_path, url=dead, sha256=sha256(body), downloader=FAST)
    download_corpus("wikitext2-raw", tmp_path, url=url, sha256=sha256(body), downloader=FAST)
    assert (out / "wiki.valid.raw").read_bytes() == TEXTS["valid"]
    assert server.requests == ["/wikitext-2-raw-v1.zip", "/missing.zip", "/wikitext-2-raw-v1.zip"]


def test_offline_error_names_url_directory_and_files(tmp_path):
    url = "http://127.0.0.1:9/wikitext-2-v1.zip"
    with pytest.raises(DownloadError) as info:
        download_corpus("wikitext2", tmp_path, url=url, downloader=FAST)
    message = str(info.value)
    for part in (url, str(tmp_path / "wikitext-2"), "wiki.train.tokens"):
        assert part in message


def test_unknown_corpus_lists_valid_names(tmp_path):
    with pytest.raises(CorpusError, match="valid: ptb, wikitext2, wikitext2-raw"):
        download_corpus("ptb2", tmp_path)


def test_verify_file_names_file_and_hashes(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"abc")
    verify_file(path, sha256(b"abc"))
    with pytest.raises(ChecksumError) as info:
        verify_file(path, "1" * 64)
    message = str(info.value)
    assert str(path) in message and "1" * 64 in message and sha256(b"abc") in message


def test_known_hashes_match_the_shared_real_files(data_dir):
    checked = 0
    for name, sub in (("ptb", "ptb"), ("wikitext2", "wikitext-2")):
        for path in sorted((data_dir / sub).iterdir()):
            assert sha256_file(path) == SPECS[name].file_sha256[path.name]
            checked += 1
    assert checked == 4
    # A user who copied the real PTB files by hand is served from them with no network.
    assert set(SPECS["ptb"].file_sha256) == {"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"}


def test_corrupt_archive_raises_download_error_and_leaves_no_files(server, tmp_path):
    garbage = b"\x1f\x8b" + bytes(range(256)) * 4  # a gzip magic number, then noise
    server.routes["/bad.tgz"] = garbage
    with pytest.raises(DownloadError, match="corrupt"):
        download_corpus(
            "ptb", tmp_path, url=server.url("/bad.tgz"), sha256=sha256(garbage), downloader=FAST
        )
    assert _finals(tmp_path / "ptb") == []


def test_load_corpus_with_download_fetches_missing_files_into_the_cache(
    server, tmp_path, monkeypatch
):
    from experiments.data import corpora

    body = server.routes["/wikitext-2-raw-v1.zip"]
    spec = SPECS["wikitext2-raw"]
    archive = dataclasses.replace(
        spec.archive, url=server.url("/wikitext-2-raw-v1.zip"), sha256=sha256(body)
    )
    monkeypatch.setitem(SPECS, "wikitext2-raw", dataclasses.replace(spec, archive=archive))
    monkeypatch.setattr(corpora, "DEFAULT_CACHE_DIR", tmp_path)
    monkeypatch.delenv("ODELM_DATA_DIR", raising=False)
    with pytest.raises(corpora.CorpusError, match="wiki.train.raw"):
        corpora.load_corpus("wikitext2-raw")
    corpus = corpora.load_corpus("wikitext2-raw", download=True)
    assert corpus.split("valid") == [["the", "dog", "ran", "<eos>"]]
    assert server.requests == ["/wikitext-2-raw-v1.zip"]


# Downloads are bounded, checked before extraction and cleaned.


class _Zeros(io.RawIOBase):
    """A readable stream of ``size`` zero bytes (a member built without holding it)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def _bomb_tgz(size: int) -> bytes:
    """A PTB-shaped tar.gz whose train file is ``size`` zero bytes (small compressed)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("./simple-examples/data/ptb.train.txt")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Zeros(size)))
    return buffer.getvalue()


def _bytes_written() -> int:
    """Bytes this process has written so far (Linux: ``wchar`` of /proc/self/io)."""
    text = Path("/proc/self/io").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("wchar:")).split()[1])


def _largest_file(folder: Path) -> int:
    return max((p.stat().st_size for p in folder.rglob("*") if p.is_file()), default=0)


@pytest.mark.parametrize(
    "archive_sha,error,message",
    [
        (None, DownloadError, "over the limit of 67108864 bytes per split file"),  # PTB: no hash
        ("0" * 64, ChecksumError, "expected sha256 " + "0" * 64),
    ],
)
def test_oversize_archive_is_refused_before_anything_is_expanded(
    server, tmp_path, archive_sha, error, message
):
    body = _bomb_tgz(MAX_MEMBER_BYTES + 1)
    assert len(body) < MAX_MEMBER_BYTES // 100  # small compressed, huge expanded
    server.routes["/bomb.tgz"] = body
    before = _bytes_written()
    with pytest.raises(error, match=message):
        download_corpus(
            "ptb", tmp_path, url=server.url("/bomb.tgz"), sha256=archive_sha, downloader=FAST
        )
    # The archive itself was written (and removed); nothing of its expansion was.
    assert _bytes_written() - before < 4 * len(body) + (1 << 20)
    assert _largest_file(tmp_path) == 0
    assert _finals(tmp_path / "ptb") == []


def test_splits_over_the_total_cap_are_refused(server, tmp_path, monkeypatch):
    from experiments.data import extract

    monkeypatch.setattr(extract, "MAX_TOTAL_BYTES", len(TEXTS["train"]) + 1)
    body = server.routes["/simple-examples.tgz"]
    with pytest.raises(DownloadError, match="refused before extracting"):
        download_corpus(
            "ptb",
            tmp_path,
            url=server.url("/simple-examples.tgz"),
            sha256=sha256(body),
            downloader=FAST,
        )
    assert _finals(tmp_path / "ptb") == []


def test_stale_partial_files_of_a_killed_download_are_removed_by_the_next(server, tmp_path):
    dest = tmp_path / "ptb"
    (dest / STAGING).mkdir(parents=True)
    # What a kill leaves: the staging folder's files, and the older versions' hidden files.
    stale = [
        dest / STAGING / "ptb.train.txt.part",
        dest / STAGING / "archive-simple-examples.tgz",
        dest / ".ptb.train.txt.k3j2x9.part",
        dest / ".archive-simple-examples.tgz",
    ]
    for path in stale:
        path.write_bytes(b"x" * 1000)
    (dest / "notes.txt").write_text("mine")  # not odelm's: left alone
    body = server.routes["/simple-examples.tgz"]
    download_corpus(
        "ptb",
        tmp_path,
        url=server.url("/simple-examples.tgz"),
        sha256=sha256(body),
        downloader=FAST,
    )
    assert _finals(dest) == sorted([*SPECS["ptb"].files.values(), MANIFEST, "notes.txt"])
    assert not any(path.exists() for path in stale)


def test_an_html_page_served_as_the_archive_is_named_as_such(server, tmp_path):
    page = b"<!DOCTYPE html>\n<html><body>Not found</body></html>\n"
    server.routes["/page.tgz"] = page
    with pytest.raises(DownloadError) as info:
        download_corpus("ptb", tmp_path, url=server.url("/page.tgz"), downloader=FAST)
    message = str(info.value)
    assert "web page (HTML)" in message and "\n" not in message
    assert STAGING not in message and ".archive" not in message  # no deleted temp file named
    assert _finals(tmp_path / "ptb") == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/a.tgz", "/etc/passwd"])
def test_a_url_that_is_not_http_is_refused_up_front(tmp_path, capsys, url):
    code = main(["data", "download", "--corpus", "ptb", "--cache-dir", str(tmp_path), "--url", url])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("odelm: error: --url") and "only http:// and https://" in err
    assert "checksum" not in err and list(tmp_path.iterdir()) == []


def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    code = main(["data", "download", "--corpus", "ptb", "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err == f"odelm: error: the cache folder {cache} is a file; give --cache-dir a folder\n"
    )
    assert cache.read_text() == "not a folder"


def test_a_staging_link_is_removed_without_touching_its_target(server, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    dest = tmp_path / "cache" / "ptb"
    dest.mkdir(parents=True)
    (dest / STAGING).symlink_to(victim)
    body = server.routes["/simple-examples.tgz"]
    url = server.url("/simple-examples.tgz")
    download_corpus("ptb", tmp_path / "cache", url=url, sha256=sha256(body), downloader=FAST)
    assert (victim / "precious.txt").read_text() == "keep" and not (dest / STAGING).exists()
