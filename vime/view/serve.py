"""``vime view --serve``: the viewer page over local HTTP, with episode chunks fetched on demand
instead of inlined (the page stays small however large the run)."""

from __future__ import annotations

import io
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vime.view.index import PackedRun
from vime.view.page import write_page
from vime.view.source import RunSource

CHUNK_PATH = "/chunk/"


def make_server(
    source: RunSource, packed: PackedRun, pieces: dict[int, str], *, host: str, port: int
) -> ThreadingHTTPServer:
    """A server (not yet serving) for the page at ``/`` and chunk ``N`` at ``/chunk/N``."""
    text = io.StringIO()
    write_page(text, source, packed, pieces, chunk_url=CHUNK_PATH.lstrip("/"))
    page = text.getvalue().encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].split("#", 1)[0]
            match = re.fullmatch(re.escape(CHUNK_PATH) + r"(\d+)", path)
            if path in ("/", "/index.html"):
                self._send(page, "text/html; charset=utf-8")
            elif match and int(match[1]) < len(packed.chunks):
                # Gzip bytes as an opaque body (no Content-Encoding): the page gunzips them
                # exactly as it does the inline chunks.
                self._send(packed.chunks[int(match[1])], "application/octet-stream")
            else:
                self.send_error(404, f"no {path} here: the viewer serves / and {CHUNK_PATH}N")

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per chunk fetch would drown the terminal

    return ThreadingHTTPServer((host, port), Handler)
