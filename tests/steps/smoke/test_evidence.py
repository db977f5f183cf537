"""Every step-2 check writes its details through its kind's evidence model: what a check
stores parses back as that model with no undeclared key, in passing and failing outcomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.base.schemas.smoke_evidence import SMOKE_EVIDENCE
from adaptcheck.ladder.check import Check, NoParams, Outcome
from adaptcheck.steps.smoke.checks import (
    AllocFreeCheck,
    DeviceVisibleCheck,
    DtypeProbeCheck,
    FillZeroCheck,
    MatmulCheck,
    RoundTripCheck,
    SynchronizeCheck,
)
from adaptcheck.steps.smoke.device import SynchronizeParams
from adaptcheck.steps.smoke.matmul import MatmulParams
from adaptcheck.steps.smoke.memory import AllocFreeParams, FillZeroParams, RoundTripParams
from tests.steps.smoke import helpers as H

CASES: list[tuple[str, Check, object, object]] = [
    ("visible", DeviceVisibleCheck(), NoParams(), None),
    ("visible-unavailable", DeviceVisibleCheck(), NoParams(), H.UnavailableBackend()),
    ("synchronize", SynchronizeCheck(), SynchronizeParams(elements=1024, iterations=4), None),
    ("dtypes", DtypeProbeCheck(), NoParams(), H.EveryDtypeBackend()),
    ("alloc-rss", AllocFreeCheck(), AllocFreeParams(size_mib=4, repeats=2), None),
    ("alloc-allocator", AllocFreeCheck(), AllocFreeParams(size_mib=4, repeats=2), H.AllocatorStatsBackend()),
    ("alloc-reduced", AllocFreeCheck(), AllocFreeParams(size_mib=64, repeats=1), H.SmallFreeMemoryBackend()),
    ("roundtrip", RoundTripCheck(), RoundTripParams(size_mib=1), None),
    ("roundtrip-flipped-bit", RoundTripCheck(H.FlipBitOps()), RoundTripParams(size_mib=1), None),
    ("fill", FillZeroCheck(), FillZeroParams(max_mib=2), None),
    ("fill-missed-element", FillZeroCheck(H.MissOneFillOps()), FillZeroParams(max_mib=2), None),
    ("matmul", MatmulCheck(), MatmulParams(dtypes=["fp32", "bf16"], budget_s=0.2, max_n=64, max_k=256), None),
    ("matmul-nan", MatmulCheck(H.NanOps()), MatmulParams(dtypes=["fp32"], budget_s=0.2, max_n=64, max_k=256), None),
    ("matmul-undeclared", MatmulCheck(), MatmulParams(dtypes=["fp16"], budget_s=0.2, max_n=64, max_k=256),
     H.Fp32OnlyBackend()),
]


@pytest.mark.parametrize("check, params, backend", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_stored_details_are_the_kinds_evidence(tmp_path: Path, check: Check, params: object, backend: object) -> None:
    out = check.run(H.make_ctx(tmp_path, backend), params)  # type: ignore[arg-type]
    outcomes: list[Outcome] = out if isinstance(out, list) else [out]
    model = SMOKE_EVIDENCE[check.kind]
    for o in outcomes:
        assert o.details, o.message
        evidence = model.parse(o.details)
        assert evidence.extras == {}
        assert evidence.dump() == o.details
