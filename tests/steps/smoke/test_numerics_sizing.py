"""Pure helpers of step 2: sizing arithmetic, reference comparison, bit-exact comparison."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.smoke.numerics import (
    MATMUL_TOLERANCES,
    MatmulTolerance,
    bit_diff,
    compare_to_reference,
    pattern_tensor,
)
from adaptcheck.steps.smoke.sizing import estimated_seconds, largest_fitting, probe_rate

# --- sizing -----------------------------------------------------------------------------------


def cubic_cost(rate: float) -> Callable[[int], float]:
    return lambda n: estimated_seconds(2.0 * n**3, (rate,))


def test_largest_fitting_picks_the_largest_multiple_within_budget() -> None:
    # 1 GFLOP/s and 1 s: 2n³ ≤ 1e9 → n ≤ 793.7 → 768 as a multiple of 32.
    assert largest_fitting(cubic_cost(1e9), 1.0, 32, 8192, 32) == 768
    # A device 1000× faster reaches the cap.
    assert largest_fitting(cubic_cost(1e12), 1.0, 32, 4096, 32) == 4096


def test_slow_rate_gets_small_size_and_never_below_the_floor() -> None:
    fast = largest_fitting(cubic_cost(150e9), 2.0, 32, 8192, 32)
    slow = largest_fitting(cubic_cost(0.4e9), 2.0, 32, 8192, 32)  # fp16 on a CPU without fp16 units
    assert slow < fast / 5
    assert slow == 736  # 2n³/0.4e9 ≤ 2 → n ≤ 736.8
    assert largest_fitting(cubic_cost(1.0), 1.0, 32, 8192, 32) == 32  # nothing fits: the floor still runs


def test_estimated_seconds_adds_device_and_reference() -> None:
    assert estimated_seconds(1e9, (1e9, 1e9)) == pytest.approx(2.0)
    # Both rates bound n: a fast device with a slow reference is limited by the reference.
    n = largest_fitting(lambda s: estimated_seconds(2.0 * s**3, (1e15, 1e9)), 1.0, 32, 16384, 32)
    assert n == 768


def test_largest_fitting_rejects_bad_multiple() -> None:
    with pytest.raises(ValueError):
        largest_fitting(cubic_cost(1e9), 1.0, 32, 64, 0)


def test_probe_rate_doubles_until_measurable_and_respects_limit() -> None:
    calls: list[int] = []

    def fake_run(n: int) -> float:  # a device at 1 GFLOP/s
        calls.append(n)
        return 2.0 * n**3 / 1e9

    p = probe_rate(fake_run, lambda n: 2.0 * n**3, 32, 8192, target_s=0.01)
    assert calls == [32, 64, 128, 256, 256]  # 256: 0.034 s ≥ 0.01 s, then confirmed once
    assert p.size == 256 and p.rate == pytest.approx(1e9)
    calls.clear()
    p = probe_rate(fake_run, lambda n: 2.0 * n**3, 32, 100, target_s=10.0)
    assert calls == [32, 64, 64] and p.size == 64  # 128 would exceed the limit


def test_probe_rate_growth_four_for_linear_work() -> None:
    seen: list[int] = []

    def fake_run(k: int) -> float:
        seen.append(k)
        return k * 1e-6

    probe_rate(fake_run, lambda k: float(k), 256, 65536, target_s=0.01, growth=4)
    assert seen == [256, 1024, 4096, 16384, 16384]
    with pytest.raises(ValueError):
        probe_rate(lambda k: 1.0, lambda k: 1.0, 1, 2, 1.0, growth=1)


def test_probe_keeps_the_faster_of_two_readings_at_the_final_size() -> None:
    readings = iter([0.5, 0.1])  # a one-off stall on the first reading
    p = probe_rate(lambda n: next(readings), lambda n: 1.0, 8, 8, target_s=0.01)
    assert p.seconds == 0.1


def test_zero_timer_reading_does_not_divide_by_zero() -> None:
    p = probe_rate(lambda n: 0.0, lambda n: 2.0 * n**3, 32, 64, 0.1)
    assert p.rate > 0 and math.isfinite(p.rate)


# --- comparison against float64 ------------------------------------------------------------------


def test_compare_identical_is_zero_error_and_unit_cosine() -> None:
    ref = torch.randn(8, 8, dtype=torch.float64)
    c = compare_to_reference(ref.clone(), ref)
    assert c.normalized_error == 0 and c.cosine == pytest.approx(1.0) and c.nonfinite == 0
    assert c.within(MATMUL_TOLERANCES["fp32"])


def test_compare_points_at_the_worst_element() -> None:
    ref = torch.ones(4, 5, dtype=torch.float64)
    got = ref.clone()
    got[2, 3] = 1.5
    c = compare_to_reference(got, ref)
    assert c.worst_index == (2, 3) and c.worst_got == 1.5 and c.worst_ref == 1.0
    assert c.normalized_error == pytest.approx(0.5)
    assert not c.within(MatmulTolerance(0.1))


def test_nan_or_inf_never_within_tolerance() -> None:
    ref = torch.ones(3, 3, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        got = ref.clone()
        got[1, 1] = bad
        c = compare_to_reference(got, ref)
        assert c.nonfinite == 1 and c.worst_index == (1, 1)
        assert not c.within(MatmulTolerance(1e9, cosine=-1.0))


def test_tolerance_table_is_the_design_policy() -> None:
    assert {k: v.normalized for k, v in MATMUL_TOLERANCES.items()} == {"fp32": 1e-5, "bf16": 1.6e-2, "fp16": 2e-3}
    assert all(v.cosine == 0.9999 for v in MATMUL_TOLERANCES.values())


# --- bit-exact comparison ------------------------------------------------------------------------


def test_one_flipped_bit_is_found_with_its_index() -> None:
    x = torch.randn(1000)
    y = x.clone()
    y.view(torch.int32)[417] ^= 1
    d = bit_diff(x, y)
    assert not d.exact and d.mismatched == 1 and d.first_index == 417
    assert d.expected_bits != d.got_bits and len(d.expected_bits) == 10  # 0x + 8 hex digits


def test_bit_compare_sees_what_float_compare_cannot() -> None:
    assert not bit_diff(torch.tensor([-0.0]), torch.tensor([0.0])).exact  # -0.0 == 0.0 as floats
    qnan = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    payload = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert not bit_diff(qnan, payload).exact  # both NaN
    assert bit_diff(payload, payload.clone()).exact  # NaN ≠ NaN as floats, but the bits are equal


def test_bit_diff_reports_dtype_or_shape_change() -> None:
    d = bit_diff(torch.zeros(4), torch.zeros(4, dtype=torch.float64))
    assert not d.exact and "float64" in d.problem


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"])
def test_narrow_dtypes_carry_every_bit_pattern(name: str) -> None:
    dtype = torch_dtype(name)
    t = pattern_tensor(name, dtype, 1 << 20, torch.Generator().manual_seed(0))
    size = t.element_size()
    bits = t.view(torch.uint8 if size == 1 else torch.int16).to(torch.int64)
    assert torch.unique(bits).numel() == 1 << (8 * size)
    assert t.numel() * size == pytest.approx(1 << 20, abs=size)


def test_fp32_patterns_include_the_special_values() -> None:
    t = pattern_tensor("fp32", torch.float32, 4096, torch.Generator().manual_seed(0))
    bits = set(t.view(torch.int32).tolist())
    for special in (0x00000000, 0x80000000 - (1 << 32), 0x7F800000, 0x7F800001, 0x00000001, 0x007FFFFF):
        assert special in bits
    assert torch.isnan(t).any() and torch.isinf(t).any()
    assert ((t != 0) & (t.abs() < torch.finfo(torch.float32).tiny)).any()  # a denormal


# --- device mismatch count ----------------------------------------------------------------------


def test_count_ne_chunks_and_broadcasts_per_row() -> None:
    from adaptcheck.steps.smoke.ops import DeviceOps

    ops = DeviceOps()
    ops.COUNT_CHUNK_ELEMENTS = 7  # several chunks over 20 rows of 5
    t = torch.arange(100).reshape(20, 5)
    expected = torch.arange(100).reshape(20, 5)
    assert ops.count_ne(t, expected) == 0
    t[0, 0], t[19, 4] = -1, -1
    assert ops.count_ne(t, expected) == 2
    assert ops.count_ne(torch.zeros(20, 5, dtype=torch.int64), torch.arange(20).unsqueeze(1)) == 95  # row r holds r
    assert ops.count_ne(torch.full((10,), float("nan")), 1.0) == 10  # NaN is a mismatch
    assert ops.count_ne(torch.tensor([-0.0]), 0.0) == 0  # value compare for floats (bit-exactness is roundtrip's job)
