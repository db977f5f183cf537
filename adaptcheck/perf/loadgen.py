"""The serving load generator: drives any OpenAI-compatible streaming endpoint run by run
(warm-up, then the measured window by arrival pattern), times each request honestly and
records it; nothing hangs (per-request and per-run deadlines, a dead or hung server stops the
run). How a run goes: docs/perf.md, "The load generator".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import JsonValue

from adaptcheck.base.errors import exception_line
from adaptcheck.base.schemas.serving_evidence import RunSummary
from adaptcheck.openai_client.client import AsyncOpenAIClient
from adaptcheck.openai_client.errors import (
    EndpointError,
    EndpointStatusError,
    EndpointTimeout,
    EndpointUnreachable,
)
from adaptcheck.openai_client.load_stream import StreamClient
from adaptcheck.openai_client.records import CompletionResult
from adaptcheck.perf.arrival import Arrival
from adaptcheck.perf.gcguard import HeapFreeze
from adaptcheck.perf.monitors import ClientMonitor, ClientStats, ServerSampler
from adaptcheck.perf.serving_metrics import RequestRecord, summarize_run
from adaptcheck.perf.workload import PreparedRequest, Workload

API = Literal["completions", "chat"]
ARRIVALS: tuple[Arrival, ...] = tuple(Arrival)
UNREACHABLE_ABORT = 3
"""Consecutive refused connections after which the server is taken for dead."""
MAX_ERROR_TEXT = 200


@dataclass(frozen=True)
class RunConfig:
    """How one run drives the server."""

    arrival: Arrival
    """The pattern; its name ('poisson') is accepted too and turned into the type."""
    level: float
    """Concurrency (burst: requests sent at once; poisson: rate in req/s)."""
    num_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    request_timeout_s: float = 60.0
    run_timeout_s: float | None = None
    """Deadline of the measured window; None: derived (see :meth:`deadline_s`)."""
    ignore_eos: bool = True
    arrival_seed: int = 0
    sample_server: bool = True
    """Sample the server's KV-cache gauge during the window (off for client comparisons)."""

    def __post_init__(self) -> None:
        arrival = Arrival.parse(self.arrival)
        if arrival is None:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, not {self.arrival!r}")
        # Callers may pass the pattern's name ('poisson'): kept as the type, so what follows asks it.
        object.__setattr__(self, "arrival", arrival)
        if self.level <= 0:
            raise ValueError("level must be positive")
        if (self.num_requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of num_requests and duration_s")
        if not arrival.timed and self.duration_s is not None:
            raise ValueError(f"a {arrival.value} is a number of requests, not a duration")

    @property
    def slots(self) -> int:
        """In-flight requests the arrival pattern allows (its warm-up concurrency too)."""
        if self.arrival.one_wave:
            return self.num_requests or 1
        return max(1, math.ceil(self.level))

    def deadline_s(self) -> float:
        """The measured window's deadline: given, or the longest a healthy server could need —
        the duration (or, for Poisson arrivals, three times their expected span) plus one
        request, or one request time per wave of ``slots`` requests."""
        if self.run_timeout_s is not None:
            return self.run_timeout_s
        if self.duration_s is not None:
            return self.duration_s + self.request_timeout_s
        n = self.num_requests or 1
        if self.arrival.open_loop:
            return 3 * n / self.level + self.request_timeout_s
        return math.ceil(n / self.slots) * self.request_timeout_s


@dataclass
class _Raw:
    """A request as it happened, before it is turned into a record."""

    req: PreparedRequest
    warmup: bool
    scheduled: float
    sent: float = 0.0
    end: float = 0.0
    result: CompletionResult | None = None
    error: str | None = None


@dataclass
class _State:
    raws: list[_Raw] = field(default_factory=list)
    abort: str | None = None
    refused: int = 0


@dataclass
class RunResult:
    """One run: its records (warm-up included, marked), window, client cost and server peak."""

    level: float
    run: int
    records: list[RequestRecord]
    duration_s: float | None
    client: ClientStats | None
    kv_cache_peak: float | None = None
    aborted: str | None = None

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]

    def run_summary(self, slo: Mapping[str, float | None] | None = None) -> RunSummary:
        """The run's RunSummary (docs/perf.md)."""
        return summarize_run(self.records, duration_s=self.duration_s, slo=slo)


class LoadGenerator:
    """Runs :class:`RunConfig` runs against one endpoint with one workload."""

    freeze_gc: bool = True
    """Freeze the heap over the measured window (see :mod:`adaptcheck.perf.gcguard`); off only to measure its effect."""

    def __init__(self, base_url: str, workload: Workload, *, model: str | None = None, tokenizer: Any = None,
                 rejected_fields: set[str] | frozenset[str] = frozenset(), api: API | None = None) -> None:
        self.base_url = base_url
        self.api: API = api or "completions"
        """The route driven: completions, or chat for a chat-only endpoint (learnt: /v1/completions 404/405)."""
        if self.api == "chat":
            workload.factory.use_chat()
        self.workload = workload
        self.model = model
        self.tokenizer = tokenizer
        self.rejected_fields = set(rejected_fields)
        """Optional request fields the server refuses (learnt once, kept for every run)."""
        self._learnt = False

    def run(self, cfg: RunConfig, *, level_index: int, run: int, stop: threading.Event | None = None) -> RunResult:
        """One run on a fresh event loop (the caller has none running); ``stop`` set from another
        thread starts no further request of the window (in-flight ones finish)."""
        return asyncio.run(self.arun(cfg, level_index=level_index, run=run, stop=stop))

    async def arun(self, cfg: RunConfig, *, level_index: int, run: int,
                   stop: threading.Event | None = None) -> RunResult:
        control = AsyncOpenAIClient(self.base_url, model=self.model, timeout_s=cfg.request_timeout_s)
        try:
            await self._learn(control, cfg)  # before the stream client: it decides the route
        except BaseException:
            await control.aclose()
            raise
        stream = StreamClient(self.base_url, chat=self.api == "chat")
        state = _State()
        monitor = ClientMonitor()
        heap = HeapFreeze(self.freeze_gc)
        sampler = ServerSampler(control) if cfg.sample_server else None
        stats: ClientStats | None = None
        t_start = time.perf_counter()
        try:
            warm = self.workload.prepare(level_index, run, "warmup", cfg.warmup_requests)
            ahead = cfg.num_requests if cfg.num_requests is not None else 4 * cfg.slots + 8
            self.workload.prepare(level_index, run, "measured", ahead)  # prompts built before the clock
            await self._warmup(stream, cfg, warm, state)
            if state.abort is None:
                heap.freeze()  # no full collection of the worker's heap inside the window
                if sampler is not None:
                    await sampler.start()
                monitor.start()
                await self._window(stream, cfg, state, lambda i: self.workload.request(level_index, run, "measured", i),
                                   stop)
                stats = await monitor.stop()
        finally:
            heap.thaw()
            if sampler is not None:
                await sampler.stop()
            await stream.aclose()
            await control.aclose()
        self.workload.forget(level_index, run)
        records = [self._record(raw, cfg.level, run, t_start) for raw in state.raws]
        measured = [raw for raw in state.raws if not raw.warmup]
        duration = (max(r.end for r in measured) - min(r.sent for r in measured)) if measured else None
        return RunResult(level=cfg.level, run=run, records=records, duration_s=duration, client=stats,
                         kv_cache_peak=sampler.kv_peak if sampler is not None else None,
                         aborted=(("during warm-up: " if stats is None else "") + state.abort) if state.abort else None)

    async def _learn(self, control: AsyncOpenAIClient, cfg: RunConfig) -> None:
        """Once per generator: the model name to send, and the optional fields the server refuses.

        One 1-token request through the general client, whose retry logic finds the fields
        a server rejects (``transformers serve`` answers 422 to ``ignore_eos``); the timed
        requests then leave them out (or emulate ``ignore_eos``) from the first one on. A
        server without ``/v1/completions`` (404/405) is driven through ``/v1/chat/completions``.
        """
        if self._learnt:
            return
        with contextlib.suppress(EndpointError):  # a dead server: each timed request will say so
            control.rejected_fields |= self.rejected_fields
            if self.api == "completions":
                try:
                    await control.completion("Hello", max_tokens=1, stream=True, ignore_eos=cfg.ignore_eos,
                                             token_ids=True)
                except EndpointStatusError as exc:
                    if exc.status not in (404, 405):
                        raise
                    self.api = "chat"
                    self.workload.factory.use_chat()
            if self.api == "chat":
                await control.chat([{"role": "user", "content": "Hello"}], max_tokens=1, stream=True,
                                   ignore_eos=cfg.ignore_eos, token_ids=True)
            self.model = control.model
            self.rejected_fields |= control.rejected_fields
            self._learnt = True

    def _body(self, req: PreparedRequest, cfg: RunConfig) -> dict[str, JsonValue]:
        """The request, as the general client would build it for this server (same field policy)."""
        body: dict[str, JsonValue] = {"max_tokens": req.output_tokens, "temperature": 0.0,
                                "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
        if self.model is not None:
            body["model"] = self.model
        if cfg.ignore_eos:
            body["ignore_eos"] = True
        for key in self.rejected_fields:
            body.pop(key, None)
        if cfg.ignore_eos and "ignore_eos" in self.rejected_fields and "generation_config" not in self.rejected_fields:
            # transformers serve: min_new_tokens masks EOS until max_tokens (see openai_client).
            body["generation_config"] = json.dumps({"min_new_tokens": req.output_tokens})
        return body

    # -- sending -------------------------------------------------------------------------

    async def _send(self, client: StreamClient, cfg: RunConfig, req: PreparedRequest, scheduled: float,
                    state: _State, *, warmup: bool = False) -> None:
        raw = _Raw(req=req, warmup=warmup, scheduled=scheduled)
        state.raws.append(raw)  # registered first: a request cancelled mid-flight still leaves its record
        raw.sent = time.perf_counter()
        try:
            raw.result = await client.completion(self._body(req, cfg), timeout_s=cfg.request_timeout_s)
            raw.sent = raw.result.t_send
            state.refused = 0
        except asyncio.CancelledError:
            raw.error = f"cancelled: {state.abort or 'the run was stopped'}"
            raise
        except EndpointUnreachable as exc:
            raw.error = exception_line(exc, MAX_ERROR_TEXT)
            state.refused += 1
            if state.refused >= UNREACHABLE_ABORT:
                state.abort = state.abort or f"the server stopped accepting connections ({exc.message})"
        except EndpointTimeout as exc:
            raw.error = exception_line(exc, MAX_ERROR_TEXT)
            state.abort = state.abort or f"a request timed out: the server is hung or overloaded ({exc.message})"
        except EndpointError as exc:
            raw.error = exception_line(exc, MAX_ERROR_TEXT)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong is this request's error, never a hang
            raw.error = exception_line(exc, MAX_ERROR_TEXT)
        finally:
            raw.end = time.perf_counter()

    async def _warmup(self, client: StreamClient, cfg: RunConfig, warm: list[PreparedRequest],
                      state: _State) -> None:
        if not warm:
            return
        queue = iter(warm)

        async def slot() -> None:
            for req in queue:
                if state.abort:
                    return
                await self._send(client, cfg, req, time.perf_counter(), state, warmup=True)

        drivers = [asyncio.ensure_future(slot()) for _ in range(min(len(warm), cfg.slots))]
        await self._bounded(drivers, cfg.request_timeout_s * 2 + 5.0, state, "warm-up")

    async def _window(self, client: StreamClient, cfg: RunConfig, state: _State,
                      request: Callable[[int], PreparedRequest], stop: threading.Event | None = None) -> None:
        t0 = time.perf_counter()
        stop_at = t0 + cfg.duration_s if cfg.duration_s is not None else None

        def stopped() -> bool:
            return stop is not None and stop.is_set()

        def more(i: int) -> bool:
            return (state.abort is None and (cfg.num_requests is None or i < cfg.num_requests)
                    and (stop_at is None or time.perf_counter() < stop_at) and not stopped())

        def send(i: int, scheduled: float) -> Awaitable[None]:
            return self._send(client, cfg, request(i), scheduled, state)

        drivers: list[asyncio.Future[Any]]
        if cfg.arrival.one_wave:
            drivers = [asyncio.ensure_future(send(i, t0)) for i in range(cfg.num_requests or 0)]
        elif cfg.arrival.closed_loop:
            counter = itertools.count()

            async def slot() -> None:
                scheduled = t0
                while more(i := next(counter)):
                    await send(i, scheduled)
                    scheduled = time.perf_counter()  # closed loop: the next one is due the moment this slot frees

            drivers = [asyncio.ensure_future(slot()) for _ in range(cfg.slots)]
        else:
            arrivals = cfg.arrival.send_times(cfg.level, cfg.arrival_seed, count=cfg.num_requests, until_s=cfg.duration_s)

            async def dispatch() -> None:
                sent: list[asyncio.Future[None]] = []
                try:
                    for i, at in enumerate(arrivals):
                        if state.abort is not None or stopped():
                            break
                        delay = t0 + at - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        if stopped():
                            break
                        sent.append(asyncio.ensure_future(send(i, t0 + at)))
                    await asyncio.gather(*sent)
                finally:  # cancelled at the deadline: cancel what is in flight, and let each record it
                    for task in sent:
                        task.cancel()
                    await asyncio.gather(*sent, return_exceptions=True)

            drivers = [asyncio.ensure_future(dispatch())]
        await self._bounded(drivers, cfg.deadline_s(), state, "run")

    @staticmethod
    async def _bounded(drivers: Sequence[asyncio.Future[Any]], limit_s: float, state: _State, what: str) -> None:
        """Wait for the drivers; past ``limit_s`` cancel them (and the requests they await)."""
        if not drivers:
            return
        _, pending = await asyncio.wait(drivers, timeout=limit_s)
        if pending:
            state.abort = state.abort or f"the {what} reached its {limit_s:g} s deadline"
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # -- records -------------------------------------------------------------------------

    def _count(self, text: str) -> int | None:
        if self.tokenizer is None:
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _record(self, raw: _Raw, level: float, run: int, t_start: float) -> RequestRecord:
        rec = RequestRecord(level=level, run=run, index=raw.req.index, warmup=raw.warmup,
                            scheduled_s=raw.scheduled - t_start, sent_s=raw.sent - t_start,
                            input_tokens=raw.req.input_tokens, error=raw.error, max_tokens=raw.req.output_tokens,
                            input_tokens_sent=raw.req.input_tokens)
        res = raw.result
        if res is None:
            return rec
        rec.finish_reason = res.finish_reason
        if res.prompt_tokens is not None:
            rec.input_tokens = res.prompt_tokens
        # A content chunk carries text or tokens (vLLM bench counts every chunk with a choice;
        # the empty-text ones that matter are tokens that decode to nothing yet).
        content = [c for c in res.chunks if c.text or (c.n_tokens or 0) > 0]
        if not content:
            rec.error = "the stream carried no content"
            return rec
        rec.ttft_s = content[0].t - res.t_send
        rec.e2el_s = content[-1].t - res.t_send
        rec.itl_s = [b.t - a.t for a, b in itertools.pairwise(content)]
        rec.usage_tokens = res.completion_tokens
        # Tokens per chunk for the per-token ITL, best information first (serving_metrics doc).
        if all(c.n_tokens is not None for c in content):
            rec.chunk_tokens, rec.itl_basis = [int(c.n_tokens or 0) for c in content], "token_ids"
        else:
            counted = [max(1, self._count(c.text) or 0) for c in content] if self.tokenizer is not None else None
            if rec.usage_tokens is not None and (counted is None or sum(counted) != rec.usage_tokens):
                rec.itl_basis = "usage_mean"  # the exact total over the chunks; a disagreeing re-encode is not used
            elif counted is not None:
                rec.chunk_tokens, rec.itl_basis = counted, "tokenizer"
            else:
                rec.itl_basis = "chunks"
        rec.tokenizer_tokens = len(res.token_ids) if res.token_ids is not None else self._count(res.text)
        if rec.usage_tokens is not None:
            rec.output_tokens, rec.token_source = rec.usage_tokens, "usage"
        elif rec.tokenizer_tokens is not None:
            rec.output_tokens, rec.token_source = rec.tokenizer_tokens, "tokenizer"
        else:
            rec.output_tokens, rec.token_source = len(content), "chunks"
        return rec
