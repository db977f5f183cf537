"""A deliberately wrong OpenAI-compatible server: a real HTTP proxy in front of a real server.

Requests are forwarded to a real upstream (``transformers serve`` in the tests), and the
answers are then corrupted in one way, chosen by ``mode``:

- ``passthrough``: nothing wrong (control);
- ``wrong_tokens``: the answer's text is changed after its first few characters;
- ``ignore_max_tokens``: the request is forwarded with more tokens than the client asked for;
- ``batch_crosstalk``: a request that arrives while another is in flight gets that other
  request's answer (what a KV-cache slot mix-up looks like from outside);
- ``dies``: after ``die_after`` requests the server closes its socket for good;
- ``rejects_scoring``: a request with ``prompt_logprobs`` or ``echo`` is a 400 (OpenAI's
  "Unrecognized request argument");
- ``ignores_scoring``: ``prompt_logprobs`` and ``echo`` are removed before forwarding
  (a server that accepts unknown fields and silently does not honour them);
- ``no_prompt_logprobs``: only ``prompt_logprobs`` is a 400; ``echo`` goes through (a
  server with legacy echo but without vLLM's extension).

Streaming requests are answered by the proxy itself as server-sent events built from the
upstream's complete answer. Nothing here mocks a library: the client under test talks
HTTP to a real socket.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.proxy import Relay, close_for_good, serving, upstream_root

MODES = ("passthrough", "wrong_tokens", "ignore_max_tokens", "batch_crosstalk", "dies",
         "rejects_scoring", "ignores_scoring", "no_prompt_logprobs")
SCORING_FIELDS = {"rejects_scoring": ("prompt_logprobs", "echo"), "no_prompt_logprobs": ("prompt_logprobs",)}
"""The fields each rejecting mode answers with a 400."""


class _State:
    def __init__(self, upstream: str, mode: str, die_after: int) -> None:
        self.root = upstream_root(upstream)
        self.mode = mode
        self.die_after = die_after
        self.lock = threading.Lock()
        self.in_flight = 0
        self.requests = 0
        self.last_answer: dict[str, Any] | None = None


def _text_of(answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return str(choice.get("text", choice.get("message", {}).get("content", "")) or "")


def _set_text(answer: dict[str, Any], text: str) -> None:
    choice = answer["choices"][0]
    if "message" in choice:
        choice["message"]["content"] = text
    else:
        choice["text"] = text


def _handler(state: _State, server: ThreadingHTTPServer) -> type[BaseHTTPRequestHandler]:
    class Handler(Relay):
        root = state.root

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            with state.lock:
                state.requests += 1
                state.in_flight += 1
                crowded = state.in_flight > 1
                count = state.requests
            try:
                if state.mode == "dies" and count > state.die_after:
                    close_for_good(server)
                    self.close_connection = True
                    self.connection.close()
                    return
                self._answer(body, crowded)
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _answer(self, body: dict[str, Any], crowded: bool) -> None:
            refused = [f for f in SCORING_FIELDS.get(state.mode, ()) if body.get(f)]
            if refused:
                message = f"Unrecognized request argument supplied: {refused[0]}"
                self._reply(400, json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                                       "param": refused[0], "code": None}}).encode())
                return
            if state.mode == "ignores_scoring":
                for name in ("prompt_logprobs", "echo"):
                    body.pop(name, None)
            stream = bool(body.pop("stream", False))
            body.pop("stream_options", None)
            if state.mode == "ignore_max_tokens" and body.get("max_tokens"):
                body["max_tokens"] = int(body["max_tokens"]) + 4
            resp = httpx.post(state.root + self.path, json=body, timeout=120)
            if resp.status_code != 200:
                self._reply(resp.status_code, resp.content)
                return
            answer = resp.json()
            if state.mode == "wrong_tokens":
                text = _text_of(answer)
                _set_text(answer, text[:4] + "".join(reversed(text[4:])) + " zq")
            with state.lock:
                if state.mode == "batch_crosstalk" and crowded and state.last_answer is not None \
                        and _text_of(state.last_answer) != _text_of(answer):
                    _set_text(answer, _text_of(state.last_answer))
                state.last_answer = answer
            if not stream:
                self._reply(200, json.dumps(answer).encode())
                return
            self._stream(answer, chat="messages" in body)

        def _stream(self, answer: dict[str, Any], chat: bool) -> None:
            text, finish = _text_of(answer), answer["choices"][0].get("finish_reason")
            pieces = [text[i:i + 3] for i in range(0, len(text), 3)] or [""]
            events = []
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish if last else None}
                if chat:
                    choice["delta"] = {"content": piece}
                else:
                    choice["text"] = piece
                event: dict[str, Any] = {"id": "x", "choices": [choice]}
                if last and "usage" in answer:
                    event["usage"] = answer["usage"]
                events.append(f"data: {json.dumps(event)}\n\n")
            events.append("data: [DONE]\n\n")
            self._reply(200, "".join(events).encode(), ctype="text/event-stream")

    return Handler


@contextmanager
def wrong_server(upstream: str, mode: str, die_after: int = 3) -> Iterator[str]:
    """Run the proxy on 127.0.0.1; yields its base URL (``http://127.0.0.1:PORT/v1``)."""
    assert mode in MODES, mode
    state = _State(upstream, mode, die_after)
    with serving(lambda server: _handler(state, server)) as url:
        yield url
