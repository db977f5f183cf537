"""The async client of one OpenAI-compatible endpoint (httpx): listing models, readiness,
completions and chat completions (streamed or not), scoring, ``/metrics``. The server quirks it
handles are listed in docs/endpoints.md ("The OpenAI client").
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import JsonValue, ValidationError

from adaptcheck.base.errors import FrameworkError, ScoringUnsupported
from adaptcheck.base.procs import is_loopback_url
from adaptcheck.base.redact import REDACTED, scrub_text, scrub_url_credentials
from adaptcheck.openai_client.errors import (
    EndpointError,
    EndpointNotReady,
    EndpointProtocolError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
)
from adaptcheck.openai_client.metrics import parse_prometheus
from adaptcheck.openai_client.parsing import (
    MAX_SCORE_ALTERNATIVES,
    Accumulator,
    NotScored,
    api_key_from_env,
    connect_failure,
    finite,
    first_choice,
    int_key,
    logprobs_cap,
    normalize_base_url,
    one_line,
    refusal,
    server_error_message,
    token_id,
)
from adaptcheck.openai_client.records import Capabilities, CompletionResult, ScoreResult, StreamChunk

if TYPE_CHECKING:
    from typing_extensions import Self


OPTIONAL_FIELDS = frozenset({
    "ignore_eos", "return_token_ids", "return_tokens_as_token_ids", "seed", "logprobs",
    "top_logprobs", "stream_options", "generation_config",
})
"""Request fields the client may leave out when a server rejects them (vendor extensions
and optional OpenAI fields). Others (``max_tokens``, ``temperature``, ``stop`` …) are the
question itself: a server that rejects them answers with an error."""

# An error body that says "I do not know this field" (transformers: "Unexpected fields in
# the request"; OpenAI: "Unrecognized request argument"; pydantic: "Extra inputs are not
# permitted"). Only such an error makes the client drop fields: a 400 that merely mentions
# ``logprobs`` (e.g. too many asked) must stay an error.
_UNKNOWN_FIELD = re.compile(
    r"unexpected|unrecogni[sz]ed|unknown|extra (?:fields|inputs|keys)|not (?:permitted|allowed|supported)",
    re.IGNORECASE)

T = TypeVar("T")

_STALE_CONNECTION: tuple[type[Exception], ...] = (httpx.ReadError, httpx.RemoteProtocolError)
# Raised by ``send`` before any response header: the pooled keep-alive connection had been
# closed by the server. uvicorn does that after an unhandled exception (transformers serve's
# /v1/models 500) without saying ``Connection: close``, so the *next* request on that
# connection fails. Such a request is sent once more (a fresh connection): a server that
# has really died then refuses the connection, which is reported as unreachable.



class AsyncOpenAIClient:
    """Async client of one OpenAI-compatible endpoint.

    ``model``: the name to put in requests; None asks ``/v1/models`` once and takes the
    first, or leaves ``model`` out when the server does not list it (transformers serve).
    ``timeout_s``: the longest a request may take, and the longest silence within one.
    Use as ``async with`` or call :meth:`aclose`. Not shared between event loops: its
    connection pool belongs to the loop that first used it.
    """

    def __init__(self, base_url: str, *, model: str | None = None, timeout_s: float = 600.0,
                 connect_timeout_s: float = 5.0, max_connections: int = 256,
                 emulate_ignore_eos: bool = True) -> None:
        self.base_url = normalize_base_url(base_url)
        self.root_url = self.base_url[: -len("/v1")]
        self.model = model
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.emulate_ignore_eos = emulate_ignore_eos
        self.rejected_fields: set[str] = set()
        """Optional fields this server refused; left out of every later request."""
        self._model_resolved = model is not None
        self.__api_key = api_key_from_env()
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self.score_method: str | None = None
        """How this server scores a given prompt, once learnt ('prompt_logprobs' / 'echo')."""
        self.score_unsupported: str | None = None
        """Why this server cannot score a given prompt, once learnt (then not asked again)."""
        self.tokenize_unsupported: str | None = None
        """Why this server cannot count tokens (no ``/tokenize``), once learnt."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(base_url={self.display_url!r}, model={self.model!r}, "
                f"api_key={'set' if self.__api_key else 'unset'})")

    @property
    def display_url(self) -> str:
        """The base URL as it may be shown (credentials in the URL removed)."""
        return scrub_url_credentials(self.base_url)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http, self._http_loop = self._http, None, None
            await http.aclose()

    # -- plumbing ------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            # A pool bound to a closed loop cannot be reused (the sync wrapper runs one loop
            # per call); just drop it, its sockets died with that loop.
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                limits=httpx.Limits(max_connections=self.max_connections,
                                    max_keepalive_connections=self.max_connections),
                # Proxy variables are for remote endpoints only: an http_proxy without a
                # matching NO_PROXY would otherwise swallow requests to a local server.
                trust_env=not is_loopback_url(self.base_url),
            )
            self._http_loop = loop
        return self._http

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.__api_key:
            headers["Authorization"] = f"Bearer {self.__api_key}"
        return headers

    def _scrub(self, text: str) -> str:
        if self.__api_key:
            text = text.replace(self.__api_key, REDACTED)
        return scrub_text(text)

    def _url(self, path: str) -> str:
        return (self.root_url if path in ("/health", "/metrics", "/tokenize") else self.base_url) + (
            path[len("/v1"):] if path.startswith("/v1/") else path)

    def _transport_error(self, exc: Exception, url: str, *, streaming: bool = False) -> EndpointError:
        """Map an httpx failure to one of ours, with a message that says what to fix."""
        shown = self._scrub(scrub_url_credentials(url))
        detail = self._scrub(one_line(str(exc) or type(exc).__name__))
        if isinstance(exc, httpx.ConnectTimeout):
            return EndpointUnreachable(f"cannot reach {shown}: connection timed out after {self.connect_timeout_s:g} s",
                                       url=shown, hint="is the host up and the port open? check --endpoint")
        if isinstance(exc, httpx.ConnectError):
            base = self.display_url
            return EndpointUnreachable(f"cannot reach {base}: {connect_failure(exc) or detail}", url=base,
                                       hint="is the server running? check --endpoint")
        if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
            return EndpointUnreachable(f"invalid endpoint URL {shown}: {detail}", url=shown,
                                       hint="use http://HOST:PORT or http://HOST:PORT/v1")
        if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
            what = "went silent mid-stream" if streaming else "did not answer"
            return EndpointTimeout(f"{shown}: the server {what} for {self.timeout_s:g} s", url=shown,
                                   hint="is it overloaded or hung? raise the timeout or check the server log")
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            return EndpointProtocolError(f"{shown}: the connection was closed mid-response ({detail})", url=shown,
                                         hint="the server may have died; check its log")
        return EndpointError(f"{shown}: {type(exc).__name__}: {detail}", url=shown)

    async def _deadline(self, coro: Coroutine[Any, Any, T], timeout_s: float | None, url: str) -> T:
        """Bound the whole request: httpx's timeouts are per read, so a server that trickles
        bytes forever would otherwise never time out."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(coro, timeout=limit)
        except asyncio.TimeoutError:
            shown = self._scrub(scrub_url_credentials(url))
            raise EndpointTimeout(f"{shown}: no complete answer within {limit:g} s", url=shown,
                                  hint="is it overloaded or hung? raise the timeout or check the server log") from None

    async def _get(self, path: str, *, timeout_s: float | None = None) -> httpx.Response:
        url = self._url(path)
        http = self._client()
        timeout = httpx.Timeout(timeout_s or self.timeout_s, connect=min(self.connect_timeout_s, timeout_s or 1e9))
        for attempt in range(2):
            try:
                return await http.get(url, headers=self._headers(), timeout=timeout)
            except httpx.HTTPError as exc:
                if attempt == 0 and isinstance(exc, _STALE_CONNECTION):
                    continue  # see _STALE_CONNECTION: once more, on a fresh connection
                raise self._transport_error(exc, url) from exc
        raise AssertionError("unreachable")

    def _status_error(self, resp: httpx.Response, body: bytes, url: str) -> EndpointStatusError:
        shown = self._scrub(scrub_url_credentials(url))
        server_msg = self._scrub(server_error_message(body))
        hint = None
        if resp.status_code in (401, 403):
            hint = "set ADAPTCHECK_API_KEY (or OPENAI_API_KEY) to the endpoint's key"
        elif resp.status_code == 404 and "model" in server_msg.lower():
            hint = "check the model name"
        return EndpointStatusError(f"{shown} answered HTTP {resp.status_code}: {server_msg}",
                                   status=resp.status_code, server_message=server_msg, url=shown, hint=hint)

    # -- plain routes --------------------------------------------------------------------

    async def models(self) -> list[str]:
        """Model ids from ``/v1/models`` (transformers serve lists its cache here, not the served model)."""
        url = self._url("/v1/models")
        resp = await self._get("/v1/models")
        if resp.status_code != 200:
            raise self._status_error(resp, resp.content, url)
        try:
            data = resp.json()
            return [str(m["id"]) for m in data.get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EndpointProtocolError(f"{self.display_url}/models: not an OpenAI model list ({one_line(str(exc))})",
                                        url=self.display_url) from None

    async def resolve_model(self) -> str | None:
        """The model name to send: the one given, else the first listed, else None (leave it out)."""
        if not self._model_resolved:
            try:
                ids = await self.models()
                self.model = ids[0] if ids else None
            except EndpointStatusError:
                # transformers serve: /v1/models is its cache (or a 500); a pinned server takes
                # requests without ``model``.
                self.model = None
            self._model_resolved = True
        return self.model

    async def wait_ready(self, timeout_s: float, alive: Callable[[], bool] | None = None,
                         interval_s: float = 0.25) -> float:
        """Poll until the server answers; returns the seconds waited.

        Ready means ``/v1/models`` answers 200, or else ``/health`` answers 200 (transformers
        serve's model list can be a 500). ``alive`` (e.g. "the server process still runs")
        is checked between polls: once false, :class:`EndpointNotReady` is raised at once
        instead of waiting out the timeout.
        """
        start = time.monotonic()
        last = "no answer yet"
        while True:
            if alive is not None and not alive():
                raise EndpointNotReady(f"{self.display_url}: the server process exited before it was ready",
                                       process_exited=True, url=self.display_url)
            probe_timeout = max(0.5, min(5.0, timeout_s - (time.monotonic() - start)))
            for path in ("/v1/models", "/health"):
                try:
                    resp = await self._get(path, timeout_s=probe_timeout)
                except EndpointError as exc:
                    last = exc.message
                    break  # not listening yet: no point asking the other route
                if resp.status_code == 200:
                    return time.monotonic() - start
                last = f"{path} answered HTTP {resp.status_code}"
            if time.monotonic() - start >= timeout_s:
                raise EndpointNotReady(f"{self.display_url}: not ready within {timeout_s:g} s (last: {last})",
                                       process_exited=False, url=self.display_url)
            await asyncio.sleep(interval_s)

    async def metrics_text(self) -> str | None:
        """The Prometheus text of ``/metrics``, or None when the server has none (non-200)."""
        resp = await self._get("/metrics")
        return resp.text if resp.status_code == 200 else None

    async def metrics(self) -> dict[str, float] | None:
        """``/metrics`` parsed by :func:`parse_prometheus`, or None."""
        text = await self.metrics_text()
        return parse_prometheus(text) if text is not None else None

    # -- generation ----------------------------------------------------------------------

    def _body(self, *, max_tokens: int, stream: bool, stop: Sequence[str] | None, temperature: float,
              seed: int | None, logprobs: int, ignore_eos: bool, token_ids: bool, chat: bool,
              extra_body: Mapping[str, JsonValue] | None) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"max_tokens": max_tokens, "temperature": temperature, "stream": stream}
        if self.model is not None:
            body["model"] = self.model
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed
        if logprobs > 0:
            if chat:
                body["logprobs"] = True
                body["top_logprobs"] = logprobs
            else:
                body["logprobs"] = logprobs
            # vLLM: logprob keys become "token_id:N", exact ids for every alternative.
            body["return_tokens_as_token_ids"] = True
        if token_ids:
            body["return_token_ids"] = True  # vLLM ≥ 0.10: ids in choices[].token_ids
        if ignore_eos:
            body["ignore_eos"] = True
        if stream:
            body["stream_options"] = {"include_usage": True}
        if extra_body:
            body.update(extra_body)
        return body

    def _apply_rejections(self, body: dict[str, JsonValue], max_tokens: int) -> tuple[list[str], list[str]]:
        """Drop the fields this server rejects; emulate ``ignore_eos`` where it can. Returns (dropped, emulated)."""
        dropped = [k for k in body if k in self.rejected_fields]
        for k in dropped:
            del body[k]
        emulated: list[str] = []
        if ("ignore_eos" in dropped and self.emulate_ignore_eos and "generation_config" not in self.rejected_fields
                and "generation_config" not in body):
            # transformers serve: min_new_tokens masks EOS until max_tokens, which makes the
            # length fixed (see module doc for how that differs from vLLM's ignore_eos).
            body["generation_config"] = json.dumps({"min_new_tokens": max_tokens})
            emulated.append("ignore_eos")
        return dropped, emulated

    def _rejected_in(self, status: int, message: str, body: Mapping[str, JsonValue]) -> set[str]:
        """Optional fields of ``body`` that an error answer says the server does not know."""
        if status not in (400, 422) or not _UNKNOWN_FIELD.search(message):
            return set()
        return {k for k in body if k in OPTIONAL_FIELDS and re.search(rf"\b{re.escape(k)}\b", message)}

    async def completion(self, prompt: str | list[int], *, max_tokens: int = 16, stream: bool = False,
                         stop: Sequence[str] | None = None, temperature: float = 0.0, seed: int | None = None,
                         logprobs: int = 0, ignore_eos: bool = False, token_ids: bool = True,
                         extra_body: Mapping[str, JsonValue] | None = None,
                         timeout_s: float | None = None) -> CompletionResult:
        """``/v1/completions`` for one prompt (text, or token ids where the server takes them).

        ``logprobs``: top-N per generated position (0: none). ``token_ids``: ask for the
        generated ids (vLLM extension; ignored where unsupported). ``extra_body``: more
        fields, sent as given (and overriding the ones above).
        """
        await self.resolve_model()
        body = self._body(max_tokens=max_tokens, stream=stream, stop=stop, temperature=temperature, seed=seed,
                          logprobs=logprobs, ignore_eos=ignore_eos, token_ids=token_ids, chat=False,
                          extra_body=extra_body)
        body["prompt"] = prompt if isinstance(prompt, str) else [t for t in prompt]
        return await self._generate("/v1/completions", body, chat=False, timeout_s=timeout_s)

    async def chat(self, messages: Sequence[Mapping[str, JsonValue]], *, max_tokens: int = 16, stream: bool = False,
                   stop: Sequence[str] | None = None, temperature: float = 0.0, seed: int | None = None,
                   logprobs: int = 0, ignore_eos: bool = False, token_ids: bool = True,
                   extra_body: Mapping[str, JsonValue] | None = None,
                   timeout_s: float | None = None) -> CompletionResult:
        """``/v1/chat/completions`` (the server applies the model's chat template); same options as :meth:`completion`."""
        await self.resolve_model()
        body = self._body(max_tokens=max_tokens, stream=stream, stop=stop, temperature=temperature, seed=seed,
                          logprobs=logprobs, ignore_eos=ignore_eos, token_ids=token_ids, chat=True,
                          extra_body=extra_body)
        body["messages"] = [dict(m) for m in messages]
        return await self._generate("/v1/chat/completions", body, chat=True, timeout_s=timeout_s)

    async def _generate(self, path: str, body: dict[str, JsonValue], *, chat: bool,
                        timeout_s: float | None) -> CompletionResult:
        url = self._url(path)
        given = body.get("max_tokens")  # after extra_body, which may have set it
        max_tokens = int(given) if isinstance(given, (int, float, str)) and given else 0
        dropped_all: list[str] = []
        # Up to three tries: each one only after the server named optional fields it does
        # not know (a server that names them one at a time still converges).
        for _attempt in range(3):
            dropped, emulated = self._apply_rejections(body, max_tokens)
            dropped_all += [d for d in dropped if d not in dropped_all]
            try:
                return await self._deadline(
                    self._send(url, body, chat=chat, dropped=tuple(dropped_all), emulated=tuple(emulated)),
                    timeout_s, url)
            except EndpointStatusError as exc:
                rejected = self._rejected_in(exc.status or 0, exc.server_message, body)
                if not rejected:
                    raise
                self.rejected_fields |= rejected
        raise EndpointStatusError(f"{self.display_url}: the server kept rejecting optional request fields",
                                  status=None, server_message="", url=self.display_url)

    async def _send(self, url: str, body: dict[str, JsonValue], *, chat: bool, dropped: tuple[str, ...],
                    emulated: tuple[str, ...]) -> CompletionResult:
        http = self._client()
        stream = bool(body.get("stream"))
        request = http.build_request("POST", url, json=body, headers=self._headers())
        acc = Accumulator()
        chunks: list[StreamChunk] = []
        done = False
        for attempt in range(2):
            t_send = time.perf_counter()
            try:
                resp = await http.send(request, stream=True)  # returns once the headers are in
                break
            except httpx.HTTPError as exc:
                if attempt == 0 and isinstance(exc, _STALE_CONNECTION):
                    continue  # see _STALE_CONNECTION: once more, on a fresh connection
                raise self._transport_error(exc, url) from exc
        try:
            t_headers = time.perf_counter()
            if resp.status_code != 200:
                try:
                    err_body = await resp.aread()
                except httpx.HTTPError:
                    err_body = b""
                raise self._status_error(resp, err_body, url)
            if not stream:
                try:
                    raw = await resp.aread()
                except httpx.HTTPError as exc:
                    raise self._transport_error(exc, url) from exc
                t_end = time.perf_counter()
                try:
                    data = json.loads(raw)
                except ValueError:
                    raise EndpointProtocolError(
                        f"{self._scrub(url)}: the answer is not JSON: {self._scrub(one_line(raw.decode('utf-8', 'replace'), 120))}",
                        url=self._scrub(url)) from None
                if not isinstance(data, dict) or "choices" not in data:
                    raise EndpointProtocolError(f"{self._scrub(url)}: the answer has no 'choices'", url=self._scrub(url))
                self._fold(acc, data, url, chat=chat, stream=False)
            else:
                try:
                    async for payload, t in _sse_events(resp):
                        if payload == "[DONE]":
                            done = True
                            continue
                        try:
                            data = json.loads(payload)
                        except ValueError:
                            raise EndpointProtocolError(
                                f"{self._scrub(url)}: malformed JSON in a stream event: {self._scrub(one_line(payload, 120))}",
                                url=self._scrub(url)) from None
                        if not isinstance(data, dict):
                            raise EndpointProtocolError(f"{self._scrub(url)}: a stream event is not a JSON object",
                                                        url=self._scrub(url))
                        if "error" in data and "choices" not in data:
                            msg = self._scrub(server_error_message(payload))
                            err = data["error"]
                            code = err.get("code") if isinstance(err, dict) else None
                            raise EndpointStatusError(f"{self._scrub(url)}: error in the stream: {msg}",
                                                      status=code if isinstance(code, int) else None,
                                                      server_message=msg, url=self._scrub(url))
                        text, n_tokens, finish = self._fold(acc, data, url, chat=chat, stream=True)
                        chunks.append(StreamChunk(t=t, text=text, n_tokens=n_tokens, finish_reason=finish))
                except httpx.HTTPError as exc:
                    raise self._transport_error(exc, url, streaming=True) from exc
                t_end = time.perf_counter()
                if not done and acc.finish_reason is None:
                    # transformers serve sends no [DONE] but always a finish_reason; neither
                    # means the stream was cut short (server died or closed early).
                    raise EndpointProtocolError(
                        f"{self._scrub(url)}: the stream ended before the answer was complete "
                        f"(no finish_reason, no [DONE] after {len(chunks)} events)",
                        url=self._scrub(url), hint="the server may have died mid-request; check its log")
        finally:
            await resp.aclose()
        return acc.result(stream=stream, t_send=t_send, t_headers=t_headers, t_end=t_end, chunks=chunks,
                          done_seen=done, dropped_fields=dropped, emulated=emulated)

    def _fold(self, acc: Accumulator, data: Mapping[str, object], url: str, *, chat: bool,
              stream: bool) -> tuple[str, int | None, str | None]:
        """:meth:`Accumulator.add`; an object that is not an answer's shape is a protocol error."""
        try:
            return acc.add(data, chat=chat, stream=stream)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise EndpointProtocolError(f"{self._scrub(url)}: malformed answer ({where}: {err['msg']})",
                                        url=self._scrub(url)) from None

    # -- server-side token counts --------------------------------------------------------

    async def tokenize(self, text: str | None = None, *, messages: Sequence[Mapping[str, JsonValue]] | None = None,
                       timeout_s: float | None = None) -> int | None:
        """Tokens the server counts for ``text`` as a completions prompt (special tokens it adds
        included), or for ``messages`` with its chat template applied; None where the server has
        no ``/tokenize`` (vLLM and SGLang have it at the root, next to ``/health``).

        Learnt once: after a 404/405 (or an answer without a count) the server is not asked again.
        """
        if self.tokenize_unsupported is not None:
            return None
        await self.resolve_model()
        body: dict[str, JsonValue] = {"model": self.model} if self.model is not None else {}
        if messages is not None:
            body.update(messages=[dict(m) for m in messages], add_generation_prompt=True)
        else:
            body.update(prompt=text or "", add_special_tokens=True)
        try:
            data = await self._post_json("/tokenize", body, timeout_s)
        except EndpointStatusError as exc:
            if exc.status in (404, 405, 501):
                self.tokenize_unsupported = f"/tokenize answered HTTP {exc.status}"
                return None
            raise
        count = data.get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            tokens = data.get("tokens")
            count = len(tokens) if isinstance(tokens, list) else None
        if count is None:
            self.tokenize_unsupported = "/tokenize answered without a count"
        return count

    # -- teacher-forced scoring ----------------------------------------------------------

    async def _post_json(self, path: str, body: Mapping[str, JsonValue],
                         timeout_s: float | None) -> dict[str, JsonValue]:
        """POST ``body``; the answer's JSON object, or an :class:`EndpointError` (status errors included)."""
        url = self._url(path)

        async def go() -> dict[str, JsonValue]:
            http = self._client()
            for attempt in range(2):
                try:
                    resp = await http.post(url, json=dict(body), headers=self._headers())
                    break
                except httpx.HTTPError as exc:
                    if attempt == 0 and isinstance(exc, _STALE_CONNECTION):
                        continue  # see _STALE_CONNECTION
                    raise self._transport_error(exc, url) from exc
            if resp.status_code != 200:
                raise self._status_error(resp, resp.content, url)
            try:
                data: JsonValue = resp.json()  # what json.loads builds is JSON values by construction
            except ValueError:
                raise EndpointProtocolError(
                    f"{self._scrub(url)}: the answer is not JSON: {self._scrub(one_line(resp.text, 120))}",
                    url=self._scrub(url)) from None
            if not isinstance(data, dict):
                raise EndpointProtocolError(f"{self._scrub(url)}: the answer is not a JSON object", url=self._scrub(url))
            return data

        return await self._deadline(go(), timeout_s, url)

    async def score(self, prompt_ids: Sequence[int], *, top_k: int = 20,
                    timeout_s: float | None = None) -> ScoreResult:
        """Logprobs of each token of ``prompt_ids`` given the ones before it (nothing generated).

        First ``/v1/completions`` with vLLM's ``prompt_logprobs: K``; where the server
        rejects or ignores it, legacy ``echo: true`` + ``logprobs: K`` with
        ``return_tokens_as_token_ids`` (exact ids; text-keyed logprobs cannot be matched to
        the given ids). The way that worked is kept for later calls. Raises
        :class:`~adaptcheck.frameworks.base.ScoringUnsupported` with what the server said
        when neither gives per-position logprobs of the given ids; transport errors, 5xx
        answers and malformed answers are :class:`EndpointError` as elsewhere.
        """
        ids = [int(t) for t in prompt_ids]
        if len(ids) < 2:
            raise FrameworkError(f"cannot score a {len(ids)}-token prompt: at least 2 tokens are needed")
        if self.score_unsupported is not None:
            raise ScoringUnsupported(self.score_unsupported)
        await self.resolve_model()
        reasons: list[str] = []
        for method in ("prompt_logprobs", "echo"):
            if self.score_method not in (None, method):
                continue
            try:
                result = await (self._score_prompt_logprobs(ids, top_k, timeout_s) if method == "prompt_logprobs"
                                else self._score_echo(ids, top_k, timeout_s))
            except NotScored as exc:
                if self.score_method == method:
                    # It worked before on this server: an answer without scores now is a defect.
                    raise EndpointProtocolError(f"{self.display_url}: {exc.reason} (it scored earlier requests)",
                                                url=self.display_url) from None
                reasons.append(exc.reason)
                continue
            self.score_method = method
            return result
        self.score_unsupported = "the server " + " and ".join(reasons)
        raise ScoringUnsupported(self.score_unsupported)

    def _score_body(self, ids: list[int], **fields: JsonValue) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"prompt": [t for t in ids], "max_tokens": 1, "temperature": 0.0, **fields}
        if self.model is not None:
            body["model"] = self.model
        return body

    async def _score_prompt_logprobs(self, ids: list[int], top_k: int, timeout_s: float | None) -> ScoreResult:
        k = top_k
        notes: list[str] = []
        for _attempt in range(2):
            try:
                data = await self._post_json("/v1/completions", self._score_body(ids, prompt_logprobs=k), timeout_s)
                break
            except EndpointStatusError as exc:
                cap = logprobs_cap(exc.server_message) if refusal(exc) else None
                if cap is not None and 0 < cap < k:
                    # vLLM: "Requested prompt logprobs of 30, which is greater than max allowed: 20".
                    notes.append(f"top_k lowered from {k} to the server's max_logprobs {cap}")
                    k = cap
                    continue
                if refusal(exc):
                    raise NotScored(f"rejects prompt_logprobs ({exc.status}: {exc.server_message})") from None
                raise
        else:
            raise NotScored("rejects prompt_logprobs at every K tried")
        choice = first_choice(data)
        entries = choice.get("prompt_logprobs") if choice is not None else None
        if entries is None:
            raise NotScored("ignores prompt_logprobs (the answer has no choices[0].prompt_logprobs)")
        if not isinstance(entries, list) or len(entries) < len(ids):
            raise EndpointProtocolError(
                f"{self.display_url}: prompt_logprobs cover {len(entries) if isinstance(entries, list) else 0} "
                f"positions, not the {len(ids)}-token prompt", url=self.display_url)
        tops: list[dict[int, float] | None] = [None]
        lps: list[float | None] = [None]
        for pos in range(1, len(ids)):
            top = self._id_logprobs(entries[pos], pos)
            if ids[pos] not in top:
                raise EndpointProtocolError(f"{self.display_url}: prompt_logprobs at position {pos} lack the "
                                            f"prompt's own token {ids[pos]}", url=self.display_url)
            tops.append(top)
            lps.append(top[ids[pos]])
        return ScoreResult(method="prompt_logprobs", token_logprobs=lps, top_logprobs=tops, top_k=k, notes=notes)

    def _id_logprobs(self, entry: JsonValue, pos: int) -> dict[int, float]:
        """vLLM's ``{"123": {"logprob", "rank", "decoded_token"}}`` (or ``{"123": -0.5}``) -> {123: -0.5}."""
        if not isinstance(entry, dict) or len(entry) > MAX_SCORE_ALTERNATIVES:
            raise EndpointProtocolError(f"{self.display_url}: prompt_logprobs entry {pos} is not a token-id map",
                                        url=self.display_url)
        out: dict[int, float] = {}
        for key, value in entry.items():
            tid = int_key(key)
            lp = finite(value.get("logprob") if isinstance(value, dict) else value)
            if tid is None or math.isnan(lp):
                raise EndpointProtocolError(f"{self.display_url}: prompt_logprobs entry {pos} has "
                                            f"{self._scrub(one_line(repr(key), 40))} -> unreadable logprob",
                                            url=self.display_url)
            out[tid] = lp
        return out

    async def _score_echo(self, ids: list[int], top_k: int, timeout_s: float | None) -> ScoreResult:
        fields: dict[str, JsonValue] = {"echo": True, "logprobs": top_k, "return_tokens_as_token_ids": True}
        notes: list[str] = []
        for _attempt in range(2):
            try:
                data = await self._post_json("/v1/completions", self._score_body(ids, **fields), timeout_s)
                break
            except EndpointStatusError as exc:
                if not refusal(exc):
                    raise
                named = self._rejected_in(exc.status or 0, exc.server_message, fields)
                if named == {"return_tokens_as_token_ids"} and "return_tokens_as_token_ids" in fields:
                    del fields["return_tokens_as_token_ids"]  # try echo alone: ids may still come back
                    notes.append("the server rejects return_tokens_as_token_ids")
                    continue
                raise NotScored(f"rejects echo ({exc.status}: {exc.server_message})") from None
        else:
            raise NotScored("rejects echo")
        choice = first_choice(data)
        lp = choice.get("logprobs") if choice is not None else None
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        if not isinstance(tokens, list) or len(tokens) < len(ids):
            got = len(tokens) if isinstance(tokens, list) else 0
            raise NotScored(f"ignores echo (its logprobs cover {got} tokens, not the {len(ids)}-token prompt)")
        echoed = [token_id(str(t)) for t in tokens[: len(ids)]]
        if any(t is None for t in echoed):
            raise NotScored("names echoed tokens by text, not by id (no return_tokens_as_token_ids), "
                             "so its logprobs cannot be matched to the given ids")
        if echoed != ids:
            first = next(i for i, (a, b) in enumerate(zip(echoed, ids, strict=True)) if a != b)
            raise NotScored(f"echoes other tokens than the given ids (position {first}: {echoed[first]} "
                             f"for {ids[first]})")
        token_lps = lp.get("token_logprobs") if isinstance(lp, dict) else None
        top_lps = lp.get("top_logprobs") if isinstance(lp, dict) else None
        if not isinstance(token_lps, list) or not isinstance(top_lps, list) or min(len(token_lps), len(top_lps)) < len(ids):
            raise NotScored("gives no per-token logprobs with echo")
        tops: list[dict[int, float] | None] = [None]
        lps: list[float | None] = [None]
        for pos in range(1, len(ids)):
            entry = top_lps[pos]
            if not isinstance(entry, dict) or len(entry) > MAX_SCORE_ALTERNATIVES:
                raise EndpointProtocolError(f"{self.display_url}: echo top_logprobs entry {pos} is not a map",
                                            url=self.display_url)
            top: dict[int, float] = {}
            for key, value in entry.items():
                tid = token_id(str(key))
                if tid is None:
                    raise NotScored("names echoed alternatives by text, not by id")
                top[tid] = finite(value)
            own = finite(token_lps[pos])
            if math.isnan(own):
                raise EndpointProtocolError(f"{self.display_url}: echo token_logprobs[{pos}] is not a number",
                                            url=self.display_url)
            top.setdefault(ids[pos], own)  # the contract: the scored token is always in its top dict
            tops.append(top)
            lps.append(own)
        return ScoreResult(method="echo", token_logprobs=lps, top_logprobs=tops, top_k=top_k, notes=notes)

    # -- capabilities --------------------------------------------------------------------

    async def probe_capabilities(self, prompt: str = "Hello") -> Capabilities:
        """Find out what the server takes and gives, with a few 2-token requests.

        Also teaches this client which optional fields to leave out, so call it before a
        timed run: the first request after a rejection is sent twice.
        """
        await self.resolve_model()
        completions = True
        token_ids = logprobs = False
        fingerprint: str | None = None
        ignore_eos = "no"
        try:
            r = await self.completion(prompt, max_tokens=2, logprobs=2, ignore_eos=True, seed=0)
            token_ids = r.token_ids is not None
            logprobs = r.top_logprobs is not None or r.top_logprobs_text is not None
            fingerprint = r.system_fingerprint
            ignore_eos = "emulated" if "ignore_eos" in r.emulated else (
                "no" if "ignore_eos" in r.dropped_fields else "native")
        except EndpointStatusError as exc:
            if exc.status not in (404, 405):
                raise
            completions = False
        done_marker = stream_usage = False
        chat = True
        try:
            if completions:
                s = await self.completion(prompt, max_tokens=2, stream=True)
            else:
                s = await self.chat([{"role": "user", "content": prompt}], max_tokens=2, stream=True)
            done_marker, stream_usage = s.done_seen, s.completion_tokens is not None
            if not completions:
                token_ids, fingerprint = s.token_ids is not None, s.system_fingerprint
        except EndpointStatusError as exc:
            if completions:
                raise
            chat = exc.status not in (404, 405) and chat
        if completions:
            try:
                await self.chat([{"role": "user", "content": prompt}], max_tokens=1)
            except EndpointStatusError:
                chat = False  # no route, or no chat template for this model
        try:
            metrics = await self.metrics_text() is not None
        except EndpointError:
            metrics = False
        return Capabilities(completions=completions, chat=chat, rejected_fields=frozenset(self.rejected_fields),
                            token_ids=token_ids, logprobs=logprobs, stream_done_marker=done_marker,
                            stream_usage=stream_usage, ignore_eos=ignore_eos, metrics=metrics,
                            system_fingerprint=fingerprint)


async def _sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str, float]]:
    """``data:`` payloads of a server-sent-event stream, each with its arrival time.

    One event is one ``data:`` line here: OpenAI-style servers never split an event over
    several ``data:`` lines. Comments (``:``), ``event:``/``id:`` lines and blank lines are
    skipped. The time is taken when the line is complete, before any JSON parsing.
    """
    async for line in resp.aiter_lines():
        t = time.perf_counter()
        if not line.startswith("data:"):
            continue
        yield line[5:].strip(), t
