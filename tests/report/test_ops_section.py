"""The step-3 section: op × dtype matrix with status and ratio, per-op evidence, escaping."""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import re
from typing import Any

import pytest
from markupsafe import escape

from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.report.ops import (
    OpCell,
    OpsView,
    build_ops,
    format_cosine,
    format_ratio,
)
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view

from .factory import PLANNED, XSS_ATTR, XSS_SCRIPT, make_results


def _output(ratio: float | str, *, name: str = "c", mode: str = "normalized", passed: bool | None = None,
            cosine: float | None = 0.99999, max_ulp: int | None = None, reason: str = "") -> dict[str, Any]:
    r = float(ratio)
    return {
        "output": name, "mode": mode, "passed": r <= 1 if passed is None else passed,
        "ratio": ratio, "limits": {"max_normalized": 0.016, "min_cosine": 0.9999} if mode == "normalized" else {},
        "max_abs": 0.0625, "max_rel": 0.0039, "mismatch_fraction": 0.0 if r <= 1 else 0.25, "cosine": cosine,
        "normalized": 0.002, "max_ulp": max_ulp, "nonfinite_got": 0, "nonfinite_ref": 0, "elements": 64,
        "worst": {"index": [19, 5], "got": 18.25, "expected": 18.1877825, "abs_error": 0.0622175},
        "reason": reason,
    }


def _case(name: str, outputs: list[dict[str, Any]], *, error: str = "", scaled: dict[str, Any] | None = None,
          dtype: str = "bf16") -> dict[str, Any]:
    ratios = [float(o["ratio"]) for o in outputs]
    ratio: float | str = "inf" if error or not ratios else max(ratios)
    return {"case": name, "dtype": dtype, "passed": not error and all(o["passed"] for o in outputs),
            "error": error, "ratio": "inf" if ratio == float("inf") else ratio, "outputs": outputs,
            "scaled": scaled or {}, "notes": {"dist": "normal"},
            "seconds": {"op": 0.002, "reference": 0.003, "inputs": 0.001, "compare": 0.0005}}


def _op_result(op: str, dtype: str, status: Status, cases: list[dict[str, Any]], *, provider: str = "torch",
               message: str = "", tolerance: dict[str, Any] | None = None, cid: str | None = None) -> CheckResult:
    ratios = [c["ratio"] for c in cases]
    worst = max(ratios, key=lambda r: float(r))
    return CheckResult(
        step=3, id=cid or (f"ops.{op}.{dtype}" if provider == "torch" else f"ops.{provider}.{op}.{dtype}"),
        kind="ops.op", status=status, message=message or f"{status.value} {op} {dtype}",
        metrics={"cases": len(cases), "cases_failed": sum(1 for c in cases if not c["passed"]),
                 "ratio_to_tolerance": worst, "max_abs_error": 0.0625, "max_rel_error": 0.0039,
                 "mismatch_fraction": 0.0, "op_s": 0.01, "reference_s": 0.02, "inputs_s": 0.005, "compare_s": 0.001},
        details={"op": op, "provider": provider, "dtype": dtype, "signature": f"{op}(a, b) -> c",
                 "tolerance": tolerance or {"c": {"class": "reduction", "mode": "normalized",
                                                  "max_normalized": 0.016, "min_cosine": 0.9999}},
                 "cases": cases, "worst_case": max(cases, key=lambda c: float(c["ratio"]))["case"]},
        duration_s=0.1,
    )


def _na(op: str, dtype: str) -> CheckResult:
    return CheckResult(step=3, id=f"ops.{op}.{dtype}", kind="ops.op", status=Status.SKIP, applicable=False,
                       message=f"the CPU backend does not claim {dtype}")


SHRUNK = {"from": {"name": "long_k", "m": 16, "n": 16, "k": 8192}, "to": {"name": "long_k", "m": 16, "n": 16, "k": 2048},
          "why": "estimated 40.0s > budget 6.7s on this device"}


def _step3_checks() -> list[CheckResult]:
    return [
        _op_result("gemm", "fp32", Status.PASS, [_case("square", [_output(0.0386)], dtype="fp32")]),
        _op_result("gemm", "bf16", Status.PASS, [_case("square", [_output(0.13)]),
                                                  _case("long_k", [_output(0.238)], scaled=SHRUNK)]),
        _op_result("gemm", "fp16", Status.FAIL, [_case("square", [_output(3.4, reason="2 of 64 elements out")],
                                                       dtype="fp16")]),
        _op_result("embedding", "bf16", Status.FAIL,
                   [_case("vocab", [_output("inf", name="out", mode="exact", passed=False, cosine=None,
                                            reason="1 of 64 elements differ")])],
                   tolerance={"out": {"class": "exact", "mode": "exact"}}),
        _na("embedding", "fp16"),
        _op_result("silu_and_mul", "bf16", Status.ERROR,
                   [_case("ok", [_output(0.5, mode="allclose", max_ulp=3)]),
                    _case("big", [], error="RuntimeError: kernel launch failed")],
                   message="case 'big' raised RuntimeError: kernel launch failed"),
        _op_result("rmsnorm", "bf16", Status.PASS, [_case("rows", [_output(0.31)])], provider="vllm"),
    ]


def _results(checks: list[CheckResult] | None = None, **kw: Any) -> RunResults:
    base = [c for c in make_results().checks if c.step != 3]
    return make_results(checks=base + (checks if checks is not None else _step3_checks()), **kw)


def _ops(checks: list[CheckResult] | None = None) -> OpsView:
    results = _results(checks)
    return build_ops(results, {c.id: f"check-{c.id}" for c in results.checks})


def _cell(view: OpsView, op: str, dtype: str, provider: str = "torch") -> OpCell:
    row = next(r for g in view.groups for r in g.rows if r.op == op and r.provider == provider)
    return next(c for c in row.cells if c.dtype == dtype)


def _text(html: str) -> str:
    """Visible text with tags dropped and whitespace collapsed (what a reader sees)."""
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", "", html)))


# ---------------------------------------------------------------- the matrix


def test_matrix_has_each_op_and_dtype_with_status_and_ratio() -> None:
    view = _ops()
    assert view.ran and view.dtypes == ["fp32", "bf16", "fp16"]  # wide to narrow, whatever the order seen
    expected = {
        ("gemm", "fp32"): ("pass", "✓", "0.039×"),
        ("gemm", "bf16"): ("pass", "✓", "0.24×"),
        ("gemm", "fp16"): ("fail", "✗", "3.4×"),
        ("embedding", "bf16"): ("fail", "✗", "∞"),
        ("embedding", "fp16"): ("n/a", "○", ""),
        ("silu_and_mul", "bf16"): ("error", "!", "0.5×"),  # the measured case, not the raise's ∞
    }
    for (op, dtype), (label, glyph, ratio) in expected.items():
        cell = _cell(view, op, dtype)
        assert cell.status is not None
        assert (cell.status.label, cell.status.glyph, cell.ratio) == (label, glyph, ratio), (op, dtype)
    assert _cell(view, "gemm", "fp16").over is True and _cell(view, "gemm", "bf16").over is False


def test_matrix_rendered_cells_say_status_and_ratio_in_text() -> None:
    page = render(build_view(_results()))
    section = page[page.index('<section id="ops"'):page.index('<section id="framework"')]
    # Each op links to its cases on the details page.
    rows = {m.group(1): _text(m.group(0)) for m in re.finditer(r'<tr><th scope="row"><a href="report-details.html#ops-torch-(\w+)".*?</tr>',
                                                                 section, re.DOTALL)}
    assert "pass 0.039×" in rows["gemm"] and "pass 0.24×" in rows["gemm"] and "fail 3.4×" in rows["gemm"]
    assert "fail ∞" in rows["embedding"] and "n/a" in rows["embedding"]
    assert "error 0.5×" in rows["silu_and_mul"]
    # Colour as well as text: the cell carries the status class.
    assert 'class="op-cell s-fail"' in section and 'class="op-cell s-pass"' in section
    # Columns are the dtypes present.
    assert re.search(r"<thead><tr><th scope=\"col\">op</th><th scope=\"col\">fp32</th><th scope=\"col\">bf16</th>"
                     r"<th scope=\"col\">fp16</th></tr></thead>", section)


def test_exact_mismatch_shows_infinity() -> None:
    assert format_ratio("inf") == "∞" and format_ratio(float("inf")) == "∞"
    cell = _cell(_ops(), "embedding", "bf16")
    assert cell.ratio == "∞" and cell.over is True
    page = render(build_view(_results()))
    assert '<span class="ratio over">∞</span>' in page


def test_na_cells_are_distinct_from_skip_fail_and_unchecked() -> None:
    view = _ops()
    na = _cell(view, "embedding", "fp16")
    assert na.status is not None and na.status.key == "na" and na.ratio == ""
    unchecked = _cell(view, "embedding", "fp32")  # not in embedding's check at all
    assert unchecked.checked is False and unchecked.status is None
    page = render(build_view(_results()))
    assert 'class="op-cell s-na"' in page and "○</span> n/a" in page
    assert 'class="op-cell op-none"' in page
    assert "n/a" in [s.label for s in view.legend]


def test_ratio_just_over_one_never_prints_as_one() -> None:
    assert format_ratio(1.004) == "1.004×"
    assert format_ratio(0.996) == "1×"  # passing, at the limit: fine to round
    assert format_ratio(0) == "0×" and format_ratio(2500) == "2,500×" and format_ratio(None) == ""
    assert format_cosine(0.99999999999999) == "1 − 1.0e-14" and format_cosine(0.99987) == "0.99987"


def test_providers_other_than_torch_are_grouped_under_a_heading() -> None:
    view = _ops()
    assert [(g.provider, g.heading) for g in view.groups] == [("torch", ""), ("vllm", "provider vllm")]
    assert [r.op for r in view.groups[1].rows] == ["rmsnorm"]
    assert _cell(view, "rmsnorm", "bf16", provider="vllm").ratio == "0.31×"
    page = render(build_view(_results()))
    assert '<th scope="rowgroup" colspan="4">provider vllm</th>' in page


# ---------------------------------------------------------------- per-op details


def test_rows_link_to_details_with_tolerance_and_every_case() -> None:
    view = _ops()
    gemm = next(d for d in view.details if d.op == "gemm")
    row = view.groups[0].rows[0]
    assert row.anchor == gemm.anchor == "ops-torch-gemm"
    assert [x.dtype for x in gemm.dtypes] == ["fp32", "bf16", "fp16"]
    bf16 = gemm.dtypes[1]
    assert _cell(view, "gemm", "bf16").anchor == bf16.anchor
    tol = bf16.tolerance[0]
    assert (tol.output, tol.klass, tol.mode) == ("c", "reduction", "normalized")
    assert tol.limits == "max_normalized 0.016, min_cosine 0.9999" and tol.ratio == "0.24×"
    assert [c.case for c in bf16.cases] == ["square", "long_k"]
    long_k = bf16.cases[1]
    assert long_k.worst and long_k.scaled and (long_k.scaled_from, long_k.scaled_to) == ("k=8192", "k=2048")
    out = long_k.outputs[0]
    assert (out.worst_index, out.worst_got, out.worst_expected) == ("[19, 5]", "18.25", "18.1877825")
    assert out.max_abs == "0.0625" and out.cosine == "0.99999" and out.mismatch == "0%"

    page = render(build_view(_results()))
    details = render(build_view(_results()), "details")  # every case is on the details page
    assert 'id="ops-torch-gemm"' in details and 'id="ops-torch-gemm-bf16"' in details
    assert 'id="ops-torch-gemm"' not in page and "Tolerance per output" not in page
    assert 'href="report-details.html#ops-torch-gemm-bf16"' in page and 'href="#check-ops.gemm.bf16"' in details
    detail = _text(details[details.index('id="ops-torch-gemm"'):details.index('id="ops-torch-embedding"')])
    assert "k=8192 → k=2048" in detail and "estimated 40.0s > budget 6.7s" in detail
    assert "got 18.25, expected 18.1877825" in detail and "max_normalized 0.016, min_cosine 0.9999" in detail


def test_errored_case_shows_its_exception_and_no_infinite_ratio() -> None:
    view = _ops()
    silu = next(d for d in view.details if d.op == "silu_and_mul").dtypes[0]
    big = next(c for c in silu.cases if c.case == "big")
    assert big.status.key == "error" and big.ratio == "" and big.outputs == []
    assert "kernel launch failed" in big.error
    ok = next(c for c in silu.cases if c.case == "ok")
    assert ok.outputs[0].max_ulp == "3"


def test_worker_crash_without_dtype_spans_the_row() -> None:
    crash = CheckResult(step=3, id="ops.gemm", kind="ops.op", status=Status.ERROR,
                        message="worker died: SIGSEGV")
    view = _ops([_op_result("bmm", "bf16", Status.PASS, [_case("s", [_output(0.1)])]), crash])
    row = next(r for g in view.groups for r in g.rows if r.op == "gemm")
    assert row.whole is not None and row.whole.status is not None and row.whole.status.key == "error"
    view = build_view(_results([crash]))
    details = render(view, "details")
    assert "worker died: SIGSEGV" in _text(details[details.index('<section id="ops-details"'):])


def test_planned_op_check_without_result_is_not_run() -> None:
    planned = [*PLANNED, PlannedCheck(id="ops.rope", step=3, kind="ops.op", timeout_s=60)]
    results = _results(complete=False)
    results = results.model_copy(update={"planned": planned})
    view = build_ops(results, {})
    row = next(r for g in view.groups for r in g.rows if r.op == "rope")
    assert row.whole is not None and row.whole.status is not None and row.whole.status.label == "not run"


# ---------------------------------------------------------------- escaping, absence, plain data


def test_hostile_strings_are_escaped() -> None:
    evil = _op_result(XSS_SCRIPT, "bf16", Status.FAIL,
                      [_case(XSS_ATTR, [_output(2.0, name=XSS_SCRIPT, reason=XSS_SCRIPT)],
                             scaled={"from": {"k": XSS_SCRIPT}, "to": {"k": 1}, "why": XSS_ATTR}),
                       _case("boom", [], error=XSS_SCRIPT)],
                      provider=XSS_ATTR, message=XSS_SCRIPT, cid=f"ops.{XSS_ATTR}.bf16",
                      tolerance={XSS_SCRIPT: {"class": XSS_ATTR, "mode": XSS_SCRIPT}})
    evil.details["signature"] = XSS_ATTR
    page = render(build_view(_results([evil])))
    assert XSS_SCRIPT not in page and XSS_ATTR not in page
    assert str(escape(XSS_SCRIPT)) in page and str(escape(XSS_ATTR)) in page
    # Fragment ids built from untrusted names keep only safe characters.
    for anchor in re.findall(r'id="(ops-[^"]*)"', page):
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", anchor), anchor


@pytest.mark.parametrize("steps", [[1, 2], [1, 2, 4]])
def test_run_without_step3_says_not_run_and_has_no_matrix(steps: list[int]) -> None:
    results = make_results(steps=steps)
    view = build_view(results)
    assert view.ops.ran is False and view.ops.groups == [] and view.ops.dtypes == []
    assert "step 3 not run" in view.ops.not_run_reason
    page = render(view)
    section = page[page.index('<section id="ops"'):page.index('<section id="framework"')]
    assert "ops-matrix" not in section and "op-cell" not in section
    assert "step 3 not run" in section and "s-notrun" in section


def test_ops_view_is_plain_json_data() -> None:
    data = dataclasses.asdict(build_view(_results()))
    back = json.loads(json.dumps(data))
    assert back["ops"]["dtypes"] == ["fp32", "bf16", "fp16"]


def test_section_is_well_formed_with_unique_ids_and_live_links() -> None:
    from .test_render import _parse

    page = render(build_view(_results()))
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    ids = [v for _, k, v in parsed.attrs if k == "id"]
    assert len(ids) == len(set(ids))
    # Every link of the section to an op's cases lands on an id of the details page.
    details = _parse(render(build_view(_results()), "details"))
    assert details.errors == [] and details.stack == []
    detail_ids = [v for _, k, v in details.attrs if k == "id"]
    assert len(detail_ids) == len(set(detail_ids))
    hrefs = {v.partition("#")[2] for _, k, v in parsed.attrs if k == "href" and v and v.startswith("report-details.html#ops-")}
    assert hrefs and hrefs <= set(detail_ids)
    local = {v[1:] for _, k, v in details.attrs if k == "href" and v and v.startswith("#")}
    assert local <= set(detail_ids)
