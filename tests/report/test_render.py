"""The rendered page: escaped, self-contained, complete, well-formed, written atomically."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markupsafe import escape

from adaptcheck.base.errors import OutputError
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.report import write_report
from adaptcheck.report.fmt import STATUS_LABELS
from adaptcheck.report.render import PRINT_SCRIPT, render, script_hash
from adaptcheck.report.view import build_view

from .factory import XSS_ATTR, XSS_SCRIPT, make_environment, make_results

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _page(**kw: object) -> str:
    return render(build_view(make_results(**kw)))  # type: ignore[arg-type]


def _details(**kw: object) -> str:
    """The details page (every check's entry) of the same results."""
    return render(build_view(make_results(**kw)), "details")  # type: ignore[arg-type]


def _hostile_results():
    env = make_environment(
        hostname=XSS_SCRIPT, os=XSS_ATTR,
        env_vars={"EVIL": XSS_ATTR}, notes={"driver_version": XSS_SCRIPT},
    )
    checks = [
        CheckResult(step=1, id="matrix.capture", kind="matrix.capture", status=Status.PASS),
        CheckResult(step=1, id=f"matrix.rules.{XSS_ATTR}", kind="matrix.rules", status=Status.FAIL,
                    message=XSS_SCRIPT, details={"source": XSS_ATTR}),
        CheckResult(step=2, id="smoke.matmul", kind="smoke.matmul", status=Status.FAIL, message=XSS_ATTR,
                    metrics={XSS_SCRIPT: XSS_ATTR}, details={"evil": XSS_SCRIPT}),
    ]
    return make_results(environment=env, checks=checks, device_name=XSS_ATTR)


class _TagBalance(HTMLParser):
    """Counts open/close tags; records anything unbalanced."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> while open: {self.stack[-3:]}")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()


def _parse(page: str) -> _TagBalance:
    parser = _TagBalance()
    parser.feed(page)
    parser.close()
    return parser


def test_hostile_strings_render_as_text() -> None:
    page = render(build_view(_hostile_results()))
    # The raw markup never appears, the escaped form does.
    assert "<script>alert(1)</script>" not in page
    assert "<img" not in page
    assert str(escape(XSS_SCRIPT)) in page
    assert str(escape(XSS_ATTR)) in page
    # The only script element is the print helper; no element carries an event handler.
    parsed = _parse(page)
    assert parsed.tags.count("script") == 1 and parsed.tags.count("img") == 0
    assert not [a for a in parsed.attrs if a[1].lower().startswith("on")]
    # Hostile ids still get attribute-safe anchors.
    ids = [v for _, k, v in parsed.attrs if k == "id"]
    assert all(v and re.fullmatch(r"[A-Za-z0-9_.-]+", v) for v in ids)


def test_hostile_text_survives_as_visible_text() -> None:
    """Escaping must not drop content: the reader sees the hostile string verbatim."""

    class _Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.text: list[str] = []

        def handle_data(self, data: str) -> None:
            self.text.append(data)

    parser = _Text()
    parser.feed(render(build_view(_hostile_results())))
    text = "".join(parser.text)
    assert XSS_SCRIPT in text and XSS_ATTR in text


def test_no_network_references() -> None:
    view = build_view(_hostile_results())
    page = render(view) + render(view, "details") + _page() + _details()
    assert not re.search(r"""(?:src|href|action|srcset|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", page, re.IGNORECASE)
    assert not re.search(r"@import", page, re.IGNORECASE)
    assert not re.search(r"url\(\s*['\"]?\s*(?:https?:)?//", page, re.IGNORECASE)
    assert "<link" not in page and "<iframe" not in page
    hrefs = [v for _, k, v in _parse(page).attrs if k == "href"]
    # Only fragments, of this page or of the other page of the report beside it.
    assert hrefs and all(v is not None and re.fullmatch(r"(report(-details)?\.html)?#[^/]*", v) for v in hrefs)
    # Every link points at an element that exists, on the page it names.
    pages = {"report.html": _parse(_page()), "report-details.html": _parse(_details())}
    ids = {name: {v for _, k, v in p.attrs if k == "id"} for name, p in pages.items()}
    for name, parsed in pages.items():
        for _, k, v in parsed.attrs:
            if k == "href" and v:
                target, _, frag = v.partition("#")
                assert frag in ids[target or name], (name, v)


def test_csp_allows_exactly_the_print_script() -> None:
    page = _page()
    assert f"'{script_hash(PRINT_SCRIPT)}'" in page
    assert f"<script>{PRINT_SCRIPT}</script>" in page
    assert "default-src 'none'" in page


def test_grade_blockers_checks_and_statuses_appear() -> None:
    results = make_results()
    page = render(build_view(results))
    assert ">L1<" in page and "device usable" in page
    assert results.grade.blockers
    for blocker in results.grade.blockers:
        assert str(escape(blocker)) in page
    for check in results.checks:
        assert f">{escape(check.id)}<" in page
    # Planned checks without a result of their own (or of an expanded sub-result) show too.
    ran = {c.id for c in results.checks}
    for planned in results.planned:
        if not any(r == planned.id or r.startswith(planned.id + ".") for r in ran):
            assert f">{planned.id}<" in page
    for label in ("pass", "fail", "error", "skip", "n/a", "not run"):
        assert f"</span> {label}</span>" in page, label
    assert set(STATUS_LABELS.values()) == {"pass", "fail", "error", "skip", "n/a", "not run"}


def test_each_check_block_shows_its_status_text() -> None:
    page = _details()
    for cid, label in (("smoke.matmul", "pass"), ("ops.rmsnorm", "error"), ("framework.batch", "skip"),
                       ("smoke.streams_events", "n/a"), ("perf.gemm", "not run")):
        block = re.search(rf'<article class="check" id="check-{re.escape(cid)}">(.*?)</article>', page, re.DOTALL)
        assert block, cid
        assert f"</span> {label}</span>" in block.group(1), cid


def test_none_environment_fields_render_not_present() -> None:
    page = _page()
    assert "not present" in page
    assert "nvidia-smi timed out after 20 s" in page
    assert re.search(r"<th scope=\"row\">driver</th><td><span class=\"absent\">not present</span>", page)


def test_missing_environment_renders() -> None:
    page = _page(environment=None)
    assert "the compatibility matrix was not captured" in page


def test_steps_not_run_are_said_so() -> None:
    page = _page()
    assert "step 5 was not selected for this run" in page
    assert "5 · performance baseline" in page


def test_incomplete_run_warns() -> None:
    assert "Incomplete run" in _page(complete=False)
    assert "Incomplete run" not in _page()


def test_metrics_details_and_reproduce() -> None:
    page = _page()
    details = _details()  # each check's metrics and evidence are on the details page
    assert "<code>fp32_max_abs_err</code></th><td class=\"num\">1.235e-07</td>" in details
    assert "<details><summary>details</summary><pre>" in details
    assert "adaptcheck run --ladder quick --steps 1-4 --seed 1234 --out &#39;reports/my run&#39;" in page
    assert "ab" * 32 in page and "builtin:quick" in page


@pytest.mark.parametrize("kw", [{}, {"complete": False}, {"environment": None}])
def test_html_is_well_formed(kw: dict[str, object]) -> None:
    page = _page(**kw)
    assert page.startswith("<!doctype html>")
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    for tag in ("html", "head", "body", "main"):
        assert parsed.tags.count(tag) == 1, tag
    head = page[: page.index("<body>")]
    assert head.count("<title>") == 1  # later <title>s are SVG tooltips
    assert parsed.tags.count("svg") >= 1
    assert '<meta name="viewport"' in page and "@media print" in page


def test_write_report_is_atomic_utf8(tmp_path: Path) -> None:
    target = tmp_path / "out" / "report.html"
    write_report(make_results(device_name="Ascend910B3 — 昇腾"), target)
    text = target.read_text(encoding="utf-8")
    assert "Ascend910B3 — 昇腾" in text
    # The details page beside it, and no temp file left.
    assert sorted(p.name for p in target.parent.iterdir()) == ["report-details.html", "report.html"]
    assert "Ascend910B3 — 昇腾" in (tmp_path / "out" / "report-details.html").read_text(encoding="utf-8")


def test_write_report_keeps_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.html"
    target.write_text("old", encoding="utf-8")

    def boom(self: Path, other: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Path, "replace", boom)
    # One line naming the file and the cause (exit 2), not an internal error.
    with pytest.raises(OutputError, match=r"cannot write the report's details page to .*report-details\.html: disk full"):
        write_report(make_results(), target)
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_empty_run_renders_grade_l0() -> None:
    """Nothing ran, nothing captured: still a valid page that says so, never a crash."""
    results = make_results(steps=[], checks=[], environment=None, complete=False)
    page = render(build_view(results))
    assert results.grade.level == "L0"
    assert ">L0<" in page and "Blockers for L1" in page and "Incomplete run" in page
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []


def test_template_never_bypasses_escaping() -> None:
    template = (Path(__file__).parents[2] / "adaptcheck" / "report" / "templates" / "report.html.j2").read_text()
    assert "|safe" not in template.replace(" ", "") and "autoescape false" not in template


def test_checks_left_out_of_the_grade_are_named_worst_first() -> None:
    from adaptcheck.base.schemas.results import PlannedCheck
    from adaptcheck.report.junit import junit_xml
    from adaptcheck.runfolder import regrade

    base = make_results()
    tag = ["quant:int8_w8a8"]
    planned = [*base.planned, PlannedCheck(id="ops.int8_gemm", step=3, kind="ops.op", tags=tag, timeout_s=1),
               PlannedCheck(id="ops.int8_quant", step=3, kind="ops.op", tags=tag, timeout_s=1)]
    checks = [*base.checks,
              CheckResult(id="ops.int8_quant.bf16", step=3, kind="ops.op", tags=tag, status=Status.PASS),
              CheckResult(id="ops.int8_gemm.fp32", step=3, kind="ops.op", tags=tag, status=Status.PASS),
              CheckResult(id="ops.int8_gemm.bf16", step=3, kind="ops.op", tags=tag, status=Status.FAIL,
                          message="max abs err 3.0")]
    results = regrade(base.model_copy(update={"planned": planned, "checks": checks}))
    assert results.grade.level == base.grade.level  # the failure does not touch an unquantized model's grade
    page = render(build_view(results))
    assert ("Not graded for this model (quantization: none): ops.int8_gemm (fail), ops.int8_quant (pass)."
            in page)
    assert "Not graded for this model" not in _page()
    assert "not graded for this model (quantization: none): ops.int8_gemm, ops.int8_quant" in junit_xml(results)
