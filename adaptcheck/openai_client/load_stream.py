"""A lean HTTP/1.1 client for the load generator's timed requests: one streamed completion at a
time, at a fraction of httpx's CPU per token (docs/endpoints.md, "The load generator's client").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

from pydantic import JsonValue

from adaptcheck.openai_client.errors import (
    EndpointProtocolError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
)
from adaptcheck.openai_client.parsing import api_key_from_env, normalize_base_url, server_error_message
from adaptcheck.openai_client.records import CompletionResult, StreamChunk

READ_SIZE = 65536
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Stale(Exception):
    """A pooled keep-alive connection turned out closed before any answer byte."""


class StreamClient:
    """Streamed ``/v1/completions`` requests to one server (one event loop; :meth:`aclose` at the end).

    ``chat``: send to ``/v1/chat/completions`` instead (the body then carries ``messages``).
    """

    def __init__(self, base_url: str, *, connect_timeout_s: float = 5.0, chat: bool = False) -> None:
        self.base_url = normalize_base_url(base_url)
        parts = urlsplit(self.base_url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.chat = chat
        self.path = parts.path.rstrip("/") + ("/chat/completions" if chat else "/completions")
        self.connect_timeout_s = connect_timeout_s
        self._api_key = api_key_from_env()
        self._idle: list[_Conn] = []
        self._shown = f"{parts.scheme}://{self.host}:{self.port}{self.path}"

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def completion(self, body: Mapping[str, JsonValue], *, timeout_s: float) -> CompletionResult:
        """Send ``body`` (it must ask for ``stream: true``); the whole answer within ``timeout_s``."""
        try:
            return await asyncio.wait_for(self._request(body), timeout=timeout_s)
        except asyncio.TimeoutError:
            raise EndpointTimeout(f"{self._shown}: no complete answer within {timeout_s:g} s", url=self._shown,
                                  hint="is it overloaded or hung? raise the timeout or check the server log") from None

    # -- connections ---------------------------------------------------------------------

    async def _connect(self) -> _Conn:
        ctx = ssl.create_default_context() if self.tls else None
        try:
            return await asyncio.wait_for(asyncio.open_connection(self.host, self.port, ssl=ctx),
                                          timeout=self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise EndpointUnreachable(f"cannot reach {self._shown}: connection timed out after "
                                      f"{self.connect_timeout_s:g} s", url=self._shown) from None
        except OSError as exc:
            why = "connection refused" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
            raise EndpointUnreachable(f"cannot reach {self._shown}: {why}", url=self._shown,
                                      hint="is the server running?") from None

    def _head(self, length: int) -> bytes:
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Content-Type: application/json",
                 "Accept: text/event-stream", f"Content-Length: {length}"]
        if self._api_key:
            lines.append(f"Authorization: Bearer {self._api_key}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def _open_exchange(self, payload: bytes) -> tuple[_Conn, bytes]:
        """Write the request on a pooled connection (or a new one); returns it with the status line."""
        request = self._head(len(payload)) + payload
        while self._idle and self._idle[-1][0].at_eof():  # closed by the server while idle
            self._idle.pop()[1].close()
        for _ in range(2):
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                conn[1].write(request)
                await conn[1].drain()
                status = await conn[0].readline()
                if not status:
                    raise _Stale
                return conn, status
            except (_Stale, ConnectionError, OSError) as exc:
                conn[1].close()
                if not reused:
                    raise EndpointProtocolError(f"{self._shown}: the connection was closed before an answer "
                                                f"({type(exc).__name__})", url=self._shown,
                                                hint="the server may have died; check its log") from None
            # A keep-alive connection the server had closed: once more, on a fresh one.
        raise AssertionError("unreachable")

    # -- one request ---------------------------------------------------------------------

    async def _request(self, body: Mapping[str, JsonValue]) -> CompletionResult:
        payload = json.dumps(body).encode()
        t_send = time.perf_counter()
        conn, status_line = await self._open_exchange(payload)
        reader, writer = conn
        reusable = False  # set once the whole answer was read, so the connection is at a message boundary
        try:
            status, headers = await self._read_head(reader, status_line)
            t_headers = time.perf_counter()
            keep_alive = headers.get("connection", "").lower() != "close"
            pieces = self._body(reader, headers)
            if status != 200:
                raw = b"".join([piece async for piece, _ in pieces])
                reusable = keep_alive
                msg = server_error_message(raw)
                raise EndpointStatusError(f"{self._shown} answered HTTP {status}: {msg}", status=status,
                                          server_message=msg, url=self._shown)
            result = await self._events(pieces)
            reusable = keep_alive
            result.t_send, result.t_headers = t_send, t_headers
            return result
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            raise EndpointProtocolError(f"{self._shown}: the connection was closed mid-response "
                                        f"({type(exc).__name__})", url=self._shown,
                                        hint="the server may have died; check its log") from None
        except ValueError as exc:  # bad JSON, a bad status line or chunk size
            raise EndpointProtocolError(f"{self._shown}: malformed answer ({exc})", url=self._shown) from None
        finally:
            # Cancelled or failed mid-answer: the connection's state is unknown, so it is closed.
            if reusable and not reader.at_eof():
                self._idle.append(conn)
            else:
                writer.close()

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader, status_line: bytes) -> tuple[int, dict[str, str]]:
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"not an HTTP status line: {status_line[:60]!r}")
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[tuple[bytes, float]]:
        """The body's pieces as they arrive, each with its arrival time."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readline()).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2], time.perf_counter()
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left > 0:
                data = await reader.read(min(left, READ_SIZE))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data, time.perf_counter()
        else:
            while data := await reader.read(READ_SIZE):
                yield data, time.perf_counter()

    async def _events(self, pieces: AsyncIterator[tuple[bytes, float]]) -> CompletionResult:
        """Fold the server-sent events of a completions stream into one answer."""
        chunks: list[StreamChunk] = []
        texts: list[str] = []
        ids: list[int] = []
        ids_given = done = False
        finish: str | None = None
        # Read field by field, not through the general client's models (wire.py): this loop
        # runs once per streamed token and its CPU is the load generator's limit.
        prompt_tokens = completion_tokens = None
        model = response_id = None
        buffer = b""
        async for piece, t in pieces:
            buffer += piece
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event:/id: lines
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                data = json.loads(payload)
                if not isinstance(data, dict):
                    raise EndpointProtocolError(f"{self._shown}: a stream event is not a JSON object",
                                                url=self._shown)
                if "error" in data and "choices" not in data:
                    msg = server_error_message(payload)
                    err = data["error"]
                    code = err.get("code") if isinstance(err, dict) else None
                    raise EndpointStatusError(f"{self._shown}: error in the stream: {msg}",
                                              status=code if isinstance(code, int) else None,
                                              server_message=msg, url=self._shown)
                model = data.get("model") or model
                response_id = data.get("id") or response_id
                usage = data.get("usage")
                if isinstance(usage, dict):
                    prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
                choice = next((c for c in data.get("choices") or [] if c.get("index", 0) == 0), None)
                if choice is None:
                    chunks.append(StreamChunk(t=t, text=""))
                    continue
                if self.chat:
                    text = (choice.get("delta") or {}).get("content") or ""
                else:
                    text = choice.get("text") or ""
                n = None
                if isinstance(choice.get("token_ids"), list):
                    ids_given = True
                    ids.extend(int(i) for i in choice["token_ids"])
                    n = len(choice["token_ids"])
                if choice.get("finish_reason") is not None:
                    finish = str(choice["finish_reason"])
                texts.append(text)
                chunks.append(StreamChunk(t=t, text=text, n_tokens=n, finish_reason=choice.get("finish_reason")))
        if not done and finish is None:
            raise EndpointProtocolError(f"{self._shown}: the stream ended before the answer was complete "
                                        f"(no finish_reason, no [DONE] after {len(chunks)} events)", url=self._shown,
                                        hint="the server may have died mid-request; check its log")
        return CompletionResult(text="".join(texts), finish_reason=finish, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens,
                                token_ids=ids if ids_given else None, model=model, response_id=response_id,
                                stream=True, t_end=time.perf_counter(), chunks=chunks, done_seen=done)

