"""A latency-controlled OpenAI-compatible server: a real HTTP/SSE server in its own process on 127.0.0.1.

It generates no text worth reading; what it controls exactly is *when* each token arrives,
so perf.serving's statistics can be tested against latencies whose distribution is known:

- ``GET /v1/models``: one model, ``latency-model``;
- ``POST /v1/completions``: ``max_tokens`` tokens (one per SSE event when ``stream``), the
  first after ``ttft_ms``, each next one ``itl_ms`` later, both times a *scale*; usage in
  the last event (and in the non-streamed answer);
- ``POST /control`` (JSON): changes the settings below and resets the request counter;
  ``GET /control`` returns them with the counter.

The scale of a request depends on its position i in the stream of *measured-shape*
requests (streamed, ``max_tokens ≥ min_tokens``: the framework's and load generator's
1- and 2-token probes are left out of the count), so a test can shape runs without
knowing when they start:

- ``period``: requests per run (a perf.serving run with ``warmup_requests: 0`` and
  ``num_requests: period``); ``scales``: the scale of each successive run, cycled
  (``[1, 2]``: every other run 2× slower);
- ``drift``: within a run, request k of ``period`` is ``1 + drift · k/(period−1)`` slower
  (``0.3``: the last request of each run 30 % slower than the first);
- ``jitter``: log-normal noise (sigma) on each request's scale, seeded by ``seed``.

Run ``python -m tests.perf.latency_server`` (prints ``PORT <n>`` once listening), or use
:func:`latency_server` in a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

MODEL = "latency-model"


@dataclass
class Settings:
    ttft_ms: float = 20.0
    itl_ms: float = 4.0
    period: int = 0
    """Measured-shape requests per run (0: no run structure: scale 1, no drift)."""
    scales: list[float] = field(default_factory=lambda: [1.0])
    drift: float = 0.0
    jitter: float = 0.0
    seed: int = 0
    min_tokens: int = 3


class State:
    def __init__(self) -> None:
        self.settings = Settings()
        self.count = 0
        self.rng = random.Random(0)

    def configure(self, data: dict[str, Any]) -> None:
        self.settings = Settings(**{**asdict(self.settings), **data})
        self.count = 0
        self.rng = random.Random(self.settings.seed)

    def scale(self, max_tokens: int, stream: bool) -> float:
        s = self.settings
        if not stream or max_tokens < s.min_tokens:
            return 1.0
        i = self.count
        self.count += 1
        scale = 1.0
        if s.period > 0:
            run, k = divmod(i, s.period)
            scale = s.scales[run % len(s.scales)] * (1.0 + s.drift * k / max(1, s.period - 1))
        if s.jitter > 0:
            scale *= math.exp(self.rng.gauss(0.0, s.jitter))
        return scale


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return method, path.split("?", 1)[0], headers, body


def _head(status: int, ctype: str, length: int | None) -> bytes:
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "Status")
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {ctype}"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _json(writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    writer.write(_head(status, "application/json", len(body)) + body)
    await writer.drain()


async def _completion(writer: asyncio.StreamWriter, state: State, req: dict[str, Any]) -> None:
    n = max(1, int(req.get("max_tokens") or 16))
    stream = bool(req.get("stream"))
    scale = state.scale(n, stream)
    s = state.settings
    prompt = req.get("prompt") or ""
    usage = {"prompt_tokens": len(str(prompt).split()) or 1, "completion_tokens": n,
             "total_tokens": (len(str(prompt).split()) or 1) + n}
    base: dict[str, Any] = {"id": "cmpl-latency", "object": "text_completion", "model": MODEL}
    start = time.perf_counter()
    if not stream:
        await asyncio.sleep((s.ttft_ms + s.itl_ms * (n - 1)) * scale / 1000.0)
        await _json(writer, 200, {**base, "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                                  "usage": usage})
        return
    writer.write(_head(200, "text/event-stream", None))
    for i in range(n):
        # Absolute deadlines: a late wake-up does not push every later token back.
        due = start + (s.ttft_ms + s.itl_ms * i) * scale / 1000.0
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        last = i == n - 1
        event: dict[str, Any] = {**base, "choices": [{"index": 0, "text": " tok", "finish_reason": "length" if last else None}]}
        if last:
            event["usage"] = usage
        data = f"data: {json.dumps(event)}\n\n".encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()
    done = b"data: [DONE]\n\n"
    writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
    await writer.drain()


async def _connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: State) -> None:
    try:
        while (got := await _read_request(reader)) is not None:
            method, path, _, body = got
            if path == "/v1/models":
                await _json(writer, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            elif path == "/health":
                await _json(writer, 200, {})
            elif path == "/control" and method == "POST":
                state.configure(json.loads(body or b"{}"))
                await _json(writer, 200, {**asdict(state.settings), "count": state.count})
            elif path == "/control":
                await _json(writer, 200, {**asdict(state.settings), "count": state.count})
            elif path == "/v1/completions" and method == "POST":
                await _completion(writer, state, json.loads(body or b"{}"))
            else:
                await _json(writer, 404, {"error": {"message": f"no route {path}", "code": 404}})
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(port: int) -> None:
    state = State()
    server = await asyncio.start_server(lambda r, w: _connection(r, w, state), "127.0.0.1", port)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def latency_server(**settings: Any) -> Iterator[tuple[str, Any]]:
    """Start the server in a subprocess; yields (``http://127.0.0.1:PORT/v1``, ``control``): ``control(**settings)``
    changes settings, ``control()`` reads them and the request counter."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.perf.latency_server", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"latency server did not start: {line!r}")
        root = f"http://127.0.0.1:{int(line.split()[1])}"

        def control(**new: Any) -> dict[str, Any]:
            """New settings (and the counter reset) when given; else the current ones and the counter."""
            resp = httpx.post(f"{root}/control", json=new, timeout=5) if new else httpx.get(f"{root}/control", timeout=5)
            out: dict[str, Any] = resp.json()
            return out

        if settings:
            control(**settings)
        yield f"{root}/v1", control
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="latency-controlled OpenAI-compatible test server")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    asyncio.run(_serve(args.port))


if __name__ == "__main__":
    main()
