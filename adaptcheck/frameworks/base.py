"""The framework adapter contract: loading a model, greedy generation, teacher-forced scoring and
the facts an adapter reports, as every step-4 check and the step-5 load generator speak them
(docs/frameworks.md, "The adapter contract").
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from pydantic import JsonValue

# Defined in the base layer (the OpenAI client raises them too); importable from here as before.
from adaptcheck.base.errors import FrameworkError as FrameworkError
from adaptcheck.base.errors import FrameworkUnavailable as FrameworkUnavailable
from adaptcheck.base.errors import ScoringUnsupported as ScoringUnsupported


class FrameworkFacts(TypedDict, total=False):
    """What :meth:`Framework.describe` tells the report, by the adapter that says it.

    Stored as the extras of ``details.framework`` (``FrameworkInfo``); a plugin adapter may
    add keys of its own (JSON values). Only the keys an adapter knows are present.
    """

    framework: str
    """Every adapter: its registry name."""
    dtype: str
    """Serving dtype (vllm, transformers)."""
    # vllm
    vllm: str | None
    platform: str
    device_type: str | None
    vllm_target_device: str | None
    platform_plugins: list[dict[str, str | None]]
    general_plugins: list[dict[str, str | None]]
    enforce_eager: bool | None
    enable_prefix_caching: bool | None
    tensor_parallel_size: int
    max_logprobs: int | None
    implementations: Mapping[str, str | None]
    # transformers
    transformers: str | None
    device: str
    attention: str | None
    image_inputs: str
    """A vision-language model: how its images become model inputs (processor, or image processor + tokenizer)."""
    # endpoint, vllm_serve, transformers_serve
    url: str | None
    served_model: str | None
    capabilities: dict[str, JsonValue]
    server_command: str
    server_log: str
    server_startup_s: float | None
    server_pid: int | None


@dataclass(frozen=True)
class Availability:
    """Whether an adapter can be used here, and why not."""

    available: bool
    reason: str = ""
    version: str | None = None


@dataclass
class GenRequest:
    """One greedy generation request."""

    prompt: str | None = None
    """Text prompt (completions), or None when ``prompt_ids`` or ``messages`` is given."""
    prompt_ids: list[int] | None = None
    """Token-id prompt; adapters that only take text decode it with the model's tokenizer."""
    messages: list[dict[str, str]] | None = None
    """Chat messages: the adapter applies the model's chat template (chat API for endpoints)."""
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    """Stop strings; the returned text excludes the stop string (OpenAI semantics)."""
    ignore_eos: bool = False
    logprobs: int = 0
    """Top-N logprobs wanted per generated position (0: none)."""
    stream: bool = False
    """Endpoint adapters: use the streaming API (in-process adapters ignore it)."""
    images: list[str] = field(default_factory=list)
    """Named deterministic images (:mod:`adaptcheck.frameworks.multimodal`) shown with a chat
    request, before the text of its first user message; empty for a text-only request."""


@dataclass
class Generation:
    """What a framework answered for one request."""

    token_ids: list[int] | None
    """Generated token ids (EOS included when it ended the sequence); None when unknown."""
    text: str
    finish_reason: str | None
    """'stop' (EOS or stop string), 'length' (max_tokens) or the framework's word."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """Usage as the framework reports it."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per generated position: token id → logprob of the top-N (the chosen one included)."""
    prompt_ids: list[int] | None = None
    """Token ids the framework saw as the prompt, when it says."""
    extra: dict[str, JsonValue] = field(default_factory=dict)
    """Framework-specific evidence (timings, chunk counts …), stored as JSON in the details."""


@dataclass
class ScoreRequest:
    """Teacher forcing: score a fixed token sequence without generating anything."""

    token_ids: list[int]
    """The whole sequence (prompt + the reference's continuation), as token ids."""
    start: int
    """Index of the first scored token: positions ``start .. len-1`` are scored, each from
    the logits the model computes after seeing every token before it."""
    top_k: int = 20
    """Alternatives wanted per position besides the scored token (vLLM's default cap is 20)."""
    images: list[str] = field(default_factory=list)
    """The images of a multimodal sequence, in order: ``token_ids`` already holds their expanded
    placeholder tokens (one per merged patch), the pixels come from these names."""


@dataclass
class Scored:
    """Per scored position: the log-probability of the given token and the top-K alternatives."""

    token_logprobs: list[float]
    """log p(token_ids[start + i] | everything before it), one per scored position."""
    top_logprobs: list[dict[int, float]]
    """Per scored position: token id -> log-probability of the K most likely tokens (the
    scored token added when it is not among them)."""
    extra: dict[str, JsonValue] = field(default_factory=dict)
    """How the scores were obtained (API field used, …), stored as JSON in the details."""


@dataclass
class LoadOptions:
    """How to bring a model up."""

    model_path: Path
    dtype: str = "bf16"
    """'fp32' | 'fp16' | 'bf16'."""
    max_model_len: int = 2048
    enable_prefix_caching: bool | None = None
    """None: the framework's default."""
    compile: bool | None = None
    """Graph capture / torch.compile on (True) or off (False); None: the framework's default."""
    tensor_parallel_size: int = 1
    engine_args: dict[str, JsonValue] = field(default_factory=dict)
    """The ladder's ``engine_args`` (validated against :attr:`Framework.engine_arg_names`):
    vLLM ``LLM`` keywords in process, ``vllm serve`` flags when served."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the framework's processes start with for this instance only (vLLM on CPU:
    ``VLLM_CPU_OMP_THREADS_BIND`` for tensor-parallel ranks, one core each)."""
    extra: dict[str, JsonValue] = field(default_factory=dict)
    """Adapter-specific options (``attn_implementation``, ``server_args``, vLLM ``LLM`` keywords)."""


@dataclass
class FrameworkConfig:
    """What an adapter may need beyond the model: where to write server logs, which endpoint."""

    log_dir: Path | None = None
    """Folder for server logs (the run folder's ``framework/``)."""
    endpoint_url: str | None = None
    """``--endpoint``: base URL of an OpenAI-compatible server."""
    endpoint_model: str | None = None
    """``--endpoint-model``: the served model name (default: the first the server lists)."""
    endpoint_reference: bool = False
    """True when the run's ``--model`` is a local copy of the endpoint's weights."""


def allowed_cores() -> list[int]:
    """The host cores this process may run on (its affinity; every core where there is no such API)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS): every core
        return list(range(os.cpu_count() or 1))


class Framework(ABC):
    """One inference framework serving one loaded model."""

    def __init__(self, config: FrameworkConfig | None = None) -> None:
        self.config = config or FrameworkConfig()

    name: ClassVar[str]
    """Registry name: 'transformers', 'vllm', 'vllm_serve', 'transformers_serve', 'endpoint'."""
    display_name: ClassVar[str]
    deploys: ClassVar[str | None] = None
    """The engine of a ``--serve`` deployment this adapter runs (``Deployment.engine``: 'vllm' for the
    in-process LLM and ``vllm serve``): its checks of the deployed model then load exactly the
    deployment's engine arguments (docs/deployment.md). None: the adapter is not that engine."""
    supports_prefix_caching: ClassVar[bool] = False
    supports_compile_toggle: ClassVar[bool] = False
    supports_tensor_parallel: ClassVar[bool] = False
    host_tensor_parallel_env: ClassVar[str | None] = None
    """Set where the adapter runs tensor-parallel ranks as processes on the host's cores when the
    device is the CPU (vLLM's CPU backend: gloo + a shared-memory communicator), so TP needs
    cores, not devices: the environment variable that gives each rank its cores, as core lists
    separated by '|' (vLLM: VLLM_CPU_OMP_THREADS_BIND). None: tensor parallel needs devices
    (docs/features.md, "Tensor parallel on one host")."""
    supports_stream: ClassVar[bool] = False
    """Whether requests can be answered through a streaming API (endpoints)."""
    supports_speculative_decoding: ClassVar[bool] = False
    """Whether the adapter can load the model with a drafter (``engine_args.speculative_config``)."""
    engine_arg_names: ClassVar[frozenset[str] | None] = frozenset()
    """The ``engine_args`` names a ladder may give this adapter: empty takes none, None takes
    any (a plugin adapter that validates its own). vLLM adapters: the installed ``EngineArgs``
    fields (:meth:`accepted_engine_args`)."""

    @classmethod
    def accepted_engine_args(cls) -> frozenset[str] | None:
        """The names :attr:`engine_arg_names` stands for (overridden where they are read at run time)."""
        return cls.engine_arg_names

    @classmethod
    @abstractmethod
    def availability(cls) -> Availability:
        """Installed and usable here? Never raises."""

    @classmethod
    def unconfigured(cls, config: FrameworkConfig) -> str | None:
        """Why this run's configuration leaves nothing to load (no ``--endpoint`` …), else None.

        Asked before the framework that is already up is shut down: an adapter with nothing
        to talk to must not cost the run the server the next checks reuse.
        """
        return None

    @classmethod
    def host_rank_env(cls, opts: LoadOptions, device: str) -> dict[str, str]:
        """``opts.env``, with one core per tensor-parallel rank bound where the ranks run on the
        host's cores (CPU device, :attr:`host_tensor_parallel_env` set) and the caller bound none:
        without it every rank's threads would share every core (vllm serve
        --tensor-parallel-size 2 in step 5 as much as framework.tensor_parallel)."""
        env = dict(opts.env)
        var = cls.host_tensor_parallel_env
        ranks = opts.tensor_parallel_size
        if device.split(":")[0] != "cpu" or var is None or ranks < 2 or var in env:
            return env
        cores = allowed_cores()
        if len(cores) < ranks:
            raise FrameworkUnavailable(f"tensor parallel {ranks} on the CPU needs {ranks} cores, one per rank; "
                                       f"this process may use {len(cores)}")
        env[var] = "|".join(str(c) for c in cores[:ranks])
        return env

    @classmethod
    def tensor_parallel_unfit(cls, model_path: Path, ranks: int) -> str | None:
        """Why ``ranks`` tensor-parallel ranks cannot split this model, else None: every rank
        holds a whole number of attention heads (vLLM refuses the rest when the engine is
        configured, after the start-up's cost). Read from ``config.json`` (a multimodal model's
        ``text_config``); a folder without the field is left to the framework to judge."""
        import json

        try:
            config = json.loads((model_path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        heads = (config.get("text_config") or config).get("num_attention_heads")
        if isinstance(heads, int) and heads % ranks:
            return (f"the model's {heads} attention heads do not divide among {ranks} tensor-parallel ranks "
                    f"(vLLM requires num_attention_heads divisible by tensor_parallel_size)")
        return None

    @abstractmethod
    def load(self, opts: LoadOptions, device: str) -> float:
        """Bring the model up on the torch device string (e.g. 'cpu', 'cuda:0'); returns seconds taken."""

    @abstractmethod
    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        """Answer the requests, submitted together (a concurrent batch when more than one)."""

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        """Teacher-forced scores of each sequence, submitted together (a batch when more
        than one). Raises :class:`ScoringUnsupported` with the reason where the framework
        or server has no way to score a given text."""
        raise ScoringUnsupported(f"{self.display_name} cannot score a given token sequence")

    def torch_model(self) -> Any:
        """The in-process ``torch.nn.Module`` that :meth:`score` runs, for forward-hook
        localisation; None where the model lives in an engine or another process."""
        return None

    def implementations(self) -> dict[str, str | None]:
        """Which implementation each layer type of the loaded model really ran (attention
        backend, custom kernel or native path …), as far as this framework can tell; {} when
        it cannot. Keys are layer types, values a short description."""
        return {}

    def runs_here(self) -> bool:
        """Whether the model runs in this process or one it started (so this machine's process
        memory is the framework's memory). A remote endpoint says no."""
        return True

    def serves_local_weights(self) -> bool:
        """Whether the answers come from the run's local model files (so the CPU reference and
        the local tokenizer apply). Only an external endpoint may say no."""
        return True

    def metrics(self) -> dict[str, float]:
        """The framework's own gauges and counters by name (vLLM's Prometheus metrics …)."""
        return {}

    def engine_facts(self) -> dict[str, JsonValue]:
        """What the running engine really does, read back from it (not what was asked):
        compilation mode and captured graph sizes, KV-cache dtype and blocks, speculative
        method, world size … {} where the framework cannot tell. Features prove activity with it."""
        return {}

    def memory_state(self) -> dict[str, float]:
        """Figures that must come back to baseline after requests finish: KV-cache use and
        requests in flight, from :meth:`metrics`."""
        return {k: v for k, v in self.metrics().items()
                if "kv_cache_usage" in k or k.endswith(("num_requests_running", "num_requests_waiting"))}

    def describe(self) -> FrameworkFacts:
        """Versions, platform and plugin facts for the report (stored as the extras of ``FrameworkInfo``)."""
        return {}

    @abstractmethod
    def shutdown(self) -> None:
        """Release the model and any process; safe to call twice."""


def apply_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest stop string (OpenAI semantics: the stop string itself
    is not returned). Returns the text and whether a stop string was found."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
