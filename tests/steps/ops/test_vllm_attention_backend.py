"""Step 3's attention through the backend vLLM selects (CPU_ATTN here), against the float64
references: prefill, decode, paged decode, the cache write, and their fp8-cache forms.

The selection is vLLM's (the provider never names a backend); the defects are planted inside the
selected backend's own impl class (its forward and do_kv_cache_update, the methods a model runner
calls), over five seeds, while the same seeds pass without them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm  # noqa: F401 - required (scripts/install-test-deps.sh): an ImportError, never a silent skip

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.hostfacts import cpu_flags
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers import vllm_attention as va
from adaptcheck.steps.ops.providers.base import DictProvider
from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

SEEDS = range(5)
BACKEND = "vLLM attention backend CPU_ATTN (impl CPUAttentionBackendImpl)"
FP8_HERE = bool({"avx512f", "amx_tile"} & (cpu_flags() or frozenset()))
"""vLLM's CPU_ATTN takes an fp8 cache only with AVX-512 or AMX (else n/a, vLLM's message)."""

CASES: dict[str, list[dict[str, Any]]] = {
    "paged_attention": [{"name": "gqa_bs32", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2,
                         "head_size": 64, "block_size": 32}],
    "paged_attention_fp8": [
        {"name": "e4m3_gqa", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64},
        {"name": "e5m2_d128", "batch": 2, "max_seq_len": 90, "num_q_heads": 4, "num_kv_heads": 2, "head_size": 128,
         "kv_cache_dtype": "fp8_e5m2", "k_scale": 0.125, "v_scale": 0.015625}],
    "reshape_and_cache_fp8": [
        {"name": "e4m3", "num_tokens": 24, "num_kv_heads": 2, "head_size": 64, "num_blocks": 8},
        {"name": "e5m2_d128", "num_tokens": 24, "num_kv_heads": 2, "head_size": 128, "num_blocks": 8,
         "kv_cache_dtype": "fp8_e5m2"}],
}
DTYPES = ["fp32", "bf16"]


def _run(provider: Any, op: str, seed: int, cases: list[dict[str, Any]] | None = None,
         dtypes: list[str] | None = None) -> dict[str, Status]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, provider="vllm", dtypes=dtypes or DTYPES, cases=cases or CASES[op])
    return {o.subid: o.status for o in OpCheck(provider).run(ctx, params)}


def _expected(op: str, status: Status) -> dict[str, Status]:
    if op.endswith("_fp8") and not FP8_HERE:
        return dict.fromkeys(DTYPES, Status.SKIP)
    return dict.fromkeys(DTYPES, status)


def _impl_class() -> type:
    """The impl class of the backend vLLM selects here (found through the provider, never named)."""
    return type(va.backend_for(torch.float32, 8, 2, 64, 32, 2).layer.impl)


def test_the_backend_is_vllms_selection_and_is_named() -> None:
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    att = va.backend_for(torch.bfloat16, 8, 2, 64, 32, 2)
    with set_current_vllm_config(att.builder.vllm_config):
        assert att.backend is get_attn_backend(64, torch.bfloat16, "auto")
    assert att.description == BACKEND
    provider = VllmProvider()
    assert provider.describe()["attention_backend"] == BACKEND
    _run(provider, "paged_attention", 0, dtypes=["fp32"])
    assert f"attention through {BACKEND}" in provider.description  # what the evidence records


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("op", ["paged_attention_fp8", "reshape_and_cache_fp8"])
def test_healthy_backend_passes(op: str, seed: int) -> None:
    # (paged_attention itself: tests/steps/ops/test_vllm_provider.py, and seed 0 below)
    assert _run(VllmProvider(), op, seed) == _expected(op, Status.PASS)


def test_prefill_and_decode_through_the_backend_pass() -> None:
    prefill = [{"name": "gqa_d80", "num_tokens": 50, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 80}]
    decode = [{"name": "gqa", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64}]
    assert _run(VllmProvider(), "prefill_attention", 0, prefill, ["fp32", "bf16", "fp16"]) == dict.fromkeys(
        ["fp32", "bf16", "fp16"], Status.PASS)
    assert _run(VllmProvider(), "decode_attention", 0, decode) == dict.fromkeys(DTYPES, Status.PASS)


# ---------------------------------------------------------------- defects inside vLLM's impl


@pytest.fixture
def wrong_block(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The impl's forward reads each sequence's blocks one table entry off (a rolled block table)."""
    cls = _impl_class()
    original = cls.forward

    def forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                output: Any, *args: Any, **kwargs: Any) -> Any:
        attn_metadata.block_table = attn_metadata.block_table.roll(1, dims=1)
        return original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", forward)
    yield


@pytest.fixture
def wrong_scale(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The impl's cache write quantizes keys with twice the layer's k_scale (an fp8 cache written with the wrong scale)."""
    cls = _impl_class()
    original = cls.do_kv_cache_update

    def do_kv_cache_update(self: Any, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> Any:
        kept = layer._k_scale_float
        layer._k_scale_float = kept * 2
        try:
            return original(self, layer, key, value, kv_cache, slot_mapping)
        finally:
            layer._k_scale_float = kept

    monkeypatch.setattr(cls, "do_kv_cache_update", do_kv_cache_update)
    yield


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("op", ["paged_attention", "paged_attention_fp8"])
def test_decode_reading_the_wrong_block_is_caught(op: str, seed: int, wrong_block: None) -> None:
    assert _run(VllmProvider(), op, seed) == _expected(op, Status.FAIL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("op", ["reshape_and_cache_fp8", "paged_attention_fp8"])
def test_fp8_cache_written_with_the_wrong_scale_is_caught(op: str, seed: int, wrong_scale: None) -> None:
    assert _run(VllmProvider(), op, seed) == _expected(op, Status.FAIL)


# ---------------------------------------------------------------- wrappers around the backend path


def _v_cache_dequantized_with_k_scale(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                      block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                      kv_cache_dtype: str, k_scale: float, v_scale: float) -> torch.Tensor:
    return va.paged_attention_fp8(q, key_cache, value_cache, block_tables, seq_lens, scale, kv_cache_dtype, k_scale,
                                  k_scale)


def _formats_swapped(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: float,
                     v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    other = "fp8_e5m2" if kv_cache_dtype == "fp8_e4m3" else "fp8_e4m3"
    kc, vc = va.reshape_and_cache_fp8(key, value, key_cache.to(va.fp8_torch_dtype(other)),
                                      value_cache.to(va.fp8_torch_dtype(other)), slot_mapping, other, k_scale, v_scale)
    return kc.view(key_cache.dtype), vc.view(value_cache.dtype)  # the bytes, read as the format asked for


WRAPPED: list[tuple[str, Callable[..., Any], str]] = [
    ("paged_attention_fp8", _v_cache_dequantized_with_k_scale, "V dequantized with k_scale"),
    ("reshape_and_cache_fp8", _formats_swapped, "e4m3 and e5m2 swapped"),
]


@pytest.mark.parametrize(("op", "fn", "what"), WRAPPED, ids=[w[2] for w in WRAPPED])
def test_defects_wrapped_around_the_backend_are_caught(op: str, fn: Callable[..., Any], what: str) -> None:
    if op.endswith("_fp8") and not FP8_HERE:
        # The wrapper calls the backend's fp8 path, which vLLM refuses on this CPU: nothing to catch.
        pytest.skip("vLLM's fp8 KV cache needs AVX-512 or AMX on the CPU; this one has neither")
    assert _run(DictProvider("vllm_defect", {op: fn}), op, 0) == _expected(op, Status.FAIL), what


# ---------------------------------------------------------------- the fp8 ops' torch path and refusals


@pytest.mark.parametrize("op", ["paged_attention_fp8", "reshape_and_cache_fp8"])
def test_torch_native_fp8_ops_pass(op: str) -> None:
    provider = DictProvider("torch_native", {op: get_op(op).native})
    assert _run(provider, op, 1, dtypes=["fp32", "bf16", "fp16"]) == dict.fromkeys(["fp32", "bf16", "fp16"],
                                                                                    Status.PASS)


def test_fp8_case_scales_must_be_distinct_powers_of_two() -> None:
    model = get_op("paged_attention_fp8").case_model
    base = CASES["paged_attention_fp8"][0]
    with pytest.raises(ValueError, match="power of two"):
        model.model_validate({**base, "k_scale": 0.05})
    with pytest.raises(ValueError, match="must differ"):
        model.model_validate({**base, "k_scale": 0.25, "v_scale": 0.25})


@pytest.mark.skipif(not FP8_HERE, reason="the fp8 head-size rule is CPU_ATTN's on AVX-512/AMX hosts")
def test_head_size_the_backend_refuses_for_fp8_reports_vllms_reason() -> None:
    d80 = [{"name": "d80", "batch": 2, "max_seq_len": 40, "num_q_heads": 4, "num_kv_heads": 2, "head_size": 80}]
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=Path("."), model=ModelSpec())
    (outcome,) = OpCheck(VllmProvider()).run(ctx, OpCheckParams(op="paged_attention_fp8", dtypes=["fp32"], cases=d80))
    assert outcome.status is not Status.PASS
    assert "FP8 KV cache requires head_size divisible by 32" in outcome.message
