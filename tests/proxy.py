"""What the test proxies share: a real HTTP server on 127.0.0.1 that relays to a real upstream.

``tests/steps/frameworks/wrong_server.py`` (corrupts answers) and ``tests/perf/fault_proxy.py``
(fails like a server under load) differ only in how they answer completion requests; the
server's life cycle, the pass-through of every other request and "closing for good" live here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class Relay(BaseHTTPRequestHandler):
    """Keep-alive handler that forwards GETs (model list, health, metrics) to ``root`` unchanged."""

    protocol_version = "HTTP/1.1"
    root: str = ""
    """The upstream without its ``/v1`` (request paths are forwarded as they come); set by subclasses."""

    def log_message(self, *args: Any) -> None:
        return

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        resp = httpx.get(self.root + self.path, timeout=30)
        self._reply(resp.status_code, resp.content)

    def _start_stream(self, resp: httpx.Response) -> None:
        """Answer with the upstream's status and content type, chunked: the body follows as
        :meth:`_chunk` calls arrive, the way a streaming server sends it."""
        self.send_response(resp.status_code)
        self.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        """One chunk of the answer, sent at once (``b""`` ends the answer)."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def upstream_root(url: str) -> str:
    """``http://host:port/v1`` → ``http://host:port``."""
    return url.rstrip("/").removesuffix("/v1")


def close_for_good(server: ThreadingHTTPServer) -> None:
    """Stop serving and close the listening socket, so later connections are refused (not left
    hanging in the backlog). From another thread: a handler cannot wait for its own server."""

    def die() -> None:
        server.shutdown()
        server.server_close()

    threading.Thread(target=die, daemon=True).start()


@contextmanager
def serving(make_handler: Callable[[ThreadingHTTPServer], type[BaseHTTPRequestHandler]], *,
            daemon_threads: bool = False) -> Iterator[str]:
    """Run the server on a free port; yields its base URL (``http://127.0.0.1:PORT/v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.daemon_threads = daemon_threads
    server.RequestHandlerClass = make_handler(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        # Returns at once when close_for_good already stopped it.
        server.shutdown()
        server.server_close()
