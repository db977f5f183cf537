"""The view builder: plain data, the right verdicts, numbers formatted for people."""

from __future__ import annotations

import dataclasses
import json

import pytest

from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.report.fmt import format_duration, format_float, format_value
from adaptcheck.report.render import render
from adaptcheck.report.view import ReportView, build_view

from .factory import make_environment, make_results


def _check(view: ReportView, cid: str):
    return next(c for g in view.check_groups for c in g.checks if c.id == cid)


def test_view_is_plain_json_serialisable_data() -> None:
    view = build_view(make_results())
    data = dataclasses.asdict(view)
    text = json.dumps(data)  # raises on datetimes, enums, pydantic models…
    back = json.loads(text)
    assert back["grade_level"] == "L1"
    assert back["matrix"]["captured"] is True


def test_grade_levels_and_blockers() -> None:
    results = make_results()
    view = build_view(results)
    assert (view.grade_level, view.grade_name, view.next_level) == ("L1", "device usable", "L2")
    assert view.blockers == results.grade.blockers and view.blockers
    states = {lv.level: lv.state for lv in view.levels}
    assert states == {"L1": "achieved", "L2": "next", "L3": "above", "L4": "above", "L5": "above"}
    ops = view.levels[1].conditions[0]
    assert ops.holds is False and ops.verdict == "does not hold" and "SIGSEGV" in ops.reason
    assert [r.id for r in ops.checks] == ["ops.rmsnorm"] and ops.checks[0].anchor == "check-ops.rmsnorm"


def test_step_summary_counts_and_step_not_run() -> None:
    view = build_view(make_results())
    steps = {s.step: s for s in view.steps}
    assert set(steps) == {1, 2, 3, 4, 5}
    s1 = {c.status.key: c.count for c in steps[1].counts}
    # matrix.rules has sub-results, so the planned parent is not reported as not run.
    assert s1 == {"pass": 3, "fail": 2, "na": 1}
    s2 = {c.status.key: c.count for c in steps[2].counts}
    assert s2 == {"pass": 2, "na": 1} and steps[2].label.key == "pass"
    assert steps[2].duration == "3.0 s"
    assert steps[3].label.key == "error"
    assert steps[5].ran is False and steps[5].label.label == "not run"
    assert "not selected" in steps[5].not_run_reason and "1, 2, 3, 4" in steps[5].not_run_reason
    # The planned check of the excluded step still appears, as 'not run'.
    perf = _check(view, "perf.gemm")
    assert perf.status.label == "not run" and "not selected" in perf.message
    # Bar segments tile the whole bar.
    assert sum(b.width for b in steps[1].bar) == pytest.approx(100.0)


def test_interrupted_run_marks_missing_checks_not_reached() -> None:
    results = make_results(complete=False, checks=[
        CheckResult(step=1, id="matrix.capture", kind="matrix.capture", status=Status.PASS),
    ])
    view = build_view(results)
    assert view.complete is False and view.finished == "not finished"
    smoke = _check(view, "smoke.matmul")
    assert smoke.status.key == "notrun" and "interrupted" in smoke.message


def test_not_applicable_skip_is_distinct_from_skip() -> None:
    view = build_view(make_results())
    assert _check(view, "smoke.streams_events").status.label == "n/a"
    assert _check(view, "framework.batch").status.label == "skip"


def test_rule_verdicts() -> None:
    view = build_view(make_results())
    rules = {r.id: r for r in view.matrix.rules}
    assert set(rules) == {"matrix.rules.cuda_driver", "matrix.rules.vllm_torch",
                          "matrix.rules.rocm_hip", "matrix.rules.plugin_pin"}
    assert rules["matrix.rules.cuda_driver"].verdict_label == "ok"
    assert rules["matrix.rules.cuda_driver"].source == "matrices/cuda.yaml"
    assert rules["matrix.rules.vllm_torch"].verdict_label == "incompatible"
    assert rules["matrix.rules.rocm_hip"].verdict_label == "not applicable"
    assert rules["matrix.rules.rocm_hip"].source == ""
    assert rules["matrix.rules.plugin_pin"].verdict_label == "warn"


def test_stated_ok_verdict_cannot_hide_a_failure() -> None:
    checks = [
        CheckResult(step=1, id="matrix.rules.x", kind="matrix.rules", status=Status.FAIL, details={"verdict": "ok"}),
        CheckResult(step=1, id="matrix.rules.y", kind="matrix.rules", status=Status.FAIL, details={"verdict": "warn"}),
        CheckResult(step=1, id="matrix.rules.z", kind="matrix.rules", status=Status.ERROR, details={"verdict": "ok"}),
        CheckResult(step=1, id="matrix.rules.w", kind="matrix.rules", status=Status.PASS,
                    details={"verdict": "not_applicable"}),
    ]
    view = build_view(make_results(checks=checks))
    assert [r.verdict_label for r in view.matrix.rules] == ["incompatible", "incompatible", "error", "not applicable"]


def test_environment_absent_fields_say_not_present_with_note() -> None:
    view = build_view(make_results())
    rows = {(g.title, r.label): r for g in view.matrix.groups for r in g.rows}
    driver = rows[("Stack", "driver")]
    assert (driver.present, driver.value, driver.note) == (False, "not present", "nvidia-smi timed out after 20 s")
    vllm = rows[("Inference packages", "vllm")]
    assert vllm.value == "not present" and vllm.note == "vllm is not installed"
    assert rows[("Runtimes", "hip")].value == "not present"
    assert rows[("Host", "CPUs")].value == "2"
    dev = view.matrix.devices[0].cells
    assert [c.value for c in dev[:3]] == ["0", "NVIDIA H200", "NVIDIA"]
    assert dev[6].value == "not present"  # firmware
    plugins = {p.name: p for p in view.matrix.plugins}
    assert plugins["ascend"].allowed is False and "VLLM_PLUGINS" in plugins["ascend"].allowed_label
    assert plugins["lora"].distribution == "not present"


def test_environment_not_captured() -> None:
    view = build_view(make_results(environment=None, checks=[
        CheckResult(step=1, id="matrix.capture", kind="matrix.capture", status=Status.ERROR,
                    message="timed out after 90 s"),
    ]))
    assert view.matrix.captured is False and view.hostname == "not present"
    assert view.matrix.missing_reason == "matrix.capture ended 'error': timed out after 90 s"
    assert "did not run" in build_view(make_results(environment=None, steps=[2])).matrix.missing_reason


def test_unset_vllm_plugins_filter_explains_itself() -> None:
    view = build_view(make_results(environment=make_environment(vllm_plugins_filter=None)))
    row = view.matrix.plugins_filter
    assert row is not None and row.value == "not present" and "every installed plugin" in row.note


def test_metrics_formatted() -> None:
    metrics = {m.name: m.value for m in _check(build_view(make_results()), "smoke.matmul").metrics}
    assert metrics == {"fp32_max_abs_err": "1.235e-07", "bf16_tflops": "0.4123", "n": "512",
                       "cosine": "0.999999", "bytes": "16,777,216", "ok": "true"}


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0"), (1.0, "1"), (123.456, "123.5"), (0.012345, "0.01235"), (2.5e-9, "2.500e-09"),
    (-3.14159, "-3.142"), (98765.4, "98,765"), (3.2e12, "3.200e+12"), (float("nan"), "nan"),
    (float("-inf"), "-inf"), (0.99999912, "0.999999"), (2.0, "2"),
])
def test_format_float(value: float, text: str) -> None:
    assert format_float(value) == text


def test_format_value_and_duration() -> None:
    assert format_value(None) == "—"
    assert format_value([1, 2.5e-7]) == "[1, 2.500e-07]"
    assert format_value({"a": 1}) == '{"a": 1}'
    assert len(format_value("x" * 1000)) == 300
    assert [format_duration(s) for s in (0, 0.0004, 0.25, 12.34, 125, 7300)] == [
        "0 s", "0.40 ms", "250 ms", "12.3 s", "2 min 05 s", "2 h 01 min"]


def test_reproduce_section() -> None:
    rep = build_view(make_results()).reproduce
    assert rep.command == "adaptcheck run --ladder quick --steps 1-4 --seed 1234 --out 'reports/my run'"
    assert (rep.seed, rep.ladder, rep.ladder_sha256) == (1234, "quick 1.0", "ab" * 32)
    assert "NVIDIA H200" in rep.device and "cuda:0" in rep.device


def test_anchors_are_unique_and_attribute_safe() -> None:
    checks = [
        CheckResult(step=1, id='matrix.rules.a b"<x>', kind="matrix.rules", status=Status.PASS),
        CheckResult(step=1, id="matrix.rules.a b'<x>", kind="matrix.rules", status=Status.PASS),
    ]
    view = build_view(make_results(checks=checks))
    anchors = [c.anchor for g in view.check_groups for c in g.checks]
    assert len(anchors) == len(set(anchors))
    assert all(set(a) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") for a in anchors)


def test_known_good_section_shows_source_date_and_advice() -> None:
    results = make_results()
    entry = {"id": "nvidia-vllm-0.9.0-cu128", "basis": "published", "date": "2026-12-02",
             "source": "vLLM v0.9.0 release notes"}
    kg = next(c for c in results.checks if c.id == "matrix.known_good")
    kg.details = {"entry": entry, "entry_file": "matrices/known_good.yaml",
                  "advice": "nearest known-good stack 'nvidia-vllm-0.9.0-cu128' (published, 2026-12-02): change "
                            "torch 2.6.0+cu124 → 2.7.0"}
    view = build_view(results).matrix.known_good
    assert view is not None and not view.matched
    assert (view.entry, view.date, view.source) == ("nvidia-vllm-0.9.0-cu128", "2026-12-02", "vLLM v0.9.0 release notes")
    assert "torch 2.6.0+cu124 → 2.7.0" in view.advice
    html = render(build_view(results))
    assert "nearest entry" in html and "2026-12-02" in html and "torch 2.6.0+cu124 → 2.7.0" in html
