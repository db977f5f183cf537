"""Typed evidence of ``ops.op``: real details round-trip unchanged, the check writes that very shape,
and details that do not fit read as None while the report still renders.

The fixture holds excerpts of stored results (a not-applicable skip, a codes-mode tolerance, a
vLLM-provider op, a step-4 ``implementations`` record) and the details the check wrote before
its evidence was typed (a failing and an erroring gemm, seconds zeroed).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.base.schemas.evidence import EvidenceError
from adaptcheck.base.schemas.ops_evidence import (
    CaseSeconds,
    OpEvidence,
    OpMetrics,
    ScaledCase,
    ServedOpsRef,
    ToleranceSpec,
)
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.report.ops import build_ops
from adaptcheck.report.render import render
from adaptcheck.report.served_ops import unused_ops
from adaptcheck.report.view import build_view
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers.base import DictProvider
from tests.report.factory import make_results
from tests.steps.ops.test_gemm import _ctx

FIXTURE = json.loads((Path(__file__).parent / "data" / "ops_details.json").read_text())
STORED = Path(__file__).parents[2] / "report" / "data" / "quick-run.results.json.gz"
OPS_KINDS = ("failed", "errored", "not_applicable", "codes", "vllm")


def _text(details: dict[str, Any]) -> str:
    return json.dumps(details)  # key order included: the stored file's bytes, not just its values


@pytest.mark.parametrize("name", OPS_KINDS)
def test_fixture_details_round_trip_identically(name: str) -> None:
    details = FIXTURE[name]["details"]
    assert _text(OpEvidence.parse(details).dump()) == _text(details)
    if "metrics" in FIXTURE[name]:
        assert _text(OpMetrics.parse(FIXTURE[name]["metrics"]).dump()) == _text(FIXTURE[name]["metrics"])


def test_every_op_check_of_a_stored_run_round_trips_identically() -> None:
    stored = json.loads(gzip.decompress(STORED.read_bytes()))
    ops = [c for c in stored["checks"] if c["kind"] == "ops.op"]
    assert len(ops) > 100
    for c in ops:
        assert _text(OpEvidence.parse(c["details"]).dump()) == _text(c["details"]), c["id"]
        assert _text(OpMetrics.parse(c["metrics"]).dump()) == _text(c["metrics"]), c["id"]


def test_fields_read_typed() -> None:
    failed = OpEvidence.parse(FIXTURE["failed"]["details"])
    assert failed.op == "gemm" and failed.repro_error and failed.fp8_flavour == "e4m3fn"
    scaled = next(c for c in failed.cases if c.scaled.recorded)
    assert scaled.scaled.changes() == [("m", 32, 23), ("n", 32, 23)]
    worst = failed.cases[0].outputs[0]
    assert worst.worst.index is not None and worst.limits.named()
    errored = OpEvidence.parse(FIXTURE["errored"]["details"])
    assert errored.cases[0].error and errored.cases[0].ratio == "inf"
    assert errored.cases[0].ratio_value == math.inf and errored.cases[0].outputs == []
    codes = OpEvidence.parse(FIXTURE["codes"]["details"])
    spec = next(t for t in codes.tolerance.values() if t.max_code_distance is not None)
    assert spec.klass and spec.mode == "codes" and "max_code_distance" in spec.named()
    skipped = OpEvidence.parse(FIXTURE["not_applicable"]["details"])
    assert skipped.cases == [] and skipped.dump() == FIXTURE["not_applicable"]["details"]


def test_small_records() -> None:
    assert ToleranceSpec.model_validate({"class": "gemm", "mode": "normalized", "min_cosine": 0.9999}).dump() \
        == {"class": "gemm", "mode": "normalized", "min_cosine": 0.9999}
    assert ToleranceSpec.model_validate({"class": "x", "mode": "allclose", "rtol": 0.016, "atol": 0.001}).named() \
        == {"rtol": 0.016, "atol": 0.001}
    assert ScaledCase().dump() == {} and not ScaledCase().recorded
    shrink = ScaledCase.model_validate({"from": {"name": "c", "k": 8192, "m": 4}, "to": {"name": "c", "k": 2048, "m": 4},
                                        "why": "budget"})
    assert shrink.recorded and shrink.changes() == [("k", 8192, 2048)]
    assert CaseSeconds().total() is None and CaseSeconds(op=1.0, compare=0.5).total() == 1.5


def _layout(value: object) -> object:
    """The keys at every level (values and list lengths left out)."""
    if isinstance(value, dict):
        return {k: _layout(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_layout(value[0])] if value and isinstance(value[0], (dict, list)) else "list"
    return type(value).__name__ if value is None or isinstance(value, (bool, str)) else "number"


def _broken_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.to(torch.float16) @ b.to(torch.float16)).to(a.dtype) * 1.01


def _raising_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel launch failed")


@pytest.mark.parametrize(("name", "fn"), [("failed", _broken_gemm), ("errored", _raising_gemm)])
def test_the_check_writes_the_stored_layout(name: str, fn: Any, tmp_path: Path) -> None:
    ctx = _ctx()
    ctx.check_id, ctx.run_dir = "ops.gemm", tmp_path
    cases = [{"name": "square", "m": 8, "n": 8, "k": 16}]
    outcome = OpCheck(DictProvider("under_test", {"gemm": fn})).run(ctx, OpCheckParams(op="gemm", dtypes=["fp32"],
                                                                                        cases=cases))[0]
    expected = dict(FIXTURE[name]["details"])
    got = dict(outcome.details)
    # The fixture's provider wrote no script (repro_error); one defined in a module does.
    expected.pop("repro", None), expected.pop("repro_error", None)
    assert "repro" in got or "repro_error" in got
    got.pop("repro", None), got.pop("repro_error", None)
    got["cases"], expected["cases"] = got["cases"][:1], [c for c in expected["cases"] if not c["scaled"]][:1]
    assert _layout(got) == _layout(expected)
    assert list(outcome.metrics) == list(FIXTURE[name]["metrics"])
    assert OpEvidence.parse(outcome.details).dump() == outcome.details


def _op_result(details: dict[str, Any]) -> CheckResult:
    return CheckResult(step=3, id="ops.gemm.fp32", kind="ops.op", status=Status.FAIL, message="out of tolerance",
                       metrics={"cases": "many"}, details=details)


@pytest.mark.parametrize("details", [
    {"op": "gemm", "provider": "torch", "dtype": "fp32", "cases": "not a list"},
    {"op": "gemm", "provider": "torch", "dtype": "fp32", "cases": [{"outputs": [{"worst": {"index": "0,1"}}]}]},
    {"op": "gemm", "provider": "torch", "dtype": "fp32", "tolerance": {"c": {"class": 7}}},
    {"op": ["gemm"], "dtype": "fp32"},
])
def test_malformed_details_read_as_none_and_the_report_still_renders(details: dict[str, Any]) -> None:
    result = _op_result(details)
    assert result.evidence(OpEvidence) is None
    with pytest.raises(EvidenceError):
        OpEvidence.parse(details)
    results = make_results(checks=[c for c in make_results().checks if c.step != 3] + [result])
    view = build_ops(results, {})
    row = next(r for g in view.groups for r in g.rows if r.check_id == "ops.gemm")
    assert row.cells[0].status is not None and row.cells[0].status.key == "fail"
    assert view.details[0].dtypes[0].cases == [] and view.details[0].dtypes[0].cases_total == "0"
    assert "ops.gemm.fp32" in render(build_view(results), "details")


def test_served_implementations_are_read_typed_and_malformed_ones_ignored() -> None:
    served = FIXTURE["served"]
    ref = CheckResult(step=4, id=served["id"], kind="framework.reference", status=Status.PASS,
                      details=served["details"])
    evidence = ref.evidence(ServedOpsRef)
    assert evidence is not None and evidence.teacher_forced is not None
    assert evidence.teacher_forced.implementations == served["details"]["teacher_forced"]["implementations"]
    assert ServedOpsRef.parse(served["details"]).dump() == served["details"]
    bad = CheckResult(step=4, id="framework.vllm.reference", kind="framework.reference", status=Status.PASS,
                      details={"teacher_forced": {"implementations": ["RMSNorm: forward_native"]}})
    assert bad.evidence(ServedOpsRef) is None
    native = CheckResult(step=4, id="framework.vllm.reference", kind="framework.reference", status=Status.PASS,
                         details={"teacher_forced": {"implementations": {"RMSNorm": "forward_cpu -> forward_native"}}})
    results = make_results(checks=[bad, native])
    assert "rms_norm" in unused_ops(results)
