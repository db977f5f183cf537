"""The one table of how step 3's catalog ops map onto vLLM: kernels, layer classes, gaps; plain
data, no vLLM import (docs/frameworks.md, "Step-3 ops in vLLM").
"""

from __future__ import annotations

from dataclasses import dataclass

CONTIGUOUS_BLOCK_SIZE = 32
"""Block size of the paged cache the attention adapters build when the catalog op has none
of its own (prefill, decode): vLLM's CPU attention requires kernel block sizes that are
multiples of 32."""


@dataclass(frozen=True)
class VllmOp:
    """What adaptcheck knows about one catalog op on vLLM."""

    kernels: tuple[str, ...] = ()
    """``torch.ops._C`` ops (``_C.rms_norm``) or ``module:attr`` Python paths the provider's
    adapter calls; empty when the provider has no adapter for the op."""
    note: str = ""
    """How the adapter's call differs from a bare kernel call (shown by the provider)."""
    layer: str | None = None
    """``module:Class`` of the vLLM ``CustomOp`` whose platform path (``forward_cpu`` …) runs
    the op's kernel; such a layer may run ``forward_native`` (plain torch) instead. None for
    ops that are not a CustomOp with a forward_native alternative (attention, KV-cache writes,
    MoE, quantization, sampling)."""
    layer_kernel: str | None = None
    """The kernel that layer's platform path calls, as the dispatcher names it
    (``_C::gelu``), where the provider has no adapter of its own to name it; else None and
    :attr:`served_kernel` is the adapter's first kernel."""
    no_kernel: str = ""
    """Why vLLM has no kernel for the op here (the provider's skip reason); empty when it has one."""

    @property
    def layer_class(self) -> str | None:
        """The layer's class name alone ('RMSNorm'), as vLLM's own descriptions name it."""
        return None if self.layer is None else self.layer.rpartition(":")[2]

    @property
    def served_kernel(self) -> str | None:
        """The ``_C`` kernel the layer's platform path runs, in the dispatcher's spelling
        (``_C::rms_norm``, as step 4's traces record it); None for an op without a layer."""
        if self.layer is None:
            return None
        if self.layer_kernel is not None:
            return self.layer_kernel
        first = self.kernels[0] if self.kernels else None
        if first is None or ":" in first:  # a Python path is no dispatcher op
            return None
        namespace, _, name = first.partition(".")
        return f"{namespace}::{name}"


_LAYERNORM = "vllm.model_executor.layers.layernorm"
_ACTIVATION = "vllm.model_executor.layers.activation"
# Attention goes through the backend vLLM selects for the platform (CPU_ATTN on CPU, what
# CUDA/ROCm/plugins select elsewhere): the layer a model builds, its backend's builder and impl.
_ATTENTION_KERNELS = ("vllm.v1.attention.selector:get_attn_backend", "vllm.model_executor.layers.attention:Attention")
_BACKEND = "through the attention backend vLLM selects here (Attention layer, builder metadata, impl.forward)"
_BACKEND_WRITE = ("through the selected backend's impl.do_kv_cache_update; the cache read back from the"
                  " backend's layout")
_PAGED_COPY = f"{_BACKEND}; K/V written into a paged cache of block size {CONTIGUOUS_BLOCK_SIZE} first"
_FP8_NOTE = "; fp8 caches: the layer's k_scale/v_scale set, codes loaded through the backend's quantizing write"

VLLM_OPS: dict[str, VllmOp] = {
    # CustomOp layers: their platform path may be bypassed by forward_native (served_ops).
    "rms_norm": VllmOp(("_C.rms_norm",), layer=f"{_LAYERNORM}:RMSNorm"),
    # RMSNorm.forward_* with a residual.
    "fused_add_rms_norm": VllmOp(("_C.fused_add_rms_norm",), layer=f"{_LAYERNORM}:RMSNorm"),
    "silu_and_mul": VllmOp(("_C.silu_and_mul",), layer=f"{_ACTIVATION}:SiluAndMul"),
    "gelu_tanh": VllmOp(("_C.gelu_tanh",), "on x86 GELUTanh.forward_cpu runs forward_native instead",
                        layer=f"{_ACTIVATION}:GELUTanh"),
    "gelu": VllmOp(layer=f"{_ACTIVATION}:GELU", layer_kernel="_C::gelu",
                   no_kernel="vLLM's CPU build has no erf-GELU kernel on x86 (GELU.forward_cpu uses"
                             " activation_lut_bf16 on Arm only, else forward_native = F.gelu)"),
    "rope": VllmOp(("_C.rotary_embedding",), "cos/sin cache cast to the query dtype, as vLLM does",
                   layer="vllm.model_executor.layers.rotary_embedding:RotaryEmbedding"),
    # Kernels (or vLLM Python code) outside any CustomOp with a forward_native alternative.
    "reshape_and_cache": VllmOp(_ATTENTION_KERNELS, _BACKEND_WRITE),
    "reshape_and_cache_fp8": VllmOp(_ATTENTION_KERNELS, _BACKEND_WRITE + _FP8_NOTE),
    "paged_attention": VllmOp(_ATTENTION_KERNELS, _BACKEND + "; the catalog cache loaded through the backend's write"),
    "paged_attention_fp8": VllmOp(_ATTENTION_KERNELS, _BACKEND + _FP8_NOTE),
    "decode_attention": VllmOp(_ATTENTION_KERNELS, _PAGED_COPY),
    "prefill_attention": VllmOp(_ATTENTION_KERNELS, _PAGED_COPY),
    "fused_moe": VllmOp(("_C.cpu_fused_moe", "_C.prepack_moe_weight",
                         "vllm.model_executor.layers.fused_moe.router.cpu_router:_softmax_topk"),
                        "routing by vLLM's CPURouter (_softmax_topk, torch code), experts by _C.cpu_fused_moe"),
    "int8_w8a8_gemm": VllmOp(("_C.create_onednn_scaled_mm_handler", "_C.onednn_scaled_mm")),
    "scaled_int8_quant": VllmOp(("_C.static_scaled_int8_quant", "_C.dynamic_scaled_int8_quant")),
    "fp8_quantize": VllmOp(("_C.quantize_fp8e4m3_vec",), "bf16 inputs only (the kernel's contract)"),
    # Weight-quantized GEMMs (adaptcheck/steps/ops/providers/vllm_quant_weight.py, with the gates
    # that make them not applicable where vLLM would not run them).
    "int4_w4a16_gemm": VllmOp(("_C.cpu_gemm_wna16", "vllm.model_executor.kernels.linear:choose_mp_linear_kernel",
                               "vllm.model_executor.layers.quantization.auto_awq:_convert_awq_to_standard_format"),
                              "layer built as vLLM loads it (AWQ converted by vLLM, the kernel chosen and its"
                              " process_weights_after_loading run), then apply_weights; symmetric GPTQ without"
                              " act-order only (vLLM 0.32 refuses the others)"),
    "block_fp8_gemm": VllmOp(("_C.convert_weight_packed", "_C.fp8_scaled_mm_cpu"),
                             "CPUFp8BlockScaledMMKernel's W8A16 path: bf16/fp32 activations, K block 128; W8A8"
                             " group-quantized activations have no vLLM CPU kernel"),
    "greedy_sample": VllmOp(("_C.greedy_argmax",), "logits upcast to float32 as vLLM's Sampler does"),
    "top_k_top_p_mask": VllmOp(("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p",),
                               "vLLM's sampler code (Python/torch on CPU, logits upcast to float32 as the"
                               " Sampler does), not a compiled kernel"),
    # Catalog ops vLLM has no kernel for here.
    "gemm": VllmOp(no_kernel="vLLM has no standalone matmul op: unquantized linear layers go through torch/oneDNN"
                             " (dispatch_cpu_unquantized_gemm); the torch provider covers that path"),
    "bmm": VllmOp(no_kernel="vLLM has no standalone batched-matmul op with this signature; the torch provider"
                            " covers it"),
    "layer_norm": VllmOp(no_kernel="vLLM's LayerNorm is torch.nn.LayerNorm (no vLLM kernel); the torch provider"
                                   " covers it"),
    "silu": VllmOp(no_kernel="vLLM has no unary SiLU kernel (only the fused silu_and_mul); models call torch's"
                             " F.silu"),
    "softmax": VllmOp(no_kernel="vLLM has no standalone softmax kernel (sampling and attention fuse it)"),
    "embedding": VllmOp(no_kernel="vLLM's CPU build embeds through torch F.embedding (no"
                                  " _C.vocab_parallel_embedding kernel)"),
    "fp8_scaled_gemm": VllmOp(no_kernel="vLLM's CPU build has no fp8×fp8 GEMM: its fp8 path (fp8_scaled_mm_cpu)"
                                        " is W8A16, block-quantized weights with bf16 activations"),
}
"""Catalog op → what vLLM has for it. An op missing here has no vLLM kernel mapped to it."""


def custom_op_layers() -> dict[str, tuple[str, str]]:
    """Catalog op → (the CustomOp class name, the ``_C`` kernel its platform path runs) for every
    op of :data:`VLLM_OPS` run by such a layer: what a served model may bypass with forward_native."""
    out: dict[str, tuple[str, str]] = {}
    for op, entry in VLLM_OPS.items():
        cls, kernel = entry.layer_class, entry.served_kernel
        if cls is not None and kernel is not None:
            out[op] = (cls, kernel)
    return out
