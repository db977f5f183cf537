"""vLLM adapters for the weight-quantized GEMMs (int4_w4a16_gemm, block_fp8_gemm) and the gates
that say, in vLLM's own terms, why vLLM would not run them on this host.

int4 (GPTQ, AWQ): the layer is built as vLLM's loaders leave it — AWQ converted by vLLM's own
``_convert_awq_to_standard_format``, the linear kernel chosen by ``choose_mp_linear_kernel``
(CPUWNA16LinearKernel on CPU), its ``process_weights_after_loading`` repacking the words — and
run through the kernel's ``apply_weights`` (``_C.cpu_gemm_wna16``). vLLM 0.32 serves symmetric
GPTQ only (uint4b8: qzeros ignored) and refuses act-order; those cases raise with vLLM's message.

Block fp8: vLLM's CPU path for DeepSeek-style checkpoints is W8A16 (CPUFp8BlockScaledMMKernel:
activations stay bf16/fp32, weight packed by ``_C.convert_weight_packed``, GEMM by
``_C.fp8_scaled_mm_cpu``). Its W8A8 sibling (AMX-FP8 hosts) quantizes activations itself per
token, never per 1×128 group, so pre-quantized group activations have no vLLM CPU kernel.

On an AVX2-only x86 host neither kernel exists (vLLM loads ``_C_AVX2``): the gates make both
ops not applicable with that reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

# vLLM's own conditions for its int4 and block-fp8 kernels, shared with step 4's quantized models.
from adaptcheck.frameworks.vllm_quant import block_fp8_gate, int4_gate


def _vllm_ops() -> Any:
    return importlib.import_module("vllm._custom_ops")


# ------------------------------------------------------------------------------ gates


# ------------------------------------------------------------------------------ int4


def _param(data: torch.Tensor, **dims: int) -> torch.nn.Parameter:
    """A Parameter carrying the layout attributes vLLM's loaders set (input_dim, packed_dim …)."""
    p = torch.nn.Parameter(data.clone(), requires_grad=False)
    for name, value in dims.items():
        setattr(p, name, value)
    return p


def gptq_is_symmetric(qzeros: torch.Tensor | None) -> bool:
    """GPTQ v1 stores zero - 1: a symmetric checkpoint holds 7 in every nibble (0x77777777)."""
    return qzeros is None or bool((qzeros == 0x77777777).all())


def _refusal(qzeros: torch.Tensor | None, g_idx: torch.Tensor | None, group_size: int, fmt: str) -> str | None:
    """vLLM 0.32's own refusal of this GPTQ configuration, or None."""
    if fmt != "gptq":
        return None
    k = g_idx.numel() if g_idx is not None else 0
    size = k if group_size == -1 else group_size
    if g_idx is not None and size and not torch.equal(g_idx.long().cpu(), torch.arange(k) // size):
        from vllm.model_executor.layers.quantization.utils.gptq_utils import normalize_and_validate_gptq_desc_act

        try:
            normalize_and_validate_gptq_desc_act(True, group_size, {})
        except ValueError as exc:
            return f"vLLM refuses this act-order GPTQ layer: {exc}"
    if not gptq_is_symmetric(qzeros):
        return ("vLLM's GPTQ config (AutoGPTQConfig.TYPE_MAP) has 4-bit symmetric only (uint4b8): "
                "Unsupported quantization config: bits=4, sym=False")
    return None


@contextmanager
def _single_rank() -> Iterator[None]:
    """The conversion wraps its result in vLLM parameter classes, which ask the tensor-parallel
    group for rank and size; one layer on one device is rank 0 of 1, without starting vLLM's
    distributed state (a process group) for it."""
    from vllm.model_executor import parameter

    with mock.patch.object(parameter, "get_tensor_model_parallel_rank", return_value=0), \
            mock.patch.object(parameter, "get_tensor_model_parallel_world_size", return_value=1):
        yield


def prepare_int4_layer(qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor, group_size: int,
                       fmt: str, act_dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The linear layer as vLLM leaves it after loading, and the kernel vLLM chose for it.

    Runs without the compiled kernel (only the weight processing): the tests read the repacked
    words back from it.
    """
    from vllm.model_executor.kernels.linear import MPLinearLayerConfig, choose_mp_linear_kernel
    from vllm.scalar_type import scalar_types

    layer = torch.nn.Module()
    with_zp = fmt == "awq" and qzeros is not None
    if fmt == "awq":
        from vllm.model_executor.layers.quantization.auto_awq import _convert_awq_to_standard_format

        k, n = qweight.shape[0], qweight.shape[1] * 8
        layer.register_parameter("qweight", _param(qweight, input_dim=0, output_dim=1, packed_dim=1))
        if with_zp:
            assert qzeros is not None
            layer.register_parameter("qzeros", _param(qzeros, input_dim=0, output_dim=1, packed_dim=1))
        # AWQ → GPTQ-like words (packed along K, plain order), zeros [N/8, G] (vLLM's own conversion).
        with _single_rank():
            _convert_awq_to_standard_format(layer, "qweight", "qzeros" if with_zp else None, 4)
    else:
        k, n = qweight.shape[0] * 8, qweight.shape[1]
        layer.register_parameter("qweight", _param(qweight, input_dim=0, output_dim=1, packed_dim=0))
    layer.register_parameter("scales", _param(scales.to(act_dtype), input_dim=0, output_dim=1))
    layer.register_parameter("bias", None)  # the kernels read layer.bias
    # AWQ keeps its zeros (uint4); symmetric GPTQ and zero-less AWQ are uint4 with bias 8.
    config = MPLinearLayerConfig(full_weight_shape=(k, n), partition_weight_shape=(k, n),
                                 weight_type=scalar_types.uint4 if with_zp else scalar_types.uint4b8,
                                 act_type=act_dtype, group_size=group_size, zero_points=with_zp)
    kernel_cls = choose_mp_linear_kernel(config)
    kernel = kernel_cls(config, w_q_param_name="qweight", w_s_param_name="scales",
                        w_zp_param_name="qzeros" if with_zp else None)
    kernel.process_weights_after_loading(layer)
    return layer, kernel


def int4_w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                    g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    refusal = _refusal(qzeros, g_idx, group_size, fmt)
    if refusal:
        raise NotImplementedError(refusal)
    layer, kernel = prepare_int4_layer(qweight, qzeros, scales, group_size, fmt, x.dtype)
    return kernel.apply_weights(layer, x.contiguous())


# ------------------------------------------------------------------------------ block fp8


def block_fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor,
                   block_n: int, block_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    if a_scale is not None:
        raise NotImplementedError(
            "vLLM's CPU block-fp8 kernels take unquantized activations: CPUFp8BlockScaledMMKernel keeps them"
            " bf16/fp32 (W8A16) and CPUFp8W8A8BlockScaledMMKernel quantizes them itself per token, never per"
            " 1×block_k group")
    # CPUFp8BlockScaledMMKernel.can_implement, in its words.
    if block_k != 128:
        raise NotImplementedError(f"CPU FP8 kernel requires K-dimension block size of 128, got {block_k}.")
    if block_n % 32:
        raise NotImplementedError(f"CPU FP8 kernel requires N-dimension block size to be a positive multiple of"
                                  f" 32, got {block_n}.")
    if out_dtype not in (torch.bfloat16, torch.float32) or a.dtype != out_dtype:
        raise NotImplementedError("Only bfloat16/float32 output dtype supported (vLLM's CPU FP8 kernel, output in"
                                  " the activation dtype).")
    # process_weights_after_loading: the [N, K] weight VNNI-packed; the scales as stored.
    packed = torch.ops._C.convert_weight_packed(b.contiguous())
    out: torch.Tensor = torch.ops._C.fp8_scaled_mm_cpu(a.contiguous(), packed, b_scale.float().contiguous(),
                                                       [block_n, block_k], None, a.dtype, True)
    return out


ADAPTERS: dict[str, Callable[..., Any]] = {"int4_w4a16_gemm": int4_w4a16_gemm, "block_fp8_gemm": block_fp8_gemm}
"""Catalog op → adapter (merged into vllm_provider.ADAPTERS)."""

GATES: dict[str, Callable[[], str | None]] = {"int4_w4a16_gemm": int4_gate, "block_fp8_gemm": block_fp8_gate}
"""Catalog op → its gate: vLLM's reason not to run the op on this host, None where it would."""
