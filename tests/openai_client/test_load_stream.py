"""The lean streaming client against a scripted HTTP server on a real socket: framings, reuse, failures.

The real servers (vLLM's chunked SSE ending in ``[DONE]``, transformers serve's stream without
it) are covered by test_loadgen; here each answer is written byte for byte, so the cases real
servers rarely produce on demand are exercised: a keep-alive connection the server closed,
sized and unframed bodies, an error event mid-stream, a stream or body cut short, an HTTP error,
silence, a closed port.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from adaptcheck.openai_client.errors import (
    EndpointProtocolError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
)
from adaptcheck.openai_client.load_stream import StreamClient

BODY = {"prompt": "hi", "max_tokens": 2, "stream": True}


def event(data: dict[str, Any] | str) -> bytes:
    return b"data: " + (data if isinstance(data, str) else json.dumps(data)).encode() + b"\n\n"


def token(text: str, tid: int, finish: str | None = None) -> bytes:
    return event({"id": "c", "model": "m", "choices": [{"index": 0, "text": text, "token_ids": [tid],
                                                         "finish_reason": finish}]})


STREAM = [token("He", 1), token("llo", 2, "length"),
          event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}), event("[DONE]")]


def chunked(parts: list[bytes], *, close: bool = False) -> bytes:
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    head += "Connection: close\r\n" if close else ""
    return head.encode() + b"\r\n" + b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


def sized(body: bytes, status: str = "200 OK", ctype: str = "text/event-stream", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {n}\r\n\r\n".encode() + body


@dataclass
class Server:
    """Answers request number n with ``answers[min(n, len) - 1]``; closes after it when ``close_after``."""

    answers: list[bytes]
    close_after: bool = False
    connection_of_request: list[int] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        conn = len(self.writers)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                json.loads(await reader.readexactly(length))
                self.connection_of_request.append(conn)
                n = len(self.connection_of_request)
                writer.write(self.answers[min(n, len(self.answers)) - 1])
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def run(server: Server, scenario: Callable[[StreamClient, Server], Awaitable[None]]) -> None:
    async def main() -> None:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        client = StreamClient(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1")
        try:
            await scenario(client, server)
        finally:
            await client.aclose()
            listener.close()
            await listener.wait_closed()

    asyncio.run(main())


def test_a_chunked_stream_is_timed_folded_and_its_connection_reused() -> None:
    async def scenario(client: StreamClient, server: Server) -> None:
        for _ in range(3):
            r = await client.completion(BODY, timeout_s=5)
            assert (r.text, r.token_ids, r.finish_reason, r.done_seen) == ("Hello", [1, 2], "length", True)
            assert (r.prompt_tokens, r.completion_tokens) == (3, 2)
            content = [c for c in r.chunks if c.text]
            assert [c.n_tokens for c in content] == [1, 1]
            assert r.t_send <= r.t_headers <= content[0].t <= content[1].t <= r.t_end

    server = Server([chunked(STREAM)])
    run(server, scenario)
    assert server.connection_of_request == [1, 1, 1]  # one keep-alive connection


def test_a_keep_alive_connection_the_server_closed_is_not_an_error() -> None:
    async def scenario(client: StreamClient, server: Server) -> None:
        await client.completion(BODY, timeout_s=5)
        server.writers[0].close()  # e.g. the server's keep-alive timeout, while the client holds it idle
        await asyncio.sleep(0.05)
        assert (await client.completion(BODY, timeout_s=5)).text == "Hello"

    server = Server([chunked(STREAM)])
    run(server, scenario)
    assert server.connection_of_request == [1, 2]


def test_connection_close_and_sized_and_unframed_bodies() -> None:
    unframed = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + b"".join(STREAM)

    async def scenario(client: StreamClient, server: Server) -> None:
        for _ in range(3):
            r = await client.completion(BODY, timeout_s=5)
            assert r.text == "Hello" and r.completion_tokens == 2

    server = Server([chunked(STREAM, close=True), sized(b"".join(STREAM)), unframed], close_after=True)
    run(server, scenario)
    assert server.connection_of_request == [1, 2, 3]


def test_no_done_marker_but_a_finish_reason_is_complete() -> None:  # transformers serve
    async def scenario(client: StreamClient, server: Server) -> None:
        r = await client.completion(BODY, timeout_s=5)
        assert r.text == "Hello" and r.done_seen is False and r.finish_reason == "length"

    run(Server([chunked([token("He", 1), token("llo", 2, "length")])]), scenario)


@pytest.mark.parametrize(("raw", "error", "match"), [
    (sized(b'{"error": {"message": "boom", "code": 500}}', "500 Internal Server Error", "application/json"),
     EndpointStatusError, "HTTP 500: boom"),
    (chunked([token("He", 1), event({"error": {"message": "engine died", "code": 500}})]),
     EndpointStatusError, "error in the stream: engine died"),
    (chunked([token("He", 1)]), EndpointProtocolError, "ended before the answer was complete"),
    (chunked([b"data: {not json\n\n"]), EndpointProtocolError, "malformed"),
    (sized(token("He", 1), length=500), EndpointProtocolError, "closed mid-response"),
    (b"SMTP ready\r\n", EndpointProtocolError, "malformed"),
])
def test_failures_are_endpoint_errors(raw: bytes, error: type[Exception], match: str) -> None:
    async def scenario(client: StreamClient, server: Server) -> None:
        with pytest.raises(error, match=match):
            await client.completion(BODY, timeout_s=5)

    run(Server([raw], close_after=True), scenario)


def test_silence_is_a_timeout_and_a_closed_port_is_unreachable() -> None:
    async def scenario(client: StreamClient, server: Server) -> None:
        with pytest.raises(EndpointTimeout, match=r"no complete answer within 0.3 s"):
            await client.completion(BODY, timeout_s=0.3)
        assert not client._idle  # a connection abandoned mid-answer is never reused

    run(Server([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n"]), scenario)

    async def refused() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with pytest.raises(EndpointUnreachable, match="connection refused"):
            await StreamClient(f"http://127.0.0.1:{port}").completion(BODY, timeout_s=5)

    asyncio.run(refused())
