"""The step-2 kinds are registered under their names, and both shipped ladders' smoke params
validate against the strict params models."""

from __future__ import annotations

import pytest

from adaptcheck.ladder.check import Check
from adaptcheck.ladder.loader import load_ladder
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.steps.smoke import checks

KINDS: dict[str, type[Check]] = {
    "smoke.device_visible": checks.DeviceVisibleCheck,
    "smoke.alloc_free": checks.AllocFreeCheck,
    "smoke.roundtrip": checks.RoundTripCheck,
    "smoke.fill_zero": checks.FillZeroCheck,
    "smoke.matmul": checks.MatmulCheck,
    "smoke.synchronize": checks.SynchronizeCheck,
    "smoke.streams_events": checks.StreamsEventsCheck,
    "smoke.dtypes": checks.DtypeProbeCheck,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kind_registered_as_step_2(kind: str) -> None:
    cls = get_check_class(kind)
    assert cls is KINDS[kind] and cls.kind == kind and cls.step == 2
    assert cls.params_model.model_config.get("extra") == "forbid"
    cls()  # the worker builds checks without arguments


@pytest.mark.parametrize("ladder", ["quick", "standard"])
def test_ladder_smoke_params_validate(ladder: str) -> None:
    spec = load_ladder(ladder).data  # resolved: quick extends standard
    smoke = [c for c in spec["checks"] if c["step"] == 2]
    assert {c["kind"] for c in smoke} == set(KINDS)
    for c in smoke:
        KINDS[c["kind"]].params_model.model_validate(c.get("params") or {})
