"""A faulty server for the load generator's tests: a real streaming HTTP proxy in front of a real server.

Unlike ``tests/steps/frameworks/wrong_server.py`` (which answers streams itself from the
upstream's complete answer, to corrupt their content), this proxy relays the upstream's
stream as it arrives, chunk by chunk, so timing-sensitive code sees a real stream, and it
fails in the ways a server under load fails, chosen by ``mode``:

- ``passthrough``: nothing wrong (control);
- ``fail_every``: every ``every``-th completion request is answered HTTP 500 at once;
- ``dies``: after ``after`` requests it closes its listening socket (later connections
  are refused) and cuts the streams in flight mid-answer;
- ``hangs``: after ``after`` requests it keeps accepting but never answers again, and the
  streams in flight go silent (until the proxy is stopped).

Nothing here mocks a library: the client under test talks HTTP to a real socket.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.proxy import Relay, close_for_good, serving, upstream_root

MODES = ("passthrough", "fail_every", "dies", "hangs")


@dataclass
class ProxyState:
    """What the proxy has seen (readable by the test while it runs)."""

    mode: str
    root: str
    every: int
    after: int
    requests: int = 0
    failed: int = 0
    broken: threading.Event = field(default_factory=threading.Event)
    """Set once the proxy died or hung."""
    stopping: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: ProxyState, server: ThreadingHTTPServer) -> type[BaseHTTPRequestHandler]:
    class Handler(Relay):
        root = state.root

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                state.requests += 1
                n = state.requests
            if state.mode == "fail_every" and n % state.every == 0:
                with state.lock:
                    state.failed += 1
                self._reply(500, json.dumps({"error": {"message": "injected failure", "type": "InternalServerError",
                                                       "code": 500}}).encode())
                return
            if state.mode in ("dies", "hangs") and n > state.after:
                self._break()
                return
            self._relay(body)

        def _break(self) -> None:
            if not state.broken.is_set():
                state.broken.set()
                if state.mode == "dies":
                    close_for_good(server)
            if state.mode == "hangs":
                state.stopping.wait(120)  # accepted, never answered
            self.close_connection = True
            self.connection.close()

        def _relay(self, body: bytes) -> None:
            with httpx.stream("POST", state.root + self.path, content=body, timeout=120,
                              headers={"Content-Type": "application/json"}) as resp:
                self._start_stream(resp)
                for chunk in resp.iter_raw():
                    if state.broken.is_set():
                        if state.mode == "hangs":
                            state.stopping.wait(120)  # the stream goes silent
                        self.close_connection = True
                        self.connection.close()  # dies: cut mid-answer
                        return
                    self._chunk(chunk)
                self._chunk(b"")

    return Handler


@contextmanager
def fault_proxy(upstream: str, mode: str, *, every: int = 3, after: int = 4) -> Iterator[tuple[str, ProxyState]]:
    """Run the proxy on 127.0.0.1; yields its base URL (``http://127.0.0.1:PORT/v1``) and its state."""
    assert mode in MODES, mode
    state = ProxyState(mode=mode, root=upstream_root(upstream), every=every, after=after)
    # Daemon handler threads: a hung one must not hold the server's close.
    with serving(lambda server: _handler(state, server), daemon_threads=True) as url:
        try:
            yield url, state
        finally:
            state.stopping.set()  # release the hung handlers before the server stops
