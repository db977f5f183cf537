"""smoke.dtypes: per-dtype table; declared dtypes must work, undeclared are informational."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adaptcheck.base.dtypes import ALL_DTYPES
from adaptcheck.ladder.check import NoParams
from adaptcheck.steps.smoke.dtypes import DtypeProbeCheck
from adaptcheck.steps.smoke.ops import DeviceOps

from .helpers import (
    FAIL,
    PASS,
    EveryDtypeBackend,
    FlipBitOps,
    LowPrecisionAccumulationOps,
    NoFp8Backend,
    make_ctx,
)


def test_cpu_declared_dtypes_work_and_table_is_complete(tmp_path: Path) -> None:
    o = DtypeProbeCheck().run(make_ctx(tmp_path), NoParams())
    assert o.status == PASS, o.message
    table = o.details["dtypes"]
    assert list(table) == list(ALL_DTYPES)
    for name in ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"):
        assert table[name]["declared"] and table[name]["works"], table[name]
    assert set(table["fp32"]["tests"]) == {"create", "add", "matmul", "cast_roundtrip"}
    assert set(table["int8"]["tests"]) == {"create", "add", "cast_roundtrip", "matmul"}
    assert table["int8"]["info"]["matmul_path"] in {"torch._int_mm", "int32 matmul"}
    undeclared = DtypeProbeCheck().run(make_ctx(tmp_path, NoFp8Backend()), NoParams()).details["dtypes"]
    assert undeclared["fp8_e4m3"]["declared"] is False and undeclared["fp8_e4m3"]["works"]  # tried, informational


def test_fp8_saturation_is_checked_with_clamp(tmp_path: Path) -> None:
    o = DtypeProbeCheck().run(make_ctx(tmp_path, EveryDtypeBackend()), NoParams())
    assert o.status == PASS, o.message
    e4m3 = o.details["dtypes"]["fp8_e4m3"]
    assert e4m3["tests"] == {"create": "ok", "cast_roundtrip": "ok", "saturation": "ok"}
    assert e4m3["info"]["max"] == 448.0
    assert "1e+30" in e4m3["info"]["unclamped_cast"]  # what a plain cast does is recorded
    assert o.details["dtypes"]["fp8_e5m2"]["info"]["max"] == 57344.0


def test_declared_dtype_that_is_broken_fails(tmp_path: Path) -> None:
    ops = FlipBitOps(element=5, only=(torch.float8_e4m3fn,))
    o = DtypeProbeCheck(ops).run(make_ctx(tmp_path, EveryDtypeBackend()), NoParams())
    assert o.status == FAIL and "fp8_e4m3" in o.message
    assert o.details["dtypes"]["fp8_e4m3"]["tests"]["create"].startswith("copy changed 1 of 256")


def test_undeclared_broken_dtype_does_not_fail(tmp_path: Path) -> None:
    ops = FlipBitOps(element=5, only=(torch.float8_e4m3fn,))
    o = DtypeProbeCheck(ops).run(make_ctx(tmp_path, NoFp8Backend()), NoParams())
    assert o.status == PASS
    assert o.details["dtypes"]["fp8_e4m3"]["works"] is False


def test_broken_matmul_of_a_declared_float_dtype_fails(tmp_path: Path) -> None:
    # fp16 accumulation is exact for these small integers, so use a matmul that is just wrong.
    class OffByOneMatmul(DeviceOps):
        def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            c = torch.matmul(a, b)
            return c + 1 if a.dtype == torch.bfloat16 else c

    o = DtypeProbeCheck(OffByOneMatmul()).run(make_ctx(tmp_path), NoParams())
    assert o.status == FAIL and "bf16" in o.message
    assert o.details["dtypes"]["bf16"]["tests"]["matmul"].startswith("256 of 256")
    # exact small-integer products survive even a low-precision accumulator: dtypes is a
    # capability probe, the numerics verdict is smoke.matmul's
    assert DtypeProbeCheck(LowPrecisionAccumulationOps()).run(make_ctx(tmp_path), NoParams()).status == PASS


def test_no_int8_matmul_path_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoIntMatmul(DeviceOps):
        def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            if not a.is_floating_point():
                raise RuntimeError("addmm not implemented for 'Int'")
            return torch.matmul(a, b)

    monkeypatch.delattr(torch, "_int_mm", raising=False)
    o = DtypeProbeCheck(NoIntMatmul()).run(make_ctx(tmp_path), NoParams())
    assert o.status == FAIL and "int8" in o.message
    row = o.details["dtypes"]["int8"]
    assert row["tests"]["matmul"].startswith("no int8 matmul path works")
    assert row["info"]["matmul_attempts"]["torch._int_mm"] == "absent in this torch"
