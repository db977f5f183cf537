"""The regression comparison in HTML: the stand-alone page of ``adaptcheck compare --html`` and the
section of the run report (present only when a perf.regression result carries a comparison):
verdict, regressions, environment changes, improvements, not-compared count, the
not-comparable warning, escaping and well-formedness."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.compare import ComparePolicy, Comparison, compare_results
from adaptcheck.report.comparison import build_compare_view
from adaptcheck.report.render import render, write_compare_report
from adaptcheck.report.view import build_view
from tests.compare.helpers import gemm_row, load_pair, scale_row_time

from .factory import XSS_ATTR, XSS_SCRIPT
from .test_render import _parse

TEMPLATES = Path(__file__).parents[2] / "adaptcheck" / "report" / "templates"


def _planted() -> tuple[RunResults, Comparison]:
    """The real rerun with a slower GEMM row, a hostile package version and torch upgraded."""
    baseline, rerun = load_pair()
    scale_row_time(gemm_row(rerun), 2.0)
    assert rerun.environment is not None
    rerun.environment.packages["vllm"] = XSS_SCRIPT
    rerun.environment.torch = "2.14.0+cpu"
    return rerun, compare_results(baseline, rerun, ComparePolicy())


def test_view_carries_what_the_section_shows() -> None:
    _, c = _planted()
    v = build_compare_view(c, anchors={"perf.gemm": "check-perf.gemm"})
    assert not v.ok and v.verdict == "1 regression(s): 1 performance"
    (r,) = v.regressions
    assert (r.category, r.check.id, r.check.anchor) == ("performance", "perf.gemm", "check-perf.gemm")
    assert r.before.endswith(" ms") and r.after.endswith(" ms")
    env = {e.what: (e.before, e.after, e.change) for e in v.environment}
    assert env["torch"] == ("2.13.0+cpu", "2.14.0+cpu", "changed")
    assert env["packages.vllm"] == ("absent", XSS_SCRIPT, "added")
    assert len(v.not_compared) == 1 and len(v.figures) == c.counts.perf_compared
    assert v.improvements == c.improvements


def test_standalone_page_is_escaped_well_formed_and_complete(tmp_path: Path) -> None:
    _, c = _planted()
    path = tmp_path / "out" / "compare.html"
    write_compare_report(c, path)
    page = path.read_text(encoding="utf-8")
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    assert XSS_SCRIPT not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "script" not in parsed.tags and "script-src 'none'" in page
    for text in ("Regression comparison", "1 regression(s): 1 performance", "prefill m=2048 n=4096 k=4096 bf16",
                 "Environment changes", "2.14.0+cpu", "Improvements", "not compared (1)",
                 "every performance figure compared"):
        assert text in page, text
    assert "Not comparable" not in page


def test_not_comparable_is_a_warning_at_the_top(tmp_path: Path) -> None:
    baseline, rerun = load_pair()
    rerun.device.device_name = XSS_ATTR
    c = compare_results(baseline, rerun, ComparePolicy())
    path = tmp_path / "c.html"
    write_compare_report(c, path)
    page = path.read_text()
    assert _parse(page).errors == []
    warning = page.index('class="warning" role="alert"')
    assert warning < page.index("<h3>Regressions</h3>") and "Not comparable." in page
    assert XSS_ATTR not in page


def test_run_report_has_the_section_only_with_a_comparison() -> None:
    rerun, c = _planted()
    plain = render(build_view(rerun))
    assert 'id="compare"' not in plain and 'href="#compare"' not in plain
    rerun.checks.append(CheckResult(step=5, id="perf.regression", kind="perf.regression", status=Status.FAIL,
                                    message="1 regression(s)", details=c.to_data(), metrics=c.counts.model_dump()))
    page = render(build_view(rerun))
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    assert 'id="compare"' in page and 'href="#compare"' in page
    section = page[page.index('<section id="compare"'):]
    section = section[:section.index("</section>")]
    # The check's own status, then the verdict; the regressed row links to its check in this report.
    assert "fail</span>" in section and "1 regression(s): 1 performance" in section
    assert 'href="report-details.html#check-perf.gemm"' in section  # check entries are on the details page


def test_a_perf_regression_skip_without_comparison_adds_no_section() -> None:
    _, rerun = load_pair()
    rerun.checks.append(CheckResult(step=5, id="perf.regression", kind="perf.regression", status=Status.SKIP,
                                    message="no baseline"))
    assert 'id="compare"' not in render(build_view(rerun))


def test_templates_never_bypass_escaping() -> None:
    for name in ("compare.html.j2", "compare_page.html.j2"):
        text = (TEMPLATES / name).read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text
