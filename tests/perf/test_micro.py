"""adaptcheck.perf.micro / attention / collectives: work and traffic formulas checked against
independent counts, sizing, and the contract rows they produce.

FLOP counts are checked against ``torch.utils.flop_counter.FlopCounterMode`` run on the very
callable a benchmark times (SDPA through torch's math backend, which the counter sees as
two batched matmuls over the full score matrix), so a benchmark that miscounts its own work
— a missing factor 2, a causal mask not halved, a GQA head count swapped — fails here.
Problems are tiny and timing budgets zero: nothing asserts a speed.
"""

from __future__ import annotations

import math
from typing import Any, get_args

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.dtypes import GemmDtype
from adaptcheck.collectives.bandwidth import (
    busbw_factor,
    collective_row,
    elements_for_bytes,
    full_tensor_bytes,
)
from adaptcheck.perf.attention import (
    bench_decode,
    bench_prefill,
    decode_bytes,
    decode_flops,
    prefill_bytes,
    prefill_flops,
    sdpa_callable,
)
from adaptcheck.perf.micro import (
    GEMM_DTYPES,
    TimingOptions,
    bench_copy,
    bench_gemm,
    bench_host_device,
    fit_bytes,
    fit_gemm_shape,
    gemm_bytes,
    gemm_callable,
    gemm_flops,
    make_row,
    peak_dtype,
    probe_gemm_rate,
)
from adaptcheck.perf.peaks import Peak
from adaptcheck.perf.timing import summarize

FAST = TimingOptions(warmup=1, min_reps=2, max_reps=2, budget_s=0.0, max_call_s=5.0)
CPU = CpuBackend()
PEAK = Peak(device="test", entry="test", source="test", verified=True,
            flops={"fp32": 1e11, "bf16": 4e11, "tf32": 2e11}, memory_bw=1e10, host_link_bw=5e9, interconnect_bw=2e9)
CONTRACT_KEYS = {"name", "dtype", "params", "flops", "bytes", "time_s", "achieved", "efficiency",
                 "arithmetic_intensity", "ridge_point", "bound", "status", "reason", "extra"}


def counted(fn: Any) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


# --- GEMM ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("m", "n", "k"), [(16, 24, 40), (1, 64, 32), (33, 7, 5)])
def test_gemm_flops_match_an_independent_count(m: int, n: int, k: int) -> None:
    fn = gemm_callable("fp32", m, n, k, torch.device("cpu"))
    assert counted(fn) == gemm_flops(m, n, k) == 2 * m * n * k


def test_gemm_bytes_are_the_minimum_traffic() -> None:
    assert gemm_bytes(2, 3, 4, "bf16") == (2 * 4 + 4 * 3 + 2 * 3) * 2
    assert gemm_bytes(2, 3, 4, "fp32") == (2 * 4 + 4 * 3 + 2 * 3) * 4
    assert gemm_bytes(2, 3, 4, "int8") == (2 * 4 + 4 * 3) * 1 + 2 * 3 * 4  # int32 result
    assert gemm_bytes(2, 3, 4, "fp8_e4m3") == (2 * 4 + 4 * 3) * 1 + 2 * 3 * 2  # bf16 result


def test_gemm_callables_compute_the_product() -> None:
    for dtype in ("fp32", "bf16", "int8"):
        fn = gemm_callable(dtype, 8, 16, 32, torch.device("cpu"))
        out = fn()
        assert isinstance(out, torch.Tensor) and out.shape == (8, 16)
    assert gemm_callable("int8", 8, 16, 32, torch.device("cpu"))().dtype == torch.int32


def test_gemm_row_counts_the_work_it_timed() -> None:
    rate, size = probe_gemm_rate("fp32", CPU, 0, limit_s=0.001, max_size=128)
    assert rate > 0 and size == 128
    row = bench_gemm("fp32", "tiny", 32, 48, 64, CPU, 0, PEAK, FAST, rate).dump()
    assert set(row) == CONTRACT_KEYS and row["status"] == "ok"
    assert row["flops"] == counted(gemm_callable("fp32", 32, 48, 64, torch.device("cpu")))
    assert row["bytes"] == gemm_bytes(32, 48, 64, "fp32")
    med = row["time_s"]["median"]
    assert row["achieved"]["flops_per_s"] == pytest.approx(row["flops"] / med)
    assert row["arithmetic_intensity"] == pytest.approx(row["flops"] / row["bytes"])
    assert row["ridge_point"] == pytest.approx(1e11 / 1e10)
    ceiling = 1e11 if row["bound"] == "compute" else 1e10
    achieved = row["achieved"]["flops_per_s"] if row["bound"] == "compute" else row["achieved"]["bytes_per_s"]
    assert row["efficiency"] == pytest.approx(achieved / ceiling)


def test_fit_gemm_shape_shrinks_m_then_n_k() -> None:
    # 1 GFLOP/s and 10 s: 1e10 FLOP per call; m halves from 2048 to 256 (8.6e9 FLOP)
    assert fit_gemm_shape(2048, 4096, 4096, 1e9, 10.0) == (256, 4096, 4096)
    # 0.1 s: 1e8 FLOP; m stops at 64, then n and k halve
    m, n, k = fit_gemm_shape(2048, 4096, 4096, 1e9, 0.1)  # type: ignore[misc]
    assert m == 64 and gemm_flops(m, n, k) <= 1e8 and min(n, k) >= 256
    assert fit_gemm_shape(8, 4096, 4096, 1e12, 1.0) == (8, 4096, 4096)  # fits: untouched
    assert fit_gemm_shape(2048, 4096, 4096, 1e3, 0.1, min_m=64) is None  # even the floor is too slow


def test_a_too_slow_dtype_is_not_run_with_the_probed_rate() -> None:
    row = bench_gemm("fp32", "prefill", 2048, 4096, 4096, CPU, 0, PEAK, FAST, rate=1e3).dump()
    assert row["status"] == "not_run" and "too slow at this size on this device" in row["reason"]
    assert "1 kFLOP/s" in row["reason"] and row["time_s"] is None


def test_shrunk_row_says_so() -> None:
    row = bench_gemm("fp32", "prefill", 256, 256, 256, CPU, 0, PEAK,
                     TimingOptions(warmup=1, min_reps=1, max_reps=1, budget_s=0.0, max_call_s=0.02), rate=1e9).dump()
    assert row["status"] == "ok" and row["params"] == {"m": 128, "n": 256, "k": 256}
    assert row["extra"]["requested"] == {"m": 256, "n": 256, "k": 256} and "would take" in row["extra"]["shrunk"]
    assert row["name"].startswith(f"prefill m={row['params']['m']} ")


def test_fp32_is_held_to_tf32_only_when_torch_allows_it() -> None:
    assert peak_dtype("fp32", PEAK) == "fp32"
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert peak_dtype("fp32", PEAK) == "tf32"
        assert peak_dtype("bf16", PEAK) == "bf16"
    finally:
        torch.set_float32_matmul_precision(previous)


def test_auto_selection_knows_every_gemm_dtype_params_accept() -> None:
    assert sorted(GEMM_DTYPES) == sorted(get_args(GemmDtype))


def test_fp8_gemm_operands_follow_the_backend_flavour(monkeypatch: pytest.MonkeyPatch) -> None:
    class Fnuz(CpuBackend):
        fp8_flavour = "e4m3fnuz"

    seen: list[tuple[torch.dtype, torch.dtype]] = []
    # Record what _scaled_mm is handed instead of running it (the CPU has no fnuz GEMM).
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, b, **_: seen.append((a.dtype, b.dtype)))
    gemm_callable("fp8_e4m3", 16, 16, 16, torch.device("cpu"), CPU)()
    gemm_callable("fp8_e4m3", 16, 16, 16, torch.device("cpu"), Fnuz())()
    assert seen == [(torch.float8_e4m3fn,) * 2, (torch.float8_e4m3fnuz,) * 2]


# --- rows ------------------------------------------------------------------------------------

def test_make_row_efficiency_is_against_the_row_dtype() -> None:
    t = summarize([0.5, 0.5, 0.5])
    row = make_row("x", "fp32", {}, 5e10, 1.0, t, PEAK).dump()  # 1e11 FLOP/s: compute-bound, 100 % of fp32
    assert row["bound"] == "compute" and row["efficiency"] == pytest.approx(1.0)
    row = make_row("x", "bf16", {}, 5e10, 1.0, t, PEAK).dump()  # same rate is 25 % of bf16
    assert row["efficiency"] == pytest.approx(0.25)
    row = make_row("x", "fp32", {}, 5e10, 1.0, t, PEAK, peak_key="tf32").dump()
    assert row["efficiency"] == pytest.approx(0.5) and row["extra"]["peak_dtype"] == "tf32"
    wrong = make_row("x", "fp32", {}, 2 * 5e10, 1.0, t, PEAK).dump()  # a doubled count shows as 200 %
    assert wrong["efficiency"] == pytest.approx(2.0)


def test_make_row_without_a_peak_or_with_a_broken_timing() -> None:
    row = make_row("x", "fp32", {}, 1e9, 1e6, summarize([1.0]), None).dump()
    assert row["efficiency"] is None and row["bound"] is None and row["ridge_point"] is None
    row = make_row("x", "fp32", {}, 1e9, 1e6, summarize([0.0]), PEAK).dump()
    assert row["achieved"] == {"flops_per_s": None, "bytes_per_s": None} and row["efficiency"] is None


# --- memory and host link --------------------------------------------------------------------------

def test_copy_row_counts_read_and_write() -> None:
    row = bench_copy(1 << 20, CPU, 0, PEAK, FAST).dump()
    assert set(row) == CONTRACT_KEYS and row["status"] == "ok"
    assert row["bytes"] == 2 * (1 << 20) and row["flops"] is None and row["arithmetic_intensity"] is None
    assert row["bound"] == "memory"
    assert row["efficiency"] == pytest.approx(row["achieved"]["bytes_per_s"] / 1e10)


def test_buffers_are_capped_by_free_memory_only() -> None:
    class Small(CpuBackend):
        def free_memory_bytes(self, index: int = 0) -> int | None:
            return 64 << 20

    assert fit_bytes(1 << 19, Small(), 0, 2) == 1 << 19  # small sizes stay as asked
    assert fit_bytes(1 << 30, Small(), 0, 2) == 16 << 20  # two buffers in half the free memory
    assert fit_bytes(1 << 30, CpuBackend(), 0, 2) <= 1 << 30


def test_host_device_row_is_link_bound() -> None:
    row = bench_host_device(1 << 20, "h2d", CPU, 0, PEAK, FAST, pinned=False).dump()
    assert row["bound"] == "link" and row["bytes"] == 1 << 20 and row["params"]["direction"] == "h2d"
    assert row["efficiency"] == pytest.approx(row["achieved"]["bytes_per_s"] / 5e9)


# --- attention -------------------------------------------------------------------------------------

def test_prefill_flops_match_the_counter_halved_for_the_causal_mask() -> None:
    b, hq, hkv, s, d = 2, 8, 2, 64, 32
    fn = sdpa_callable("fp32", b, hq, hkv, s, s, d, True, CPU, 0)
    assert counted(fn) == 2 * prefill_flops(b, hq, s, d)  # the math path computes the full square
    exact = 4 * b * hq * d * s * (s + 1) // 2  # scores actually needed under the mask
    assert math.isclose(prefill_flops(b, hq, s, d), exact, rel_tol=1 / s)


def test_decode_flops_match_the_counter() -> None:
    b, hq, hkv, kv, d = 3, 8, 2, 100, 16
    fn = sdpa_callable("fp32", b, hq, hkv, 1, kv, d, False, CPU, 0)
    assert counted(fn) == decode_flops(b, hq, kv, d) == 4 * b * hq * kv * d


def test_attention_bytes() -> None:
    assert prefill_bytes(1, 32, 8, 10, 128, 2) == (2 * 32 * 10 * 128 + 2 * 8 * 10 * 128) * 2
    assert decode_bytes(4, 32, 8, 1000, 128, 2) == (2 * 4 * 32 * 128 + 2 * 4 * 8 * 1000 * 128) * 2


def test_attention_rows() -> None:
    pre = bench_prefill("fp32", 1, 64, 4, 2, 16, CPU, 0, PEAK, FAST).dump()
    assert pre["status"] == "ok" and pre["params"]["causal"] and pre["flops"] == prefill_flops(1, 4, 64, 16)
    dec = bench_decode("fp32", 2, 256, 4, 2, 16, CPU, 0, PEAK, FAST).dump()
    assert dec["status"] == "ok" and dec["bound"] == "memory"  # a KV-cache read: intensity ≈ 2·hq/hkv
    assert dec["bytes"] == decode_bytes(2, 4, 2, 256, 16, 4)
    bad = bench_prefill("fp32", 1, 64, 6, 4, 16, CPU, 0, PEAK, FAST).dump()
    assert bad["status"] == "not_run" and "multiple" in bad["reason"]


def test_attention_shrinks_a_too_long_prefill() -> None:
    row = bench_prefill("fp32", 1, 4096, 4, 1, 16, CPU, 0, PEAK,
                        TimingOptions(warmup=1, min_reps=1, max_reps=1, budget_s=0.0, max_call_s=1e-4)).dump()
    assert row["status"] in ("ok", "not_run")
    if row["status"] == "ok":
        assert row["params"]["seq_len"] < 4096 and "shrunk" in row["extra"]
    else:
        assert "too slow" in row["reason"]


# --- collectives -----------------------------------------------------------------------------------

def test_nccl_tests_bus_factors() -> None:
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 8) == busbw_factor("reduce_scatter", 8) == busbw_factor("all_to_all", 8) \
        == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", 8) == 1.0
    assert busbw_factor("all_reduce", 2) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("all_sum", 2)


def test_full_tensor_sizes() -> None:
    mib = 1 << 20
    assert elements_for_bytes("all_reduce", 4, mib, 2) == mib // 2
    assert elements_for_bytes("all_gather", 4, mib, 2) == mib // 8  # S is the gathered output
    assert full_tensor_bytes("all_gather", 4, mib // 8, 2) == mib
    assert full_tensor_bytes("reduce_scatter", 4, 10, 4) == 160
    assert elements_for_bytes("all_to_all", 8, 1, 4) == 1


def test_collective_row_algbw_busbw_and_efficiency() -> None:
    t = summarize([0.01, 0.01, 0.01])
    row = collective_row("all_reduce", "bf16", 4, 1 << 20, 2, t, PEAK, rank_medians=[0.009, 0.01]).dump()
    size = (1 << 20) * 2
    assert row["bytes"] == size and row["extra"]["algbw"] == pytest.approx(size / 0.01)
    assert row["extra"]["busbw"] == pytest.approx(size / 0.01 * 1.5)
    assert row["bound"] == "network" and row["ridge_point"] is None
    assert row["efficiency"] == pytest.approx(size / 0.01 * 1.5 / 2e9)
    assert row["extra"]["rank_median_s"] == [0.009, 0.01]


# --- issue 14: rows that fit in the cache, the memory reference, above-peak rows, the median's CI ---

def _ctx(tmp_path: Any) -> Any:
    from adaptcheck.base.schemas.ladder import ModelSpec
    from adaptcheck.ladder.check import CheckContext

    return CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec())


def test_last_level_cache_counts_each_shared_instance_once(tmp_path: Any) -> None:
    from adaptcheck.perf.caches import host_llc, residency

    for cpu in range(8):
        for idx, (level, kind, size, shared) in enumerate([
                (1, "Instruction", "32K", str(cpu)), (1, "Data", "32K", str(cpu)), (2, "Unified", "1024K", str(cpu)),
                (3, "Unified", "32768K", "0-3" if cpu < 4 else "4-7")]):
            d = tmp_path / f"cpu{cpu}" / "cache" / f"index{idx}"
            d.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (d / name).write_text(f"{value}\n")
    llc = host_llc(tmp_path)
    assert llc is not None and (llc.level, llc.instances, llc.total_bytes) == (3, 2, 64 << 20)
    assert "2 × 32 MiB" in llc.describe()
    assert residency(32 << 20, llc) == "cache-resident"
    assert residency(128 << 20, llc) == "partly cache-resident"  # 2 × the LLC: part of it still hits
    assert residency(256 << 20, llc) is None  # ≥ 4 × the LLC: DRAM
    assert host_llc(tmp_path / "nothing") is None and residency(1, None) is None


def test_memory_check_labels_cache_rows_and_adds_a_dram_row(tmp_path: Any) -> None:
    from adaptcheck.perf.caches import LastLevelCache
    from adaptcheck.steps.perf.common import LLC_KEY, MEMORY_REFERENCE_KEY
    from adaptcheck.steps.perf.micro import MemoryBandwidthCheck, MemoryParams

    ctx = _ctx(tmp_path)
    ctx.scratch[LLC_KEY] = LastLevelCache(level=3, total_bytes=8 << 20, instances=1, source="test")
    ctx.scratch[MEMORY_REFERENCE_KEY] = (1e13, "test reference")  # far above any copy: no lifting
    out = MemoryBandwidthCheck().run(ctx, MemoryParams(sizes_mib=[1.0], budget_s=0, min_reps=2, max_reps=2))
    assert out.status.value == "pass", out.message
    small, dram = out.details["rows"]
    assert small["bound"] == "cache" and small["efficiency"] is None
    assert small["extra"]["cache"].startswith("cache-resident: footprint 2 MiB < 4 × the L3 8 MiB")
    # No listed size was well beyond the cache: a 128 MiB copy (footprint 256 MiB ≥ 4 × 8 MiB) was added.
    assert dram["params"]["bytes"] == 128 << 20 and dram["bound"] == "memory" and dram["efficiency"] is not None
    assert out.metrics["memory_copy_gbps"] == pytest.approx(dram["achieved"]["bytes_per_s"] / 1e9)
    assert "in cache, not held to the memory peak: copy 1 MiB" in out.message


def test_a_faster_dram_copy_lifts_a_disturbed_reference(tmp_path: Any) -> None:
    from adaptcheck.perf.caches import LastLevelCache
    from adaptcheck.steps.perf.common import LLC_KEY, MEMORY_REFERENCE_KEY
    from adaptcheck.steps.perf.micro import MemoryBandwidthCheck, MemoryParams

    ctx = _ctx(tmp_path)
    ctx.scratch[LLC_KEY] = LastLevelCache(level=3, total_bytes=1 << 20, instances=1, source="test")
    ctx.scratch[MEMORY_REFERENCE_KEY] = (1e6, "a reference measured while the host was busy")  # 1 MB/s
    out = MemoryBandwidthCheck().run(ctx, MemoryParams(sizes_mib=[8.0], budget_s=0, min_reps=3, max_reps=3))
    row = out.details["rows"][0]
    best = row["bytes"] / row["time_s"]["min"]
    assert out.status.value == "pass" and row["efficiency"] <= 1.0
    assert out.details["peak"]["memory_bw"] == pytest.approx(best)
    assert ctx.scratch[MEMORY_REFERENCE_KEY][0] == pytest.approx(best)  # later checks use it too
    assert "lifted from 1 MB/s" in out.details["peak"]["derivation"][-1]


def test_above_the_peak_is_flagged_and_beyond_noise_is_an_error(tmp_path: Any) -> None:
    from adaptcheck.steps.perf.common import verdict

    flops = 1e9  # PEAK fp32 = 1e11 FLOP/s: 10 ms per call is 100 %
    noisy = summarize([0.0098, 0.0085, 0.0099, 0.0120, 0.0097, 0.0130, 0.0099, 0.0125])  # median 9.9 ms: 101 %
    row = make_row("g", "fp32", {}, flops, 1.0, noisy, PEAK)
    assert (row.efficiency or 0) > 1.0
    out = verdict(_ctx(tmp_path), "gemm", [row], PEAK, {})
    assert out.status.value == "pass" and "above 100 % of the peak within timing noise: g fp32" in out.message
    assert out.details["above_peak"] == ["g fp32"] and "understates" in (row.extra.above_peak or "")
    assert "understates" in out.details["rows"][0]["extra"]["above_peak"]
    tight = summarize([0.0080, 0.0081, 0.0079, 0.0080, 0.0080, 0.0082, 0.0080, 0.0081])  # 125 %, CI within 1 %
    out = verdict(_ctx(tmp_path), "gemm", [make_row("g", "fp32", {}, flops, 1.0, tight, PEAK)], PEAK, {})
    assert out.status.value == "error" and "ran at 125% of the test peak" in out.message


def test_median_ci_ranks_and_coverage() -> None:
    import random

    from adaptcheck.perf.timing import median_ci

    assert median_ci([float(i) for i in range(1, 21)])[:2] == (6.0, 15.0)  # the textbook n = 20 ranks
    assert median_ci([float(i) for i in range(1, 101)])[:2] == (40.0, 61.0)
    lo, hi, coverage = median_ci([1.0, 2.0, 3.0])
    assert (lo, hi) == (1.0, 3.0) and coverage == pytest.approx(0.75)  # too few samples: [min, max], said so
    rng = random.Random(14)
    hits, trials = 0, 3000
    for _ in range(trials):  # right-skewed timings: lognormal, true median exactly 1
        lo, hi, coverage = median_ci(sorted(rng.lognormvariate(0.0, 0.5) for _ in range(15)))
        hits += lo <= 1.0 <= hi
    assert coverage >= 0.95 and hits / trials > 0.94


def test_sampling_stops_once_the_median_is_settled_and_says_when_it_is_not() -> None:
    import time

    from adaptcheck.perf.timing import time_callable

    began = time.perf_counter()
    loose = time_callable(lambda: None, CPU, min_reps=3, max_reps=1000, budget_s=5.0, ci_target=10.0)
    assert loose.n == 6 and loose.settled and time.perf_counter() - began < 2.0  # 6: first n with a 95 % CI
    strict = time_callable(lambda: None, CPU, min_reps=3, max_reps=40, budget_s=5.0, ci_target=1e-12)
    assert strict.n == 40 and not strict.settled and any("not settled" in n for n in strict.notes)
    assert strict.stats().dump()["settled"] is False and strict.stats().dump()["ci_target"] == 1e-12
