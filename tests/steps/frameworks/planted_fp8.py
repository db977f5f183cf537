"""An FP8 KV cache written with the wrong scale, planted in vLLM's real cache-write path, for
``framework.fp8_kv_cache`` (docs/features.md "FP8 KV cache").

``WrongFp8Scale`` is the in-process vLLM adapter whose ``load`` patches the CPU attention
backend's cache write (``CPUAttentionBackendImpl.do_kv_cache_update``, the method vLLM's
``unified_kv_cache_update`` op calls for every layer) so that an fp8 cache is quantized with
twice the layer's k/v scale, while attention still dequantizes with the true one: every stored
K and V reads back halved. That is the defect of a kernel or a calibration that stores with one
scale and reads with another. The ``auto`` cache does not use the scales and is left as it is,
so the plain instance of the same run stays healthy. In-process vLLM runs its worker in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the patch reaches the engine. Ladders name it
``framework: "tests.steps.frameworks.planted_fp8:WrongFp8Scale"``.
"""

from __future__ import annotations

from typing import Any

from adaptcheck.frameworks.base import LoadOptions
from adaptcheck.frameworks.vllm_fw import VllmFramework

SCALE_ERROR = 2.0
"""The factor the planted write multiplies the k/v scales by (stored values = true / factor)."""


def _patched_write(original: Any) -> Any:
    def do_kv_cache_update(self: Any, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
        if not str(self.kv_cache_dtype).startswith("fp8"):
            return original(self, layer, key, value, kv_cache, slot_mapping)  # type: ignore[no-any-return]
        k_scale, v_scale = layer._k_scale_float, layer._v_scale_float
        layer._k_scale_float, layer._v_scale_float = k_scale * SCALE_ERROR, v_scale * SCALE_ERROR
        try:
            return original(self, layer, key, value, kv_cache, slot_mapping)  # type: ignore[no-any-return]
        finally:
            layer._k_scale_float, layer._v_scale_float = k_scale, v_scale

    do_kv_cache_update.planted = True  # type: ignore[attr-defined]
    return do_kv_cache_update


class WrongFp8Scale(VllmFramework):
    """vLLM whose fp8 KV cache is written at twice its scale (read back at the true one)."""

    display_name = "planted: vLLM, FP8 KV cache written at twice its scale"

    def load(self, opts: LoadOptions, device: str) -> float:
        from vllm.v1.attention.backends import cpu_attn

        impl = cpu_attn.CPUAttentionBackendImpl
        if not getattr(impl.do_kv_cache_update, "planted", False):
            impl.do_kv_cache_update = _patched_write(impl.do_kv_cache_update)  # type: ignore[method-assign]
        return super().load(opts, device)
