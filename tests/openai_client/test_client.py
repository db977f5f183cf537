"""The OpenAI-compatible client against real servers.

Against ``vllm serve`` and ``transformers serve`` (session fixtures from ``tests/servers.py``
on the tiny synthetic Llama): completions and chat, streamed or not, ``max_tokens``, EOS,
``ignore_eos``, stop strings, usage, token ids and logprobs, and each server's quirks.
Against small real HTTP servers written here (``http.server`` in a thread) that misbehave
on purpose: a stream cut mid-way, bad JSON, silence, an error status that echoes the
request's credentials. A closed port for an unreachable endpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from adaptcheck.base.errors import AdaptcheckError, ExitCode
from adaptcheck.base.procs import free_port
from adaptcheck.frameworks.base import FrameworkError
from adaptcheck.frameworks.server import ManagedServer
from adaptcheck.frameworks.synthetic import synthetic_info
from adaptcheck.openai_client.client import AsyncOpenAIClient
from adaptcheck.openai_client.errors import (
    EndpointError,
    EndpointProtocolError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
)
from adaptcheck.openai_client.metrics import metric_total, parse_prometheus
from adaptcheck.openai_client.parsing import normalize_base_url, server_error_message
from adaptcheck.openai_client.records import CompletionResult
from adaptcheck.openai_client.sync import OpenAIClient

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

KINDS = ["vllm", "transformers"]


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest) -> ManagedServer:
    """Each test using this runs against both real servers (started once per session)."""
    srv: ManagedServer = request.getfixturevalue(f"{request.param}_server")
    return srv


@pytest.fixture
def client(server: ManagedServer) -> OpenAIClient:
    return server.client(timeout_s=120)


def _probes(server: ManagedServer) -> dict[str, Any]:
    info = synthetic_info(server.spec.model_path)
    assert info is not None
    return info


def _long_prompt(server: ManagedServer) -> str:
    """A prompt whose greedy continuation runs ≥ 24 tokens without EOS (the stop probe)."""
    return str(_probes(server)["stop_probe"]["prompt"])


# --------------------------------------------------------------------------------------
# Against both real servers
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_completion_honours_max_tokens(client: OpenAIClient, server: ManagedServer, stream: bool) -> None:
    r = client.completion(_long_prompt(server), max_tokens=6, stream=stream)
    assert r.finish_reason == "length"
    assert r.completion_tokens == 6
    assert r.prompt_tokens is not None and r.prompt_tokens > 0
    assert r.text
    assert r.stream is stream
    assert r.t_send < r.t_headers <= r.t_end


@pytest.mark.parametrize("api", ["completion", "chat"])
def test_stream_text_equals_non_stream_text(client: OpenAIClient, server: ManagedServer, api: str) -> None:
    """Greedy: the streamed chunks join to exactly the non-streamed text, with the same usage."""
    def ask(stream: bool) -> CompletionResult:
        if api == "completion":
            return client.completion(_long_prompt(server), max_tokens=12, stream=stream)
        return client.chat([{"role": "user", "content": "Tell me about trains."}], max_tokens=12, stream=stream)

    plain, streamed = ask(False), ask(True)
    assert streamed.text == plain.text
    assert streamed.text == "".join(c.text for c in streamed.chunks)
    assert streamed.finish_reason == plain.finish_reason
    # Usage in the stream: vLLM with stream_options.include_usage, transformers always.
    assert streamed.completion_tokens == plain.completion_tokens
    assert streamed.prompt_tokens == plain.prompt_tokens


def test_stream_timings_are_recorded(client: OpenAIClient, server: ManagedServer) -> None:
    r = client.completion(_long_prompt(server), max_tokens=16, stream=True)
    content = r.content_chunks
    assert content, "no content chunk"
    times = [c.t for c in r.chunks]
    assert times == sorted(times)
    assert r.t_send < times[0] <= r.t_end
    assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2el_s
    assert len(r.itl_s) == len(content) - 1 and all(g >= 0 for g in r.itl_s)
    assert r.completion_tokens == 16
    # A chunk may carry several tokens (transformers batches queued ones; vLLM holds back
    # incomplete UTF-8), never fewer than one.
    assert 1 <= r.num_content_chunks <= 16
    assert r.tpot_s is not None and r.tpot_s >= 0


def test_stream_end_marker_is_per_server(client: OpenAIClient, server: ManagedServer) -> None:
    """vLLM ends with ``data: [DONE]``; transformers does not, and that is a complete stream too."""
    r = client.completion(_long_prompt(server), max_tokens=3, stream=True)
    assert r.done_seen is (server.spec.kind == "vllm")
    assert r.finish_reason == "length"


def test_eos_and_ignore_eos(client: OpenAIClient, server: ManagedServer) -> None:
    """The EOS probe prompt ends early; ignore_eos (native on vLLM, emulated on transformers) runs to max_tokens."""
    prompt = _probes(server)["eos_probe_prompt"]
    ended = client.completion(prompt, max_tokens=12)
    assert ended.finish_reason == "stop"
    assert ended.completion_tokens is not None and ended.completion_tokens < 12
    forced = client.completion(prompt, max_tokens=12, ignore_eos=True)
    assert forced.finish_reason == "length"
    assert forced.completion_tokens == 12
    if server.spec.kind == "vllm":
        assert forced.emulated == () and forced.dropped_fields == ()
    else:
        assert forced.emulated == ("ignore_eos",)
        assert "ignore_eos" in forced.dropped_fields


def test_stop_string(client: OpenAIClient, server: ManagedServer) -> None:
    """Stop strings end generation; vLLM leaves the string out (OpenAI), transformers keeps it."""
    probe = _probes(server)["stop_probe"]
    r = client.completion(probe["prompt"], max_tokens=probe["max_tokens"], stop=[probe["stop"]])
    assert r.finish_reason == "stop"
    if server.spec.kind == "vllm":
        assert r.text == probe["text_before_stop"]
        assert r.stop_reason == probe["stop"]
    else:
        assert r.text == probe["text_before_stop"] + probe["stop"]


def test_async_client_concurrent_requests(server: ManagedServer) -> None:
    async def go() -> list[CompletionResult]:
        async with server.async_client(timeout_s=120) as c:
            return await asyncio.gather(*(c.completion(_long_prompt(server), max_tokens=4 + i, stream=True)
                                          for i in range(4)))

    results = asyncio.run(go())
    assert [r.completion_tokens for r in results] == [4, 5, 6, 7]
    alone = server.client(timeout_s=120)
    for r, n in zip(results, [4, 5, 6, 7], strict=True):  # greedy: batched answers equal lone ones
        assert r.text == alone.completion(_long_prompt(server), max_tokens=n).text


def test_capability_probe(server: ManagedServer) -> None:
    caps = server.client().probe_capabilities()
    assert caps.completions and caps.chat
    assert caps.stream_usage
    if server.spec.kind == "vllm":
        assert caps.rejected_fields == frozenset()
        assert caps.token_ids and caps.logprobs
        assert caps.stream_done_marker and caps.metrics
        assert caps.ignore_eos == "native"
        assert caps.system_fingerprint and caps.system_fingerprint.startswith("vllm")
    else:
        assert {"ignore_eos", "return_token_ids", "return_tokens_as_token_ids"} <= caps.rejected_fields
        assert not caps.token_ids and not caps.logprobs  # accepted, ignored
        assert not caps.stream_done_marker and not caps.metrics
        assert caps.ignore_eos == "emulated"


# --------------------------------------------------------------------------------------
# vLLM only
# --------------------------------------------------------------------------------------

def test_vllm_token_ids_and_logprobs(vllm_server: ManagedServer) -> None:
    c = vllm_server.client(timeout_s=120)
    prompt = _long_prompt(vllm_server)
    plain = c.completion(prompt, max_tokens=8, logprobs=3)
    assert plain.token_ids is not None and len(plain.token_ids) == plain.completion_tokens == 8
    assert plain.prompt_token_ids and len(plain.prompt_token_ids) == plain.prompt_tokens
    # return_tokens_as_token_ids: logprob keys are ids; the chosen token is in each top-N.
    assert plain.top_logprobs is not None and len(plain.top_logprobs) == 8
    for chosen, top, lp in zip(plain.token_ids, plain.top_logprobs, plain.token_logprobs or [], strict=True):
        assert len(top) >= 3 and chosen in top and top[chosen] == pytest.approx(lp)
    # The same ids by the logprob route alone, and streamed chunk by chunk.
    by_logprobs = c.completion(prompt, max_tokens=8, logprobs=1, token_ids=False)
    assert by_logprobs.token_ids == plain.token_ids
    streamed = c.completion(prompt, max_tokens=8, stream=True)
    assert streamed.token_ids == plain.token_ids
    assert sum(ch.n_tokens or 0 for ch in streamed.chunks) == 8
    # Chat: ids and top logprobs too.
    chat = c.chat([{"role": "user", "content": "Hi"}], max_tokens=5, logprobs=2, ignore_eos=True)
    assert chat.token_ids is not None and len(chat.token_ids) == 5
    assert chat.top_logprobs is not None and all(t in top for t, top in zip(chat.token_ids, chat.top_logprobs,
                                                                             strict=True))


def test_vllm_models_and_metrics(vllm_server: ManagedServer) -> None:
    c = OpenAIClient(vllm_server.base_url)  # no model given: taken from /v1/models
    assert c.models() == ["tiny-llama"]
    r = c.completion("Hello", max_tokens=2)
    assert r.model == "tiny-llama" and c.model == "tiny-llama"
    text = c.metrics_text()
    assert text is not None and "# TYPE" in text
    samples = parse_prometheus(text)
    assert metric_total(samples, "vllm:num_requests_running") == 0.0
    generated = metric_total(samples, "vllm:generation_tokens_total")
    assert generated is not None and generated >= 2


def test_vllm_error_status_is_one_line(vllm_server: ManagedServer) -> None:
    c = vllm_server.client()
    with pytest.raises(EndpointStatusError) as info:
        c.completion("Hello", max_tokens=100_000)
    err = info.value
    assert err.status == 400
    assert "max_tokens" in err.server_message and "\n" not in err.one_line()
    with pytest.raises(EndpointStatusError) as info:
        OpenAIClient(vllm_server.base_url, model="no-such-model").completion("Hello", max_tokens=1)
    assert info.value.status == 404 and "check the model name" in info.value.one_line()


# --------------------------------------------------------------------------------------
# transformers only
# --------------------------------------------------------------------------------------

def test_transformers_rejects_unknown_fields_with_422(transformers_server: ManagedServer) -> None:
    """An unknown non-optional field stays an error (422, the server's words kept)."""
    c = transformers_server.client()
    with pytest.raises(EndpointStatusError) as info:
        c.completion("Hello", max_tokens=2, extra_body={"bogus_field": 1})
    assert info.value.status == 422
    assert "bogus_field" in info.value.server_message


def test_transformers_optional_fields_dropped_and_remembered(transformers_server: ManagedServer) -> None:
    c = transformers_server.client()
    first = c.completion("Hello", max_tokens=3, logprobs=2, seed=7)
    assert set(first.dropped_fields) == {"return_token_ids", "return_tokens_as_token_ids"}
    assert first.token_ids is None and first.top_logprobs is None  # logprobs accepted but ignored
    assert first.completion_tokens == 3
    assert {"return_token_ids", "return_tokens_as_token_ids"} <= c.rejected_fields
    again = c.completion("Hello", max_tokens=3)
    assert again.text == first.text
    assert again.dropped_fields == ("return_token_ids",)  # left out up front this time


def test_transformers_model_is_optional(transformers_server: ManagedServer) -> None:
    """/v1/models lists the HF cache (or fails): a client without a model leaves it out."""
    c = OpenAIClient(transformers_server.base_url)
    r = c.completion("Hello", max_tokens=2)
    assert c.model is None and r.completion_tokens == 2
    assert r.model is not None and r.model.startswith(str(transformers_server.spec.model_path))
    assert c.metrics_text() is None  # no /metrics


# --------------------------------------------------------------------------------------
# Unreachable, misbehaving and hostile servers
# --------------------------------------------------------------------------------------

def test_unreachable_endpoint_is_one_line_and_quick() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(EndpointUnreachable) as info:
        OpenAIClient(f"http://127.0.0.1:{port}", model="m").completion("Hi", max_tokens=1)
    assert time.monotonic() - t0 < 5
    err = info.value
    assert err.one_line() == (f"cannot reach http://127.0.0.1:{port}/v1: connection refused "
                              "(is the server running? check --endpoint)")
    assert isinstance(err, AdaptcheckError) and isinstance(err, FrameworkError)
    assert err.exit_code == ExitCode.DEVICE
    with pytest.raises(EndpointUnreachable):
        OpenAIClient(f"http://127.0.0.1:{port}").models()


def test_wait_ready_gives_up_when_process_dies() -> None:
    port = free_port()
    t0 = time.monotonic()
    from adaptcheck.openai_client.errors import EndpointNotReady

    flags = iter([True, True, False])
    with pytest.raises(EndpointNotReady) as info:
        OpenAIClient(f"http://127.0.0.1:{port}").wait_ready(60, alive=lambda: next(flags), interval_s=0.05)
    assert info.value.process_exited and time.monotonic() - t0 < 5
    with pytest.raises(EndpointNotReady) as info:
        OpenAIClient(f"http://127.0.0.1:{port}").wait_ready(0.3, interval_s=0.05)
    assert not info.value.process_exited and "not ready within 0.3 s" in str(info.value)


Handler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def fake_server() -> Iterator[Callable[[Handler], str]]:
    """A real HTTP server on 127.0.0.1 whose POST/GET answer is the given function."""
    servers: list[ThreadingHTTPServer] = []

    def start(handle: Handler) -> str:
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.body = json.loads(self.rfile.read(length) or b"{}")
                handle(self)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _sse_head(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Connection", "close")
    h.end_headers()


def _event(text: str, finish: str | None = None) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}).encode() + b"\n\n"


def test_server_dying_mid_stream_is_a_protocol_error(fake_server: Callable[[Handler], str]) -> None:
    def half_stream(h: BaseHTTPRequestHandler) -> None:
        _sse_head(h)
        h.wfile.write(_event("Hel") + _event("lo"))
        h.wfile.flush()
        h.close_connection = True  # and close: no finish_reason, no [DONE]

    url = fake_server(half_stream)
    t0 = time.monotonic()
    with pytest.raises(EndpointProtocolError) as info:
        OpenAIClient(url, model="m", timeout_s=30).completion("Hi", max_tokens=8, stream=True)
    assert time.monotonic() - t0 < 5
    assert "ended before the answer was complete" in str(info.value)
    assert "mid-request" in info.value.one_line()


def test_connection_dropped_mid_chunked_body(fake_server: Callable[[Handler], str]) -> None:
    """A chunked stream whose connection drops inside the body (the server process died)."""
    def dies(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        data = _event("Hel")
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.write(b"40\r\ndata: {\"choi")  # a chunk announced, cut short
        h.wfile.flush()
        h.connection.shutdown(2)

    with pytest.raises(EndpointProtocolError) as info:
        OpenAIClient(fake_server(dies), model="m", timeout_s=30).completion("Hi", max_tokens=8, stream=True)
    assert "closed mid-response" in str(info.value)


def test_stale_keep_alive_connection_is_retried(fake_server: Callable[[Handler], str]) -> None:
    """uvicorn's way after an unhandled error: a 500 without ``Connection: close``, then the socket closes."""
    seen: list[str] = []

    def flaky(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.command)
        if h.command == "GET":
            payload = b"Internal Server Error"
            h.send_response(500)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            h.wfile.flush()
            h.close_connection = True  # closes the keep-alive connection the client pooled
            return
        payload = b'{"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]}'
        h.send_response(200)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    c = OpenAIClient(fake_server(flaky))  # no model: asks /v1/models first (the 500), then POSTs
    assert c.completion("Hi").text == "ok"
    assert c.model is None and seen[0] == "GET" and seen[-1] == "POST"


def test_server_closing_without_answer_is_a_protocol_error(fake_server: Callable[[Handler], str]) -> None:
    """Closed before any response byte, twice (the one retry included): an error, not a hang."""
    seen: list[str] = []

    def hang_up(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.command)
        h.close_connection = True

    with pytest.raises(EndpointProtocolError, match="closed mid-response"):
        OpenAIClient(fake_server(hang_up), model="m", timeout_s=30).completion("Hi")
    assert seen == ["POST", "POST"]


def test_malformed_json_in_stream_and_body(fake_server: Callable[[Handler], str]) -> None:
    def bad_event(h: BaseHTTPRequestHandler) -> None:
        _sse_head(h)
        h.wfile.write(_event("ok") + b"data: {not json\n\n")
        h.close_connection = True

    with pytest.raises(EndpointProtocolError, match="malformed JSON"):
        OpenAIClient(fake_server(bad_event), model="m").completion("Hi", stream=True)

    def bad_body(h: BaseHTTPRequestHandler) -> None:
        payload = b"<html>oops</html>"
        h.send_response(200)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    with pytest.raises(EndpointProtocolError, match="not JSON"):
        OpenAIClient(fake_server(bad_body), model="m").completion("Hi")


def test_error_event_in_stream(fake_server: Callable[[Handler], str]) -> None:
    def err(h: BaseHTTPRequestHandler) -> None:
        _sse_head(h)
        h.wfile.write(_event("a") + b'data: {"error": "CUDA out of memory"}\n\n')
        h.close_connection = True

    with pytest.raises(EndpointStatusError, match="CUDA out of memory") as info:
        OpenAIClient(fake_server(err), model="m").completion("Hi", stream=True)
    assert info.value.status is None


def test_silent_server_times_out(fake_server: Callable[[Handler], str]) -> None:
    def silent(h: BaseHTTPRequestHandler) -> None:
        _sse_head(h)
        h.wfile.write(_event("a"))
        h.wfile.flush()
        time.sleep(3)

    t0 = time.monotonic()
    with pytest.raises(EndpointTimeout):
        OpenAIClient(fake_server(silent), model="m", timeout_s=0.5).completion("Hi", stream=True)
    assert time.monotonic() - t0 < 2.5


def test_stream_without_done_but_with_finish_reason_is_complete(fake_server: Callable[[Handler], str]) -> None:
    """The transformers shape: no [DONE], usage in the finishing chunk, several events in one write."""
    def tf_like(h: BaseHTTPRequestHandler) -> None:
        _sse_head(h)
        h.wfile.write(_event("a") + _event("b"))
        h.wfile.flush()
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 3}}
        h.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        h.close_connection = True

    r = OpenAIClient(fake_server(tf_like), model="m").completion("Hi", stream=True)
    assert (r.text, r.finish_reason, r.completion_tokens, r.done_seen) == ("ab", "length", 3, False)
    assert r.num_content_chunks == 2 and len(r.chunks) == 3


SECRET = "sk-adaptcheck-test-5ecret-value-0123456789"


def test_api_key_is_sent_but_never_leaks(fake_server: Callable[[Handler], str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ADAPTCHECK_API_KEY", SECRET)
    seen: list[str] = []

    def echo_auth(h: BaseHTTPRequestHandler) -> None:
        auth = h.headers.get("Authorization", "")
        seen.append(auth)
        # A hostile (or merely careless) server echoes the credentials in its error.
        payload = json.dumps({"error": {"message": f"bad key {auth} for {SECRET}"}}).encode()
        h.send_response(401)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    url = fake_server(echo_auth)
    c = OpenAIClient(url, model="m")
    with pytest.raises(EndpointStatusError) as info:
        c.completion("Hi", max_tokens=1)
    assert seen == [f"Bearer {SECRET}"]
    err = info.value
    texts = [str(err), repr(err), err.one_line(), err.server_message, repr(err.args), repr(c), str(vars(err))]
    assert all(SECRET not in t for t in texts), texts
    assert "ADAPTCHECK_API_KEY" in err.one_line()  # the hint says where the key comes from

    # A short key (below the generic scrubber's length) is still removed.
    monkeypatch.setenv("ADAPTCHECK_API_KEY", "k3y")
    with pytest.raises(EndpointStatusError) as info:
        OpenAIClient(url, model="m").completion("Hi", max_tokens=1)
    assert seen[-1] == "Bearer k3y" and "k3y" not in str(info.value)

    # OPENAI_API_KEY is the fallback.
    monkeypatch.delenv("ADAPTCHECK_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "-openai")
    with pytest.raises(EndpointStatusError):
        OpenAIClient(url, model="m").completion("Hi", max_tokens=1)
    assert seen[-1] == f"Bearer {SECRET}-openai"


def test_api_key_not_in_records(fake_server: Callable[[Handler], str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTCHECK_API_KEY", SECRET)

    def ok(h: BaseHTTPRequestHandler) -> None:
        if getattr(h, "body", {}).get("stream"):
            _sse_head(h)
            h.wfile.write(_event("hi", "stop") + b"data: [DONE]\n\n")
            h.close_connection = True
            return
        payload = json.dumps({"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
        h.send_response(200)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    c = OpenAIClient(fake_server(ok), model="m")
    for stream in (False, True):
        r = c.completion("Hi", stream=stream)
        assert r.text == "hi" and SECRET not in repr(r)
    assert SECRET not in repr(c) and SECRET not in repr(c.aio)


def test_sync_client_inside_a_running_event_loop(fake_server: Callable[[Handler], str]) -> None:
    def ok(h: BaseHTTPRequestHandler) -> None:
        payload = b'{"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}'
        h.send_response(200)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    url = fake_server(ok)

    async def inside() -> str:
        return OpenAIClient(url, model="m").completion("Hi").text

    assert asyncio.run(inside()) == "x"


# --------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("given", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/", "h:8000"])
def test_normalize_base_url(given: str) -> None:
    assert normalize_base_url(given) == "http://h:8000/v1"


def test_parse_prometheus() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m",engine="0"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3\n'
        "process_cpu_seconds_total 9.26 1700000000000\n"
        'weird{path="a\\"b,c}"} NaN\n'
        'h_bucket{le="+Inf"} +Inf\n'
        "garbage line\n"
    )
    s = parse_prometheus(text)
    assert s['vllm:num_requests_running{engine="0",model_name="m"}'] == 2.0  # labels sorted
    assert s["process_cpu_seconds_total"] == 9.26  # timestamp dropped
    assert metric_total(s, "vllm:num_requests_running") == 5.0
    assert metric_total(s, "absent") is None
    assert s['weird{path="a\\"b,c}"}'] != s['weird{path="a\\"b,c}"}']  # NaN kept
    assert s['h_bucket{le="+Inf"}'] == float("inf")


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"error": {"message": "max_tokens too big", "code": 400}}', "max_tokens too big"),
    (b'{"object": "error", "message": "old vllm"}', "old vllm"),
    (b'{"detail": "Unexpected fields in the request: {\'ignore_eos\'}"}', "Unexpected fields in the request: {'ignore_eos'}"),
    (b'{"detail": [{"loc": ["body", "prompt"], "msg": "field required"}]}', "body.prompt: field required"),
    (b"Internal Server Error", "Internal Server Error"),
    (b"line one\nline two", "line one line two"),
])
def test_server_error_message_shapes(body: bytes, expected: str) -> None:
    assert server_error_message(body) == expected


def test_long_server_message_is_shortened() -> None:
    assert len(server_error_message(b"x" * 5000)) <= 300


def test_endpoint_error_is_scrubbed_of_environment_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123")
    err = EndpointError(f"server said {os.environ['HF_TOKEN']}")
    assert "hf_abcdef" not in str(err)


def test_repr_without_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADAPTCHECK_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert "api_key=unset" in repr(AsyncOpenAIClient("http://u:p@h:1"))
    assert "u:p" not in repr(AsyncOpenAIClient("http://u:p@h:1"))
