"""The one table of how step 3's catalog ops map onto vLLM: kernels, layer classes, gaps; plain
data, no vLLM import (docs/frameworks.md, "Step-3 ops in vLLM").
"""

from __future__ import annotations

from dataclasses import dataclass

CONTIGUOUS_BLOCK_SIZE = 32
"""Block size of the paged cache the attention adapters build when the catalog op has none
of its own (prefill, decode): vLLM's CPU attention requires kernel block sizes that are
multiples of 32."""

CPU_MLA_HEAD_SIZE = 576
"""The one MLA head size (kv_lora_rank + rope) vLLM's CPU_MLA backend supports
(``CPUMLABackend.get_supported_head_sizes``; DeepSeek-V2/V3's 512 + 64); its decode kernel refuses others."""
CPU_MLA_BLOCK_SIZE = 16
"""The one block size vLLM's CPU_MLA backend supports (``get_supported_kernel_block_sizes``)."""


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
_MM_ATTN = "vllm.model_executor.layers.attention.mm_encoder_attention"
_ROPE = "vllm.model_executor.layers.rotary_embedding"
_MAMBA = "vllm.model_executor.layers.mamba.ops"
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
    "grouped_topk": VllmOp(("vllm.model_executor.layers.fused_moe.router.router_factory:create_fused_moe_router",
                             "vllm.model_executor.layers.fused_moe.router.cpu_router:_grouped_topk"),
                            "the router vLLM's FusedMoE layer builds for DeepSeek (use_grouped_topk): CPURouter on CPU,"
                            " whose grouped top-k is torch code; rows put in ascending expert id"),
    "fused_moe_shared": VllmOp(("_C.cpu_fused_moe", "_C.prepack_moe_weight", "_C.silu_and_mul",
                                "vllm.model_executor.layers.linear:UnquantizedLinearMethod"),
                               "routed experts by _C.cpu_fused_moe from the given routing; shared experts as"
                               " DeepseekV2MLP runs them (UnquantizedLinearMethod's CPU GEMM dispatch, _C.silu_and_mul),"
                               " added in the model dtype as MoERunner does"),
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
    # Vision family (vllm_vision.py): vLLM's layers called as its Qwen2-VL/Qwen3-VL code calls them.
    "encoder_attention": VllmOp((f"{_MM_ATTN}:MMEncoderAttention",),
                                "MMEncoderAttention with the ViT backend vLLM picks (TORCH_SDPA per image on CPU)"
                                " and the cu_seqlens/max_seqlen metadata its vision towers prepare"),
    "patch_embed": VllmOp(("vllm.model_executor.layers.conv:Conv3dLayer",),
                          "Conv3dLayer as Qwen2VisionPatchEmbed calls it (rows viewed as [C, T, P, P]); stride ="
                          " kernel, so its forward_native runs unfold + linear"),
    "mrope": VllmOp((f"{_ROPE}:get_rope", f"{_ROPE}.mrope:MRotaryEmbedding"),
                    "get_rope's MRotaryEmbedding (mrope_section, mrope_interleaved), forward as dispatched"
                    " (forward_native on CPU); the op's cache cast to the query dtype, as vLLM does"),
    "vision_rope_2d": VllmOp((f"{_ROPE}:get_rope", f"{_ROPE}.common:ApplyRotaryEmb"),
                             "Qwen2-VL ViT RoPE: get_rope (partial_rotary_factor 0.5), cos/sin gathered by (row,"
                             " column) and ApplyRotaryEmb on q and k stacked, cache in the model dtype"),
    # MLA (DeepSeek-V2/V3): vLLM selects AMX_MLA on x86 hosts with AMX (bf16, its own cpu_mla_decode /
    # cpu_mla_extend kernels, block sizes of 32), else CPU_MLA, whose decode kernel is the one checked.
    "mla_decode": VllmOp(("_C.mla_decode_kvcache",),
                         "CPU_MLA's decode kernel (head size 576, block size 16; fp32/bf16/fp16); q_nope·W_UK and"
                         " the W_UV up-projection by torch.bmm as vLLM's MLAAttention does; on AMX hosts vLLM"
                         " selects AMX_MLA instead (_C.cpu_mla_decode / bmm_cpu, bf16), which is not mapped"),
    "mla_prefill": VllmOp(no_kernel="vLLM's CPU MLA prefill is torch code, no kernel: CPU_MLA expands k/v through"
                                    " kv_b_proj and runs the CPU_SDPA_MLA prefill backend (fp32 matmul + softmax per"
                                    " request); the torch provider covers that path. AMX hosts run AMX_MLA's"
                                    " _C.cpu_mla_extend in latent space instead (not mapped)"),
    # Mamba2 (hybrid models), as MambaMixer2 calls them (adaptcheck/steps/ops/providers/vllm_mamba.py).
    "selective_state_update": VllmOp(("_C.selective_state_update_cpu",),
                                     "MambaMixer2's decode call: A/dt/dt_bias/D expanded over head_dim, states"
                                     " in cache slots 1..B (slot 0 the null block), one call per step"),
    "causal_conv1d_update": VllmOp((f"{_MAMBA}.causal_conv1d:causal_conv1d_update", "_C.causal_conv1d_update_cpu_vec"),
                                   "vLLM's causal_conv1d_update (on CPU causal_conv1d_update_cpu →"
                                   " _C.causal_conv1d_update_cpu_vec); conv state in vLLM's cache layout"),
    "causal_conv1d_fwd": VllmOp((f"{_MAMBA}.causal_conv1d:causal_conv1d_fn",),
                                "vLLM's causal_conv1d_fn: on CPU causal_conv1d_fn_cpu, torch F.conv1d per sequence"
                                " (Python, not a kernel); _C.causal_conv1d_fwd_cpu, where built, serves only"
                                " GatedDeltaNet's packed weights"),
    "ssd_chunk_scan": VllmOp((f"{_MAMBA}.ssd_combined:mamba_chunk_scan_combined_varlen", "_C.mamba_chunk_scan_fwd_cpu"),
                             "vLLM's mamba_chunk_scan_combined_varlen (on CPU: dt + dt_bias and softplus in"
                             " float32 in Python, then _C.mamba_chunk_scan_fwd_cpu); chunk metadata as the"
                             " Mamba2 metadata builder makes it"),
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
