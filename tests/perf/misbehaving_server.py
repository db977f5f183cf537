"""A misbehaving OpenAI-compatible server: a real streaming HTTP proxy in front of a real server.

It relays the upstream's answers (streams event by event, as they arrive) with the faults
asked for, each one a blind spot of endpoint evidence (issue 14):

- ``no_usage``: every ``usage`` object is removed (and usage-only stream events dropped);
- ``extra_tokens``: the request is forwarded with ``max_tokens + extra``, so the answer is
  ``extra`` tokens longer than asked (its usage honestly says so, unless ``no_usage``);
- ``no_token_ids``: ``token_ids`` are removed from every choice;
- ``merge_chunks``: every two content events are sent as one (text joined, token ids
  removed): chunks that carry two tokens each, as a server that batches its stream does;
- ``chat_only``: ``/v1/completions`` answers 404 (a chat-only endpoint); chat goes through;
- ``no_tokenize``: ``/tokenize`` answers 404.

``pace=(ttft_s, gap_s)`` re-times a stream: the proxy reads the whole upstream answer,
then sends its first event ``ttft_s`` after the request arrived (or at once, if the
upstream took longer) and each later one ``gap_s`` after the previous (inter-chunk gaps
known exactly, whatever the upstream's speed).

Nothing here mocks a library: the client under test talks HTTP to a real socket, and the
answers are a real model's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from tests.proxy import Relay, serving, upstream_root

FAULTS = frozenset({"no_usage", "extra_tokens", "no_token_ids", "merge_chunks", "chat_only", "no_tokenize"})


@dataclass
class Seen:
    """What the proxy was asked (readable by the test while it runs)."""

    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _content(choice: dict[str, Any]) -> str | None:
    """The text a choice adds (completions ``text``, chat ``delta.content``); None when it has no such field."""
    if "text" in choice:
        return str(choice.get("text") or "")
    delta = choice.get("delta")
    if isinstance(delta, dict) and "content" in delta:
        return str(delta.get("content") or "")
    return None


def _set_content(choice: dict[str, Any], text: str) -> None:
    if "text" in choice:
        choice["text"] = text
    else:
        choice["delta"]["content"] = text


class _Events:
    """Turns the upstream's stream events into the ones this proxy sends (faults applied)."""

    def __init__(self, faults: frozenset[str]) -> None:
        self.faults = faults
        self.pending: dict[str, Any] | None = None

    def feed(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        if "no_usage" in self.faults:
            data.pop("usage", None)
            if not data.get("choices"):
                return []
        choices = data.get("choices") or []
        if self.faults & {"no_token_ids", "merge_chunks"}:
            for c in choices:
                c.pop("token_ids", None)
        choice = choices[0] if choices else None
        text = _content(choice) if choice is not None else None
        if "merge_chunks" not in self.faults or choice is None or (not text and choice.get("finish_reason") is None):
            return [data]
        if self.pending is None and choice.get("finish_reason") is None:
            self.pending = data
            return []
        if self.pending is None:
            return [data]
        first, self.pending = self.pending, None
        _set_content(choice, (_content(first["choices"][0]) or "") + (text or ""))
        return [data]

    def flush(self) -> list[dict[str, Any]]:
        out, self.pending = ([self.pending] if self.pending is not None else []), None
        return out


def _answer_json(answer: dict[str, Any], faults: frozenset[str]) -> dict[str, Any]:
    if "no_usage" in faults:
        answer.pop("usage", None)
    if faults & {"no_token_ids", "merge_chunks"}:
        for c in answer.get("choices") or []:
            c.pop("token_ids", None)
    return answer


def _handler(root: str, faults: frozenset[str], extra: int, pace: tuple[float, float] | None,
             seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(Relay):
        def do_GET(self) -> None:
            with seen.lock:
                seen.paths.append(self.path)
            super().do_GET()

        def do_POST(self) -> None:
            arrived = time.perf_counter()
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with seen.lock:
                seen.paths.append(self.path)
            if ("chat_only" in faults and self.path.rstrip("/").endswith("/v1/completions")) or (
                    "no_tokenize" in faults and self.path.rstrip("/").endswith("/tokenize")):
                self._reply(404, b'{"detail":"Not Found"}')
                return
            body = json.loads(raw or b"{}")
            if "extra_tokens" in faults and body.get("max_tokens"):
                body["max_tokens"] = int(body["max_tokens"]) + extra
                if isinstance(body.get("generation_config"), str):  # transformers serve's ignore_eos emulation
                    cfg = json.loads(body["generation_config"])
                    if "min_new_tokens" in cfg:
                        cfg["min_new_tokens"] = body["max_tokens"]
                    body["generation_config"] = json.dumps(cfg)
            if not body.get("stream"):
                resp = httpx.post(root + self.path, json=body, timeout=120)
                if resp.status_code != 200 or not self.path.rstrip("/").endswith("completions"):
                    self._reply(resp.status_code, resp.content)
                    return
                self._reply(200, json.dumps(_answer_json(resp.json(), faults)).encode())
                return
            with httpx.stream("POST", root + self.path, json=body, timeout=120) as resp:
                if resp.status_code != 200:
                    self._reply(resp.status_code, resp.read())
                    return
                self._start_stream(resp)
                events = _Events(faults)
                held: list[bytes] = []

                def send(items: list[dict[str, Any]] | list[str]) -> None:
                    for item in items:
                        line = f"data: {item if isinstance(item, str) else json.dumps(item)}\n\n".encode()
                        if pace is None:
                            self._chunk(line)
                        else:
                            held.append(line)

                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        send(events.flush())
                        send(["[DONE]"])
                        continue
                    send(events.feed(json.loads(payload)))
                send(events.flush())
            if pace is not None:
                # The upstream's whole answer is in: the first event at ttft_s after arrival, or
                # now when the upstream took longer (the gaps, not the TTFT, are what is exact).
                due = max(arrived + pace[0], time.perf_counter())
                for event in held:
                    time.sleep(max(0.0, due - time.perf_counter()))
                    self._chunk(event)
                    due += pace[1]
            self._chunk(b"")

    Handler.root = root
    return Handler


@contextmanager
def misbehaving_server(upstream: str, *faults: str, extra: int = 7,
                       pace: tuple[float, float] | None = None) -> Iterator[tuple[str, Seen]]:
    """Run the proxy on 127.0.0.1 in front of ``upstream``; yields its base URL and what it saw."""
    unknown = set(faults) - FAULTS
    assert not unknown, unknown
    seen = Seen()
    with serving(lambda _server: _handler(upstream_root(upstream), frozenset(faults), extra, pace, seen),
                 daemon_threads=True) as url:
        yield url, seen
