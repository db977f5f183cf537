"""smoke.alloc_free, smoke.roundtrip, smoke.fill_zero: pass on the CPU, fail on wrong devices."""

from __future__ import annotations

from pathlib import Path

import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.steps.smoke.memory import (
    AllocFreeCheck,
    AllocFreeParams,
    FillZeroCheck,
    FillZeroParams,
    RoundTripCheck,
    RoundTripParams,
)

from .helpers import (
    FAIL,
    PASS,
    SKIP,
    AllocatorStatsBackend,
    BlindCountOps,
    CountingOps,
    EveryDtypeBackend,
    FlipBitOps,
    Fp32OnlyBackend,
    LeakingOps,
    MisplacedBackend,
    MissLastZeroOps,
    MissOneFillOps,
    NanCanonicalisingOps,
    NoFp8Backend,
    SignedZeroLosingOps,
    SmallFreeMemoryBackend,
    make_ctx,
)

# --- alloc / free ---------------------------------------------------------------------------------


def test_alloc_free_on_cpu_uses_rss_and_passes(tmp_path: Path) -> None:
    o = AllocFreeCheck().run(make_ctx(tmp_path), AllocFreeParams(size_mib=64, repeats=2))
    assert o.status == PASS, o.message
    assert o.metrics["mode"] == "rss" and "RSS" in o.details["evidence"]
    assert o.metrics["rss_peak"] - o.metrics["rss_before"] >= 32 * 2**20


def test_alloc_free_leak_is_caught_by_rss(tmp_path: Path) -> None:
    ops = LeakingOps()
    o = AllocFreeCheck(ops).run(make_ctx(tmp_path), AllocFreeParams(size_mib=64, repeats=2))
    assert o.status == FAIL and "above baseline after release" in o.message


def test_alloc_free_with_allocator_stats(tmp_path: Path) -> None:
    backend = AllocatorStatsBackend()
    o = AllocFreeCheck(CountingOps(backend)).run(make_ctx(tmp_path, backend), AllocFreeParams(size_mib=8, repeats=3))
    assert o.status == PASS, o.message
    assert o.metrics["mode"] == "allocator"
    assert o.metrics["allocated_before"] == o.metrics["allocated_after"] == 0
    assert o.metrics["peak_allocated"] == 8 * 2**20


def test_alloc_free_allocator_leak_fails(tmp_path: Path) -> None:
    backend = AllocatorStatsBackend()
    o = AllocFreeCheck(CountingOps(backend, leak=True)).run(make_ctx(tmp_path, backend),
                                                            AllocFreeParams(size_mib=4, repeats=2))
    assert o.status == FAIL and "after release" in o.message


def test_alloc_free_shrinks_to_free_memory(tmp_path: Path) -> None:
    o = AllocFreeCheck().run(make_ctx(tmp_path, SmallFreeMemoryBackend()), AllocFreeParams(size_mib=1024, repeats=1))
    assert o.details["reduced_to_mib"] == 32  # half of the 64 MiB the backend reports free
    assert o.metrics["size_mib"] == 32


# --- round trip -------------------------------------------------------------------------------------


def test_roundtrip_bit_exact_on_cpu(tmp_path: Path) -> None:
    o = RoundTripCheck().run(make_ctx(tmp_path), RoundTripParams(size_mib=2))
    assert o.status == PASS, o.message
    table = o.details["dtypes"]
    assert {n for n, row in table.items() if row["declared"]} == set(CpuBackend.dtypes)
    assert all(row["ok"] for row in table.values())
    assert table["fp32"]["whole"]["mismatched"] == 0 and table["fp32"]["whole"]["elements"] > 80_000  # 2 MiB over 6 dtypes
    assert o.metrics["dtypes_judged"] == len(CpuBackend.dtypes)


def test_roundtrip_one_flipped_bit_fails(tmp_path: Path) -> None:
    o = RoundTripCheck(FlipBitOps(element=12345, bit=3)).run(make_ctx(tmp_path), RoundTripParams(size_mib=1))
    assert o.status == FAIL
    row = o.details["dtypes"]["fp32"]["whole"]
    assert row["mismatched"] == 1 and row["first_index"] == 12345


def test_roundtrip_nan_canonicalisation_fails(tmp_path: Path) -> None:
    o = RoundTripCheck(NanCanonicalisingOps()).run(make_ctx(tmp_path), RoundTripParams(size_mib=1, dtypes=["fp32"]))
    assert o.status == FAIL and "fp32" in o.message


def test_roundtrip_lost_negative_zero_fails(tmp_path: Path) -> None:
    o = RoundTripCheck(SignedZeroLosingOps()).run(make_ctx(tmp_path), RoundTripParams(size_mib=1, dtypes=["bf16"]))
    assert o.status == FAIL


def test_roundtrip_undeclared_dtype_is_informational(tmp_path: Path) -> None:
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    o = RoundTripCheck(FlipBitOps(only=fp8)).run(make_ctx(tmp_path, NoFp8Backend()), RoundTripParams(size_mib=1))
    assert o.status == PASS  # this backend does not declare fp8
    assert o.details["dtypes"]["fp8_e4m3"]["ok"] is False and o.details["dtypes"]["fp8_e4m3"]["declared"] is False
    declared = RoundTripCheck(FlipBitOps(only=fp8)).run(make_ctx(tmp_path, EveryDtypeBackend()), RoundTripParams(size_mib=1))
    assert declared.status == FAIL and "fp8_e4m3" in declared.message


def test_roundtrip_nothing_declared_is_not_applicable(tmp_path: Path) -> None:
    o = RoundTripCheck().run(make_ctx(tmp_path, Fp32OnlyBackend()), RoundTripParams(size_mib=1, dtypes=["bf16"]))
    assert o.status == SKIP and o.applicable is False


def test_roundtrip_landing_on_the_wrong_device_fails(tmp_path: Path) -> None:
    o = RoundTripCheck().run(make_ctx(tmp_path, MisplacedBackend()), RoundTripParams(size_mib=1, dtypes=["fp32"]))
    assert o.status == FAIL and "not on the xpu device" in o.message


# --- fill / zero -------------------------------------------------------------------------------------

FILL = FillZeroParams(max_mib=16, fraction_of_free=0.5)


def test_fill_zero_passes_with_positive_control(tmp_path: Path) -> None:
    o = FillZeroCheck().run(make_ctx(tmp_path), FILL)
    assert o.status == PASS, o.message
    assert o.metrics["size_mib"] == 16 and o.metrics["elements"] == 2 * 2**20
    phases = o.details["phases"]
    assert set(phases) == {"pattern_5a5a5a5a5a5a5a5a", "pattern_a5a5a5a5a5a5a5a5", "row_index", "zero",
                           "positive_control"}
    assert phases["positive_control"] == {"planted": 3, "counted": 3}
    assert o.details["sized_by"] == "max_mib"


def test_fill_missing_one_element_fails(tmp_path: Path) -> None:
    o = FillZeroCheck(MissOneFillOps()).run(make_ctx(tmp_path), FILL)
    assert o.status == FAIL
    assert o.details["phases"]["pattern_5a5a5a5a5a5a5a5a"]["device_mismatches"] == 1


def test_zero_stopping_short_fails(tmp_path: Path) -> None:
    o = FillZeroCheck(MissLastZeroOps()).run(make_ctx(tmp_path), FILL)
    assert o.status == FAIL and "zero: 1 elements wrong" in o.message
    assert o.details["phases"]["zero"]["host_sample_mismatches"] == 1  # the last row is always sampled


def test_blind_device_reduction_is_caught_by_the_positive_control(tmp_path: Path) -> None:
    o = FillZeroCheck(BlindCountOps()).run(make_ctx(tmp_path), FILL)
    assert o.status == FAIL and "positive control" in o.message


def test_fill_sized_by_free_memory(tmp_path: Path) -> None:
    o = FillZeroCheck().run(make_ctx(tmp_path, SmallFreeMemoryBackend()), FillZeroParams(max_mib=1024, fraction_of_free=0.25))
    assert o.status == PASS
    assert o.details["sized_by"] == "fraction_of_free" and o.metrics["size_mib"] == 16
