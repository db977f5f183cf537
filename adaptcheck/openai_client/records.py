"""What the client returns: one :class:`CompletionResult` per answer (text, ids, logprobs, usage and
the raw stream timings), :class:`ScoreResult` for scored sequences, :class:`Capabilities` of a server.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from pydantic import JsonValue


@dataclass
class StreamChunk:
    """One server-sent event of a stream (``data: [DONE]`` excluded)."""

    t: float
    """``time.perf_counter()`` when the event's line had arrived."""
    text: str
    """The text it added ('' for role-only, finish-only and usage-only events)."""
    n_tokens: int | None = None
    """Tokens it carried, when the server says (``token_ids`` or logprobs entries)."""
    finish_reason: str | None = None


@dataclass
class CompletionResult:
    """What one completion or chat request answered, with its timings."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """Usage as the server reports it; None when it does not."""
    token_ids: list[int] | None = None
    """Generated token ids, when the server gives them (vLLM ``return_token_ids`` or
    ``return_tokens_as_token_ids`` logprobs)."""
    prompt_token_ids: list[int] | None = None
    token_logprobs: list[float] | None = None
    """Logprob of each generated token, when logprobs were asked for and given."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per generated position: token id → logprob of the top-N, when the server names ids."""
    top_logprobs_text: list[dict[str, float]] | None = None
    """The same keyed by token text, when the server gave logprobs but not ids."""
    stop_reason: str | int | None = None
    """vLLM: the stop string (or token id) that ended generation."""
    model: str | None = None
    """The model name the server answered with."""
    response_id: str | None = None
    system_fingerprint: str | None = None
    stream: bool = False
    t_send: float = 0.0
    """``time.perf_counter()`` just before the request went out (after the body was built)."""
    t_headers: float = 0.0
    """When the response headers had arrived."""
    t_end: float = 0.0
    """When the response was completely read."""
    chunks: list[StreamChunk] = field(default_factory=list)
    """Streams: every event in arrival order."""
    done_seen: bool = False
    """Streams: the server ended with ``data: [DONE]``."""
    dropped_fields: tuple[str, ...] = ()
    """Optional fields left out of the request because the server rejects them."""
    emulated: tuple[str, ...] = ()
    """Fields emulated another way (``ignore_eos`` through ``generation_config``)."""

    @property
    def content_chunks(self) -> list[StreamChunk]:
        """The events that carried text (what TTFT and ITL are measured on)."""
        return [c for c in self.chunks if c.text]

    @property
    def num_content_chunks(self) -> int:
        return len(self.content_chunks)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: first content chunk − send (streams only)."""
        content = self.content_chunks
        return content[0].t - self.t_send if content else None

    @property
    def e2el_s(self) -> float:
        """End-to-end latency: last content chunk − send for streams, full answer − send otherwise."""
        content = self.content_chunks
        if self.stream and content:
            return content[-1].t - self.t_send
        return self.t_end - self.t_send

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive content chunks (a chunk may hold several tokens)."""
        times = [c.t for c in self.content_chunks]
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def tpot_s(self) -> float | None:
        """(E2EL − TTFT) / (N − 1) with N from usage, else from token ids; None when N ≤ 1."""
        ttft = self.ttft_s
        n = self.completion_tokens if self.completion_tokens is not None else (
            len(self.token_ids) if self.token_ids is not None else None)
        if ttft is None or n is None or n <= 1:
            return None
        return (self.e2el_s - ttft) / (n - 1)


@dataclass
class ScoreResult:
    """Teacher forcing: the server's logprobs at every position of a given token-id prompt."""

    method: str
    """How they were obtained: 'prompt_logprobs' (vLLM extension) or 'echo' (legacy
    completions ``echo`` + ``logprobs``)."""
    token_logprobs: list[float | None]
    """One per prompt token: log p(token | the tokens before it); the first is None."""
    top_logprobs: list[dict[int, float] | None]
    """One per prompt token: token id -> logprob of the top-K there, the prompt's own token
    included; the first is None."""
    top_k: int
    """K as sent (after a server's own cap, see ``notes``)."""
    notes: list[str] = field(default_factory=list)
    """What had to be adapted (K lowered to the server's cap, a field the server refused …)."""


@dataclass(frozen=True)
class Capabilities:
    """What an endpoint accepted and honoured, learnt by :meth:`AsyncOpenAIClient.probe_capabilities`."""

    completions: bool
    chat: bool
    rejected_fields: frozenset[str]
    """Optional fields the server refused (the client leaves them out from now on)."""
    token_ids: bool
    """Answers carry generated token ids."""
    logprobs: bool
    """Answers carry top-N logprobs."""
    stream_done_marker: bool
    """Streams end with ``data: [DONE]``."""
    stream_usage: bool
    """Streams report usage (with ``stream_options.include_usage``)."""
    ignore_eos: str
    """'native', 'emulated' (transformers' generation_config) or 'no'."""
    metrics: bool
    """``/metrics`` answers Prometheus text."""
    system_fingerprint: str | None
    """As the server reports it (vLLM: ``vllm-0.32.0-…``)."""

    def facts(self) -> dict[str, JsonValue]:
        """As JSON, in field order (the rejected fields as a sorted list): the endpoint adapter's facts."""
        return {"completions": self.completions, "chat": self.chat, "rejected_fields": [f for f in sorted(self.rejected_fields)],
                "token_ids": self.token_ids, "logprobs": self.logprobs, "stream_done_marker": self.stream_done_marker,
                "stream_usage": self.stream_usage, "ignore_eos": self.ignore_eos, "metrics": self.metrics,
                "system_fingerprint": self.system_fingerprint}
