"""Step 2's evidence models: real details round-trip unchanged, malformed ones read as None.

The samples (tests/base/schemas/data/smoke_details.json) are the details of stored results
files of real runs (one per kind and outcome shape).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.base.schemas.smoke_evidence import (
    SMOKE_EVIDENCE,
    BitDiffEvidence,
    ComparisonFacts,
    DtypeInfo,
    DtypesEvidence,
    FillPhase,
    FillZeroEvidence,
    MatmulEvidence,
    PositiveControl,
    RoundTripEvidence,
    SynchronizeEvidence,
)
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view
from tests.report.factory import make_results

SAMPLES: dict[str, list[dict[str, object]]] = json.loads(
    (Path(__file__).parent / "data" / "smoke_details.json").read_text(encoding="utf-8"))
CASES = [(kind, s["from"], s["details"]) for kind, samples in SAMPLES.items() for s in samples]


def _model(kind: str) -> type[Evidence]:
    return SMOKE_EVIDENCE["smoke.matmul" if kind.startswith("smoke.matmul") else kind]


@pytest.mark.parametrize("kind, origin, details", CASES, ids=[f"{k}:{o}" for k, o, _ in CASES])
def test_stored_details_round_trip_unchanged(kind: str, origin: str, details: dict[str, object]) -> None:
    evidence = _model(kind).parse(details, where=origin)
    assert evidence.extras == {}, "every stored key is declared"
    dumped = evidence.dump()
    # Same keys, values and order; ints stay ints and floats floats (the JSON text is the same).
    assert json.dumps(dumped) == json.dumps(details)


def test_every_kind_has_a_sample() -> None:
    assert set(SMOKE_EVIDENCE) <= {"smoke.matmul" if k.startswith("smoke.matmul") else k for k in SAMPLES}


def test_fill_zero_phases_are_told_apart() -> None:
    (sample,) = SAMPLES["smoke.fill_zero"]
    evidence = FillZeroEvidence.parse(sample["details"])  # type: ignore[arg-type]
    assert isinstance(evidence.phases["positive_control"], PositiveControl)
    assert set(evidence.fill_phases) == {"pattern_5a5a5a5a5a5a5a5a", "pattern_a5a5a5a5a5a5a5a5", "row_index", "zero"}
    assert all(isinstance(p, FillPhase) for p in evidence.fill_phases.values())


def test_a_broken_matmul_keeps_nan_and_inf() -> None:
    facts = ComparisonFacts(normalized_error=math.inf, max_abs_error=math.nan, max_abs_ref=1.0, cosine=math.nan,
                            nonfinite=2, worst_index=[0, 1], worst_got=math.nan, worst_ref=1.0)
    case = MatmulEvidence(dtype="fp16", square={"shape": [[2, 2], [2, 2]], "inputs": "normal",
                                                "comparison": facts}).dump()["square"]
    assert math.isinf(case["comparison"]["normalized_error"])  # stored as measured, not None
    assert math.isnan(case["comparison"]["cosine"]) and math.isnan(case["comparison"]["worst_got"])


def test_optional_keys_stay_absent() -> None:
    assert BitDiffEvidence(elements=4, mismatched=0).dump() == {"elements": 4, "mismatched": 0}
    sync = SynchronizeEvidence(pinned_host_buffer="not available: RuntimeError: x", host_mismatches=0,
                               device_mismatches=0)
    assert "note" not in sync.dump()
    info = DtypeInfo()
    info.matmul_path = "int32 matmul"
    assert info.dump() == {"matmul_path": "int32 matmul"}
    assert RoundTripEvidence.parse({"dtypes": {"fp32": {"declared": True, "ok": False, "error": "E: x"}}}).dump() == \
        {"dtypes": {"fp32": {"declared": True, "ok": False, "error": "E: x"}}}


@pytest.mark.parametrize("details", [{"dtypes": "all fine"}, {"dtypes": {"fp32": {"declared": "maybe"}}},
                                     {"declared": ["fp32"]}])
def test_malformed_details_read_as_none_and_the_report_renders(details: dict[str, object]) -> None:
    bad = CheckResult(step=2, id="smoke.dtypes", kind="smoke.dtypes", status=Status.PASS, message="m",
                      details=details)
    assert bad.evidence(DtypesEvidence) is None
    results = make_results()
    results.checks.append(bad)
    html = render(build_view(results), "details")
    assert "smoke.dtypes" in html
