"""Whether vLLM can run a weight-quantized checkpoint here, in vLLM's own terms, asked before an
engine starts: step 3's int4 and block-fp8 ops and step 4's quantized models share the answer
(docs/families.md, "Quantized checkpoints").

vLLM 0.32 on CPU runs int4 weight-only layers (GPTQ, AWQ, compressed-tensors W4A16) only through
``CPUWNA16LinearKernel`` → ``_C.cpu_gemm_wna16``, and block fp8 only through
``CPUFp8BlockScaledMMKernel`` (AMX). Where the kernel is missing, a GPTQ model loads and then
fails at its first quantized layer with an AttributeError, and a block-fp8 one fails at load: a
check must say "not applicable here" with the reason instead of an error, and never a pass.
"""

from __future__ import annotations

import importlib
from pathlib import Path


def int4_gate() -> str | None:
    """None where vLLM can run its CPU int4 kernel here, else why not (vLLM's condition)."""
    import torch

    importlib.import_module("vllm._custom_ops")  # loads the _C library this host gets
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return None
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not torch.cpu._is_avx512_supported():
        return ("vLLM's CPU int4 kernel (CPUWNA16LinearKernel → _C.cpu_gemm_wna16) is built only into its"
                " AVX-512 libraries: CpuPlatform.import_kernels loads _C_AVX2 where"
                " torch.cpu._is_avx512_supported() is False, as on this host. choose_mp_linear_kernel still"
                " picks CPUWNA16LinearKernel (its can_implement does not look for the op), so a GPTQ or AWQ"
                " model loads and then fails when a quantized layer first runs (the op is absent): vLLM has no"
                " other CPU path for them here")
    return None


def block_fp8_gate() -> str | None:
    """None where vLLM would run its CPU block-fp8 kernel here, else its own is_supported reason."""
    from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUFp8BlockScaledMMKernel

    ok, why = CPUFp8BlockScaledMMKernel.is_supported()
    if ok:
        return None
    return (f"vLLM's CPU block-fp8 kernel (CPUFp8BlockScaledMMKernel → _C.fp8_scaled_mm_cpu) "
            f"{str(why).rstrip('.')}; its W8A8 sibling needs AMX-FP8 as well, and vLLM has no other CPU path"
            " for block-fp8 checkpoints")


def _cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def vllm_quant_refusal(path: Path) -> str | None:
    """Why vLLM cannot run the quantized checkpoint in ``path`` here, or None (not quantized, or
    runnable, or a format this module does not judge: the engine then speaks for itself)."""
    from adaptcheck.base.families import read_families
    from adaptcheck.frameworks.modelfiles import read_config

    config = read_config(path)
    if config is None:
        return None
    quantization = read_families(config).quantization
    try:
        if quantization in ("gptq", "awq", "w4a16") and _cpu():
            why = int4_gate()
        elif quantization == "fp8_block" and _cpu():
            why = block_fp8_gate()
        else:
            return None
    except Exception:  # noqa: BLE001 - an unknown answer is no refusal: the engine then speaks for itself
        return None
    return None if why is None else f"a {quantization} checkpoint: {why}"
