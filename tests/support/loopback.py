"""A loopback HTTP server for the download tests: serves bodies by path, and misbehaves on
request: ``/short/X`` promises more bytes than it sends (a truncated transfer) and
``/stall/X`` sends X one byte every ``stall_interval`` seconds (a stalling mirror)."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
import time
import zipfile

TEXTS = {
    "train": b" the cat sat on the mat \n a <unk> sat too \n",
    "valid": b" the dog ran \n",
    "test": b" a bird flew over the <unk> \n",
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ptb_tgz() -> bytes:
    """A tar.gz laid out like Mikolov's ``simple-examples.tgz`` with made-up splits."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for split, text in TEXTS.items():
            info = tarfile.TarInfo(f"./simple-examples/data/ptb.{split}.txt")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return buffer.getvalue()


def wikitext_raw_zip() -> bytes:
    """A zip laid out like ``wikitext-2-raw-v1.zip`` with made-up splits."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("wikitext-2-raw/README.txt", "not a split")
        for split, text in TEXTS.items():
            zf.writestr(f"wikitext-2-raw/wiki.{split}.raw", text)
    return buffer.getvalue()


class LoopbackServer:
    """Serves ``routes`` (path -> body) on 127.0.0.1 and records the paths requested."""

    def __init__(self, stall_interval: float = 20.0) -> None:
        self.routes: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.stall_interval = stall_interval
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                mode, _, rest = self.path.lstrip("/").partition("/")
                if mode not in ("short", "stall"):
                    mode, rest = "", self.path.lstrip("/")
                body = server.routes.get("/" + rest)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) + 1000 * (mode == "short")))
                self.end_headers()
                try:
                    if mode == "stall":
                        for byte in body:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(server.stall_interval)
                    else:
                        self.wfile.write(body[: len(body) // 2] if mode == "short" else body)
                        self.wfile.flush()
                except OSError:  # the client gave up
                    pass
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
