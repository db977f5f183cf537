"""The soak block of the step-5 section: the verdict, the memory fits, telemetry sparklines.

Results are hand-made in the ``details`` shape docs/perf.md fixes for ``perf.soak`` (the fits
computed by the real :func:`adaptcheck.perf.trend.memory_growth_verdict`), so these tests pin
what the report reads.
"""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, Status
from adaptcheck.perf.trend import memory_growth_verdict
from adaptcheck.report import svg
from adaptcheck.report.perf import PerfView
from adaptcheck.report.render import render
from adaptcheck.report.soak import SoakView
from adaptcheck.report.view import build_view

from .factory import PLANNED, XSS_ATTR, XSS_SCRIPT, make_results
from .test_render import _parse

SVG = "{http://www.w3.org/2000/svg}"
N = 60


def telemetry(rss_slope_mib_per_min: float, *, device: dict[str, list[float | None]] | None = None) -> dict[str, Any]:
    t = [0.5 * i for i in range(N)]
    return {"interval_s": 0.5,
            "host": {"t_s": t, "server_rss_mib": [500.0 + rss_slope_mib_per_min * x / 60 for x in t],
                     "cpu_utilization_pct": [None] + [50.0] * (N - 1), "cpu_frequency_mhz": [2600.0] * N},
            "device": ({"t_s": t, **device} if device is not None else None),
            "device_sample_s": {"median": 0.4, "max": 1.2} if device is not None else None,
            "errors": [{"source": "device", "error": "RuntimeError: smi crashed", "count": 2, "first_t_s": 3.0}],
            "notes": []}


def memory_entry(tel: dict[str, Any], source: str, key: str, label: str, *, bounded: bool = True,
                 bound: float = 10.0) -> dict[str, Any]:
    series = tel[source]
    verdict = memory_growth_verdict(zip(series["t_s"], series[key], strict=True), bound, warmup_s=5.0)
    return verdict.evidence(series=key, source=source, label=label, bounded=bounded).dump()


def soak_check(rss_slope: float = 0.5, *, status: Status = Status.PASS, message: str = "soak 30 s, 0 errors",
               device: dict[str, list[float | None]] | None = None, cid: str = "perf.soak",
               **detail_overrides: Any) -> CheckResult:
    tel = telemetry(rss_slope, device=device)
    memory = [memory_entry(tel, "host", "server_rss_mib", "server RSS")]
    if device is not None and "memory_used_mib" in device:
        memory.append(memory_entry(tel, "device", "memory_used_mib", "device memory used"))
    details: dict[str, Any] = {
        "soak": {"duration_s": 30, "arrival": "concurrency", "level": 2,
                 "mixed": [{"input_tokens": 32, "output_tokens": 16, "weight": 2.0}], "sample_interval_s": 0.5,
                 "warmup_s": 5.0, "max_growth_mib_per_min": 10.0, "max_error_rate": 0.0, "request_timeout_s": 30},
        "server": {"name": "endpoint", "url": "http://127.0.0.1:8123/v1"},
        "server_process": {"pid": 4242, "found_by": "listening on the endpoint's port", "on_this_host": True},
        "requests": {"completed": 300, "failed": 0, "error_rate": 0.0, "errors": {}, "duration_s": 30.2,
                     "request_throughput": 9.9, "output_throughput": 200.0, "ttft_ms": {"p50": 50.0, "p99": 90.0},
                     "warmup_requests": 2, "warmup_failed": 0, "aborted": None},
        "records_file": f"perf/soak/{cid}.jsonl",
        "telemetry": tel, "memory": memory, "counters": [], "kv_cache_peak": 0.2,
    }
    details.update(detail_overrides)
    return CheckResult(step=5, id=cid, kind="perf.soak", status=status, message=message, details=details,
                       duration_s=31.0)


def perf(checks: list[CheckResult], **kw: Any) -> PerfView:
    return build_view(make_results(steps=[1, 2, 3, 4, 5], checks=checks, **kw)).perf


def only(v: PerfView) -> SoakView:
    assert len(v.soak) == 1
    return v.soak[0]


def svg_root(markup: Any) -> ET.Element:
    return ET.fromstring(str(markup))


def test_a_passing_soak_shows_fit_sparklines_and_facts() -> None:
    s = only(perf([soak_check(0.5)]))
    assert s.status.key == "pass" and s.bound == "10 MiB/min" and s.block == "soak-perf.soak"
    (row,) = s.fits
    assert (row.label, row.verdict.label) == ("server RSS", "within bound")
    assert row.slope.startswith("+0.5 [+0.5, +0.5]") and row.slope.endswith("MiB/min") and row.r2 == "1"
    assert row.growth_hour == "+30 MiB" and row.reason == ""
    assert [sp.key for sp in s.sparks] == ["server_rss_mib", "cpu_utilization_pct", "cpu_frequency_mhz"]
    assert ("completed", "300") in [(f.label, f.value) for f in s.requests]
    assert s.process[0].value == "pid 4242 (listening on the endpoint's port)"
    assert s.notes == ["device: RuntimeError: smi crashed ×2 (first at 3 s)"]
    assert s.records is not None and s.records.href == "perf/soak/perf.soak.jsonl"
    assert not [m for m in perf([soak_check(0.5)]).micro if m.kind == "perf.soak"]  # not a micro-benchmark
    assert ("duration", "30 s") in [(f.label, f.value) for f in s.offered]  # a fixed-length soak (older results)
    assert "stopped" not in [f.label for f in s.offered]


def test_a_soak_that_decided_says_how_long_it_ran_and_why_it_stopped() -> None:
    soak = {"duration_s": 20, "max_duration_s": 60, "looks": 4, "arrival": "concurrency", "level": 2,
            "sample_interval_s": 0.5, "warmup_s": 5.0, "max_growth_mib_per_min": 10.0, "max_error_rate": 0.0}
    decision = {"looks_at_s": [20.0, 33.333, 46.667, 60.0], "look_confidence": 0.9875, "ran_s": 35.2,
                "looks": [{"at_s": 20.0, "states": {"server_rss_mib": "inconclusive"}},
                          {"at_s": 33.333, "states": {"server_rss_mib": "within"}}],
                "stop": "decided", "stopped_at_s": 33.333, "why": "decided at 33.33 s, look 2 of 4"}
    s = only(perf([soak_check(0.5, soak=soak, decision=decision)]))
    facts = dict((f.label, f.value) for f in s.offered)
    assert facts["duration"] == "20 s, up to 60 s while a memory trend is undecided (4 looks)"
    assert facts["ran"] == "35.2 s" and facts["stopped"] == "decided at 33.33 s, look 2 of 4"
    assert facts["looks (each at 98.8% confidence)"] == ("20 s: server_rss_mib inconclusive; "
                                                         "33.33 s: server_rss_mib within")
    page = render(build_view(make_results(steps=[1, 2, 3, 4, 5], checks=[soak_check(0.5, soak=soak,
                                                                                     decision=decision)])))
    assert "decided at 33.33 s, look 2 of 4" in page


def test_a_failing_soak_marks_the_series_over_bound() -> None:
    s = only(perf([soak_check(120.0, status=Status.FAIL, message="server RSS grows")]))
    (row,) = s.fits
    assert row.verdict.key == "fail" and row.slope.startswith("+120 [+120, +120]")
    page = render(build_view(make_results(steps=[1, 2, 3, 4, 5], checks=[soak_check(120.0, status=Status.FAIL)])))
    block = page[page.index('id="soak-perf.soak"'):]
    assert 'class="num over-bound">+120' in block


def test_the_trend_line_is_the_fit_drawn_over_the_memory_series_only() -> None:
    s = only(perf([soak_check(30.0)]))
    rss = svg_root(s.sparks[0].svg)
    trend = rss.find(f"{SVG}line[@class='trend']")
    line = rss.find(f"{SVG}polyline[@class='series']")
    assert trend is not None and line is not None
    # An exact line: the trend must end on the last sample (a slope per second taken as per
    # minute, or an intercept at the window's start instead of t = 0, would miss it).
    last_x, last_y = line.get("points", "").split()[-1].split(",")
    assert (trend.get("x2"), trend.get("y2")) == (last_x, last_y)
    # And it starts where the fit starts: after the warm-up, which is shaded.
    warm = rss.find(f"{SVG}rect[@class='warmup']")
    assert warm is not None and float(trend.get("x1", "0")) == pytest.approx(
        float(warm.get("x", "0")) + float(warm.get("width", "0")), abs=0.02)
    for other in s.sparks[1:]:
        root = svg_root(other.svg)
        assert root.find(f"{SVG}line[@class='trend']") is None and root.find(f"{SVG}rect") is None


def test_device_telemetry_and_counters_are_shown() -> None:
    device: dict[str, list[float | None]] = {"memory_used_mib": [70000.0] * N, "power_w": [300.0 + i for i in range(N)],
                                             "sm_clock_mhz": [1980.0] * N, "ecc_volatile_uncorrectable": [0.0] * N,
                                             "temperature_c": [None] * N}
    counters = [{"counter": "ecc_volatile_uncorrectable", "first": 0.0, "last": 2.0, "rose": True}]
    s = only(perf([soak_check(0.0, device=device, counters=counters, status=Status.FAIL)]))
    assert [r.label for r in s.fits] == ["server RSS", "device memory used"]
    keys = [(sp.source, sp.key) for sp in s.sparks]
    assert ("device", "power_w") in keys and ("device", "sm_clock_mhz") in keys
    assert ("device", "temperature_c") not in keys  # never read: no empty chart
    labels = {sp.key: sp.label for sp in s.sparks}
    assert labels["sm_clock_mhz"] == "SM clock" and labels["ecc_volatile_uncorrectable"].startswith("ECC uncorrectable")
    assert [(f.label, f.value) for f in s.counters] == [("ecc_volatile_uncorrectable", "0 → 2 (rose during the soak)")]
    assert s.device_sample == "one device reading took 0.4 s (median), 1.2 s at most"


def test_cpu_host_memory_is_shown_not_bounded() -> None:
    c = soak_check(0.5, device={"memory_used_mib": [8000.0 + 50 * i for i in range(N)]})
    c.details["memory"][1] |= {"bounded": False, "ok": None, "label": "host memory used (whole machine)",
                               "reason": "not bounded (every process on the host moves it): +6000 MiB/min"}
    s = only(perf([c]))
    assert s.fits[1].verdict.label == "shown, not bounded" and s.fits[1].verdict.key == "na"
    assert any(sp.label == "host memory used (whole machine)" for sp in s.sparks)


def test_an_unjudged_series_says_why() -> None:
    c = soak_check(0.5, status=Status.SKIP)
    c.details["memory"][0] |= {"ok": None, "fit": None, "reason": "3 sample(s) after the 5 s warm-up"}
    (row,) = only(perf([c])).fits
    assert row.verdict.label == "not judged" and row.slope == "—" and row.reason.startswith("3 sample(s)")


def test_an_errored_or_unreached_soak_has_no_charts_and_says_so() -> None:
    errored = CheckResult(step=5, id="perf.soak", kind="perf.soak", status=Status.ERROR,
                          message="soak: nothing served: connection refused", details={}, duration_s=2.0)
    s = only(perf([errored]))
    assert s.sparks == [] and s.fits == [] and s.no_data_note == "no telemetry recorded"
    planned = [*PLANNED, PlannedCheck(id="perf.soak", step=5, kind="perf.soak", timeout_s=600)]
    res = make_results(steps=[1, 2, 3, 4, 5], checks=[], complete=False).model_copy(update={"planned": planned})
    v = build_view(res).perf
    assert [(x.id, x.status.label, x.no_data_note) for x in v.soak] == [("perf.soak", "not run", "")]


def test_hostile_text_is_escaped_in_html_and_svg() -> None:
    c = soak_check(0.5, message=XSS_SCRIPT, records_file=XSS_ATTR, cid=f"perf.soak.{XSS_ATTR}")
    c.details["telemetry"]["host"][XSS_SCRIPT + "_mib"] = [1.0] * N
    c.details["telemetry"]["errors"][0]["error"] = XSS_ATTR
    c.details["requests"]["errors"] = {XSS_SCRIPT: 3}
    page = render(build_view(make_results(steps=[1, 2, 3, 4, 5], checks=[c])))
    assert XSS_SCRIPT not in page and XSS_ATTR not in page
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    assert parsed.tags.count("script") == 1 and parsed.tags.count("img") == 0
    assert not [a for a in parsed.attrs if a[1].lower().startswith("on")]
    ids = [val for _, k, val in parsed.attrs if k == "id"]
    assert len(ids) == len(set(ids))


def test_two_soaks_get_distinct_blocks_and_the_page_is_well_formed() -> None:
    page = render(build_view(make_results(steps=[1, 2, 3, 4, 5], checks=[soak_check(cid="perf.soak"),
                                                                              soak_check(cid="perf.soak ")])))
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    blocks = re.findall(r'id="(soak-[^"]*)"', page)
    assert blocks == ["soak-perf.soak", "soak-perf.soak-2"]
    assert "<h3>Stability soak</h3>" in page


@pytest.mark.parametrize("details", [{"telemetry": "junk"}, {"memory": [1, None, {"fit": "x"}]},
                                     {"telemetry": {"host": {"t_s": [1, 2], "server_rss_mib": ["a", None]}}},
                                     {"requests": None, "counters": [None, {"counter": 1}]}])
def test_malformed_details_do_not_break_the_page(details: dict[str, Any]) -> None:
    c = CheckResult(step=5, id="perf.soak", kind="perf.soak", status=Status.FAIL, message="m", details=details)
    page = render(build_view(make_results(steps=[1, 2, 3, 4, 5], checks=[c])))
    assert _parse(page).errors == []


def test_the_view_is_plain_json_data() -> None:
    data = dataclasses.asdict(perf([soak_check()]))
    back = json.loads(json.dumps(data))
    assert back["soak"][0]["sparks"][0]["svg"].startswith("<svg")


# ---------------------------------------------------------------- the sparkline itself


def test_a_long_series_is_decimated_without_losing_a_spike() -> None:
    points: list[tuple[float | None, float | None]] = [(float(i), 100.0) for i in range(5000)]
    points[3333] = (3333.0, 900.0)
    root = svg_root(svg.sparkline("rss", points, unit="MiB"))
    line = root.find(f"{SVG}polyline")
    assert line is not None
    coords = line.get("points", "").split()
    assert len(coords) <= 2 * svg.SPARK_BUCKETS
    ys = [float(c.split(",")[1]) for c in coords]
    assert min(ys) == pytest.approx(svg.SPARK_TOP)  # the spike is the top of the chart, still drawn
    assert "max 900" in (root.findtext(f"{SVG}title") or "")


def test_gaps_break_the_line_and_empty_series_say_no_data() -> None:
    root = svg_root(svg.sparkline("x", [(0.0, 1.0), (1.0, 2.0), (2.0, None), (3.0, float("nan")), (4.0, 3.0),
                                        (5.0, 4.0)]))
    assert len(root.findall(f"{SVG}polyline")) == 2
    empty = svg_root(svg.sparkline("x", [(0.0, None)]))
    assert "no data" in (empty.findtext(f"{SVG}title") or "") and empty.find(f"{SVG}polyline") is None
    flat = svg_root(svg.sparkline("x", [(0.0, 5.0), (1.0, 5.0)]))  # no division by a zero range
    assert flat.find(f"{SVG}polyline") is not None
