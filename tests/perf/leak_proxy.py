"""A leaking server for the soak check's tests: a streaming relay, run as its own process, that
keeps (leaks) a fixed amount of memory per completion request.

    python -m tests.perf.leak_proxy --upstream http://127.0.0.1:8000/v1 --port 0 --leak-mib-per-request 2

It relays every request to the real upstream server (completions streamed chunk by chunk as
they arrive, so the load generator sees a real stream) and, for each completion request,
allocates ``--leak-mib-per-request`` MiB, writes to every page of it (untouched pages would
not be resident, and RSS would not grow) and keeps it for the life of the process. With
``0`` it is a flat server: the control. It runs as a separate process so that its resident
memory is its own, found by the soak check the way it finds any local server: by the pid
listening on the endpoint's port.

Prints its base URL (``http://127.0.0.1:PORT/v1``) on the first line of stdout once it listens;
``--port 0`` picks a free port.
"""

from __future__ import annotations

import argparse
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.proxy import Relay, upstream_root

PAGE = 4096
MIB = 2**20


class Leak:
    """Memory kept on purpose: one touched block per request."""

    def __init__(self, mib_per_request: float) -> None:
        self.size = int(mib_per_request * MIB)
        self.blocks: list[bytearray] = []
        self.lock = threading.Lock()

    def take(self) -> None:
        if self.size <= 0:
            return
        block = bytearray(self.size)  # zero pages from the kernel: not resident until written
        block[::PAGE] = b"\x01" * len(range(0, self.size, PAGE))
        with self.lock:
            self.blocks.append(block)


def make_handler(root: str, leak: Leak, client: httpx.Client) -> type[BaseHTTPRequestHandler]:
    class Handler(Relay):
        def do_GET(self) -> None:
            # One shared client: a client per request (Relay's default) costs the proxy CPU and
            # allocator churn that would blur the flat control.
            resp = client.get(root + self.path)
            self._reply(resp.status_code, resp.content)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path.endswith("/completions"):
                leak.take()
            with client.stream("POST", root + self.path, content=body,
                               headers={"Content-Type": "application/json"}) as resp:
                self._start_stream(resp)
                for chunk in resp.iter_raw():
                    self._chunk(chunk)
                self._chunk(b"")

    Handler.root = root
    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the real server's base URL (…/v1)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--leak-mib-per-request", type=float, default=0.0, help="MiB kept per completion request")
    args = parser.parse_args(argv)
    root = upstream_root(args.upstream)
    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)) as client:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(root, Leak(args.leak_mib_per_request),
                                                                              client))
        server.daemon_threads = True
        print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
