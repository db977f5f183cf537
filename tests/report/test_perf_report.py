"""The step-5 section: micro-benchmark tables against their peak, serving scenarios, charts.

Results are hand-made in the exact ``details`` shapes of docs/perf.md (the contract the
step-5 checks write), so these tests pin what the report reads.
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.report.perf import (
    MicroRow,
    MicroView,
    PerfView,
    build_perf,
    precise_time,
    rate,
)
from adaptcheck.report.perf_serving import ScenarioView, records_link
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view

from .factory import PLANNED, XSS_ATTR, XSS_SCRIPT, make_results
from .test_render import _parse

SVG = "{http://www.w3.org/2000/svg}"

# ---------------------------------------------------------------- builders (the contract's shapes)


def h200_peak(**kw: Any) -> dict[str, Any]:
    peak = {"device": "NVIDIA H200", "entry": "h200_sxm", "source": "https://example.invalid/h200-datasheet.pdf",
            "verified": True, "flops": {"bf16": 9.89e14, "fp16": 9.89e14, "fp32": 6.7e13, "fp8_e4m3": 1.979e15},
            "memory_bw": 4.8e12, "host_link_bw": 6.4e10, "derivation": []}
    peak.update(kw)
    return peak


CPU_DERIVATION = ["2 cores × 2.1 GHz × 2 FMA units × 16 fp32 lanes × 2 FLOP/FMA = 268.8 GFLOP/s fp32",
                  "memory: 2 channels × DDR5-4800 × 8 bytes = 76.8 GB/s"]


def cpu_peak() -> dict[str, Any]:
    return {"device": "AMD EPYC 9654", "entry": "derived:cpu", "source": "/proc/cpuinfo, lscpu", "verified": True,
            "flops": {"fp32": 2.688e11}, "memory_bw": 7.68e10, "host_link_bw": None, "derivation": CPU_DERIVATION}


def gemm_row(**kw: Any) -> dict[str, Any]:
    row = {"name": "prefill m=2048 n=4096 k=4096", "dtype": "bf16", "params": {"m": 2048, "n": 4096, "k": 4096},
           "flops": 6.87e10, "bytes": 5.0e7,
           "time_s": {"median": 0.0012, "min": 0.0011, "p10": 0.00115, "p90": 0.00125, "mean": 0.0012,
                      "spread": 0.083, "n": 20},
           "achieved": {"flops_per_s": 5.7e13, "bytes_per_s": 4.1e10}, "efficiency": 0.58,
           "arithmetic_intensity": 1365.3, "ridge_point": 206.0, "bound": "compute", "status": "ok", "reason": "",
           "extra": {}}
    row.update(kw)
    return row


def not_run_row(**kw: Any) -> dict[str, Any]:
    row = gemm_row(name="prefill fp8", dtype="fp8_e4m3", time_s={}, achieved={"flops_per_s": None,
                   "bytes_per_s": None}, efficiency=None, arithmetic_intensity=None, bound=None, status="not_run",
                   reason="dtype fp8_e4m3 not supported by this device")
    row.update(kw)
    return row


def copy_row(**kw: Any) -> dict[str, Any]:
    row = {"name": "device copy 1 GiB", "dtype": None, "params": {"bytes": 1073741824}, "flops": None,
           "bytes": 2147483648, "time_s": {"median": 0.00055, "p10": 0.00054, "p90": 0.00056, "spread": 0.036, "n": 30},
           "achieved": {"flops_per_s": None, "bytes_per_s": 3.9e12}, "efficiency": 0.8125,
           "arithmetic_intensity": None, "ridge_point": None, "bound": "memory", "status": "ok", "reason": "", "extra": {}}
    row.update(kw)
    return row


def micro(cid: str, kind: str, rows: list[dict[str, Any]], *, status: Status = Status.PASS,
          peak: dict[str, Any] | None = None, message: str = "", applicable: bool = True,
          timer: str = "device events") -> CheckResult:
    details = {"benchmark": kind.split(".", 1)[1], "timer": timer, "peak": peak, "rows": rows}
    return CheckResult(step=5, id=cid, kind=kind, status=status, applicable=applicable, message=message,
                       details=details, duration_s=4.5)


def stats(m: float) -> dict[str, float]:
    return {"mean": m, "median": m, "std": m / 10, "p50": m, "p90": m * 1.5, "p95": m * 1.8, "p99": m * 2.5,
            "min": m / 2, "max": m * 3}


def summary(scale: float = 1.0, *, failed: int = 0, errors: dict[str, int] | None = None) -> dict[str, Any]:
    return {"completed": 32, "failed": failed, "error_rate": failed / (32 + failed), "errors": errors or {},
            "duration_s": 12.3, "request_throughput": 2.6 * scale, "output_throughput": 166.0 * scale,
            "total_input_tokens": 4096, "total_output_tokens": 2048, "token_source": "usage", "token_mismatches": 0,
            "ttft_ms": stats(120.0), "tpot_ms": stats(20.0), "itl_ms": stats(19.0), "itl_per_token_ms": stats(19.0),
            "e2el_ms": stats(1400.0), "queue_ms": stats(0.4), "goodput": 2.4, "slo_attainment": 0.93,
            "chunks_per_token": 1.0}


def quantiles(m: float) -> list[float]:
    return [m * (0.5 + 0.1 * i) for i in range(21)]


def level(lv: float, scale: float = 1.0, *, spread: dict[str, float] | None = None,
          errors: dict[str, int] | None = None, failed: int = 0) -> dict[str, Any]:
    runs = [summary(scale, failed=failed, errors=errors) for _ in range(3)]
    return {"level": lv, "runs": runs, "median": summary(scale, failed=failed),
            "spread": spread or {"ttft_ms_median": 0.04, "tpot_ms_median": 0.02, "output_tok_per_s": 0.03},
            "distributions": {k: quantiles(m * scale) for k, m in
                              (("ttft_ms", 120.0), ("tpot_ms", 20.0), ("itl_ms", 19.0), ("e2el_ms", 1400.0))}}


def serving(name: str = "concurrent_short", *, arrival: str = "concurrency", levels: list[dict[str, Any]] | None = None,
            status: Status = Status.PASS, message: str = "", client: dict[str, Any] | None = None,
            records: Any = None, max_spread: float = 0.15) -> CheckResult:
    levels = levels if levels is not None else [level(1, 1.0), level(4, 3.2), level(8, 5.1)]
    details = {
        "scenario": {"name": name, "arrival": arrival, "levels": [lv["level"] for lv in levels], "input_tokens": 128,
                     "output_tokens": 64, "mixed": None, "num_requests": 32, "duration_s": None,
                     "warmup_requests": 4, "repeats": 3, "max_spread": max_spread,
                     "slo": {"ttft_ms": 2000, "tpot_ms": 200}},
        "server": {"name": "vllm_serve", "url": "http://127.0.0.1:8123/v1", "served_model": "tiny",
                   "server_command": "vllm serve /m --port 8123", "capabilities": {"chat": True}},
        "levels": levels,
        "records_file": records if records is not None else f"perf/serving/{name}.jsonl",
        "client": client or {"cpu_percent": 23.0, "overhead_us_per_token": 41.0, "loop_lag_ms_p99": 1.2,
                             "bottleneck": False, "warning": ""},
        "server_memory": {"rss_mib_before": 2048.0, "rss_mib_after": 2100.5, "kv_cache_usage": 0.42},
    }
    return CheckResult(step=5, id=f"perf.serving.{name}", kind="perf.serving", status=status, message=message,
                       details=details, duration_s=95.0)


def results(checks: list[CheckResult], **kw: Any) -> RunResults:
    base = [c for c in make_results().checks if c.step != 5]
    return make_results(steps=[1, 2, 3, 4, 5], checks=base + checks, **kw)


def view(checks: list[CheckResult], **kw: Any) -> PerfView:
    return build_view(results(checks, **kw)).perf


def section(page: str) -> str:
    return page[page.index('<section id="perf"'):page.index('<section id="reproduce"')]


def text(html: str) -> str:
    """Visible text with tags dropped and whitespace collapsed."""
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", html)))


def page_of(checks: list[CheckResult], **kw: Any) -> str:
    return section(render(build_view(results(checks, **kw))))


def micro_view(v: PerfView, cid: str) -> MicroView:
    return next(m for m in v.micro if m.id == cid)


def scenario(v: PerfView, name: str) -> ScenarioView:
    return next(s for s in v.serving if s.name == name)


def svgs(html: str) -> list[ET.Element]:
    """Every inline chart, parsed as standalone XML (which also proves it is well-formed)."""
    return [ET.fromstring(m) for m in re.findall(r"<svg xmlns=.*?</svg>", html, re.DOTALL)]


# ---------------------------------------------------------------- micro-benchmarks


def test_gemm_row_numbers_efficiency_and_bound() -> None:
    m = micro_view(view([micro("perf.gemm", "perf.gemm", [gemm_row()], peak=h200_peak())]), "perf.gemm")
    assert (m.title, m.status.key, m.timer, m.anchor) == ("GEMM (matrix multiply)", "pass", "device events",
                                                         "check-perf.gemm")
    (r,) = m.rows
    assert dataclasses.astuple(r)[:13] == (
        "prefill m=2048 n=4096 k=4096", "", "bf16", "1.2 ms", "8.3% (n=20)", "57 TFLOP/s",
        "41 GB/s", "989 TFLOP/s", "58.0%", False, "1365.3 FLOP/B", "206 FLOP/B", "compute")
    assert (r.status.key, r.status.label) == ("pass", "ok")
    # The status first: in view on a phone before the table is scrolled.
    row_html = re.search(r"<tr>\s*<td><span class=\"status[^>]*>.*?</tr>", page_of([micro("perf.gemm", "perf.gemm", [gemm_row()],
                                                                             peak=h200_peak())]), re.DOTALL)
    assert row_html and text(row_html.group(0)).split() == [
        "✓", "ok", "prefill", "m=2048", "n=4096", "k=4096", "bf16", "1.2", "ms", "8.3%", "(n=20)",
        "57", "TFLOP/s", "41", "GB/s", "989", "TFLOP/s", "58.0%", "1365.3", "FLOP/B", "206", "FLOP/B", "compute"]


def test_memory_bound_row_is_measured_against_bandwidth() -> None:
    (r,) = micro_view(view([micro("perf.memory_bandwidth", "perf.memory_bandwidth", [copy_row()], peak=h200_peak())]),
                      "perf.memory_bandwidth").rows
    assert (r.achieved, r.achieved_other, r.peak, r.efficiency, r.bound) == ("3.9 TB/s", "", "4.8 TB/s", "81.2%",
                                                                             "memory")
    assert (r.dtype, r.intensity, r.ridge, r.time) == ("—", "—", "—", "550 µs")
    assert r.problem == "bytes=1,073,741,824"  # not in the name: shown under it
    link = copy_row(name="host to device pinned", bound="link", achieved={"bytes_per_s": 5.1e10}, efficiency=0.8)
    (r,) = micro_view(view([micro("perf.host_device", "perf.host_device", [link], peak=h200_peak())]),
                      "perf.host_device").rows
    assert (r.achieved, r.peak) == ("51 GB/s", "64 GB/s")


def test_peak_block_source_verified_and_figures() -> None:
    v = view([micro("perf.gemm", "perf.gemm", [gemm_row()], peak=h200_peak()),
              micro("perf.memory_bandwidth", "perf.memory_bandwidth", [copy_row()], peak=h200_peak())])
    (pk,) = v.peaks  # the same peak for both checks: shown once
    assert (pk.device, pk.entry, pk.verified.label, pk.note) == ("NVIDIA H200", "h200_sxm", "verified", "")
    assert [u.id for u in pk.used_by] == ["perf.gemm", "perf.memory_bandwidth"]
    figures = {f.label: f.value for f in pk.figures}
    assert figures == {"bf16 dense": "989 TFLOP/s", "fp16 dense": "989 TFLOP/s", "fp32 dense": "67 TFLOP/s",
                       "fp8_e4m3 dense": "1.979 PFLOP/s", "memory bandwidth": "4.8 TB/s",
                       "host link": "64 GB/s per direction"}
    t = text(page_of([micro("perf.gemm", "perf.gemm", [gemm_row()], peak=h200_peak(verified=False))]))
    assert "Peak figures NVIDIA H200" in t and "https://example.invalid/h200-datasheet.pdf" in t
    assert "– unverified" in t and "marked unverified in matrices/peaks.yaml" in t


def test_cpu_peak_shows_its_derivation() -> None:
    row = gemm_row(dtype="fp32", achieved={"flops_per_s": 1.9e11, "bytes_per_s": None}, efficiency=0.707,
                   ridge_point=3.5)
    checks = [micro("perf.gemm", "perf.gemm", [row], peak=cpu_peak(), timer="synchronize + perf_counter")]
    (pk,) = view(checks).peaks
    assert pk.entry == "derived:cpu" and pk.derivation == CPU_DERIVATION
    assert {f.label: f.value for f in pk.figures}["host link"] == "not known"
    t = text(page_of(checks))
    assert "Derived from what this machine reports" in t and CPU_DERIVATION[0] in t and CPU_DERIVATION[1] in t
    assert "timed with synchronize + perf_counter" in t and "190 GFLOP/s" in t and "268.8 GFLOP/s" in t


def test_not_run_rows_show_their_reason_never_ok() -> None:
    rows = [gemm_row(), not_run_row(), gemm_row(name="odd", status="exploded")]
    m = micro_view(view([micro("perf.gemm", "perf.gemm", rows, status=Status.FAIL, peak=h200_peak())]), "perf.gemm")
    nr, odd = m.rows[1], m.rows[2]
    assert (nr.status.key, nr.status.label, nr.reason) == ("notrun", "not run",
                                                           "dtype fp8_e4m3 not supported by this device")
    assert (nr.time, nr.achieved, nr.peak, nr.efficiency, nr.bound) == ("—", "—", "—", "—", "—")
    assert odd.status.key == "notrun" and odd.status.label == "exploded"  # unknown word: never a pass
    t = text(page_of([micro("perf.gemm", "perf.gemm", rows, peak=h200_peak())]))
    assert "· not run dtype fp8_e4m3 not supported by this device" in t


def test_efficiency_over_peak_is_flagged() -> None:
    checks = [micro("perf.gemm", "perf.gemm", [gemm_row(efficiency=1.37)], peak=h200_peak())]
    (r,) = micro_view(view(checks), "perf.gemm").rows
    assert r.over_peak and r.efficiency == "137.0%"
    assert '<span class="ratio over" title="over 100 %' in page_of(checks)


@pytest.mark.parametrize(("status", "applicable", "key", "note"), [
    (Status.ERROR, True, "error", "no measurements: the check errored"),
    (Status.SKIP, False, "na", "not measured: not applicable here"),
    (Status.SKIP, True, "skip", "not measured: skipped"),
])
def test_errored_or_skipped_check_shows_its_reason(status: Status, applicable: bool, key: str, note: str) -> None:
    msg = f"{key}: worker died with SIGSEGV {XSS_SCRIPT}"
    c = CheckResult(step=5, id="perf.host_device", kind="perf.host_device", status=status, applicable=applicable,
                    message=msg, duration_s=0.1)
    m = micro_view(view([c]), "perf.host_device")
    assert (m.status.key, m.message, m.rows, m.no_rows_note) == (key, msg, [], note)
    sec = page_of([c])
    assert "✓" not in sec and str(escape(msg)) in sec and XSS_SCRIPT not in sec and note in text(sec)


def test_no_peak_known_says_so() -> None:
    row = gemm_row(efficiency=None, bound=None, ridge_point=None)
    c = micro("perf.gemm", "perf.gemm", [row], status=Status.SKIP, peak=None,
              message="no peak known for 'Mystery NPU': add one to matrices/peaks.yaml")
    v = view([c])
    m = micro_view(v, "perf.gemm")
    assert v.peaks == [] and m.status.key == "skip" and "no peak known" in m.peak_note
    assert (m.rows[0].efficiency, m.rows[0].peak, m.rows[0].bound) == ("—", "—", "—")
    assert "add one to matrices/peaks.yaml" in text(page_of([c]))


def test_collectives_extra_and_units() -> None:
    row = copy_row(name="all_reduce 256 MiB", bound="network", efficiency=None,
                   extra={"algbw": 1.2e10, "busbw": 2.25e10, "world_size": 2, "op": "all_reduce"})
    (r,) = micro_view(view([micro("perf.collectives", "perf.collectives", [row], peak=h200_peak())]),
                      "perf.collectives").rows
    assert r.extra == "algbw 12 GB/s, busbw 22.5 GB/s, world size 2, op all_reduce" and r.bound == "network"
    assert (rate(None, "B/s"), rate(950.0, "B/s"), rate(float("inf"), "B/s")) == ("—", "950 B/s", "inf")
    assert (precise_time(8.531e-5), precise_time(2.5), precise_time(3e-8), precise_time(0)) == (
        "85.31 µs", "2.5 s", "30 ns", "0")


# ---------------------------------------------------------------- serving


def test_serving_summary_table_per_level() -> None:
    s = scenario(view([serving()]), "concurrent_short")
    assert (s.status.key, s.anchor, s.block, s.level_word) == ("pass", "check-perf.serving.concurrent_short",
                                                               "perf-perf.serving.concurrent_short", "concurrency")
    assert [r.level for r in s.levels] == ["1", "4", "8"] and [r.runs for r in s.levels] == [3, 3, 3]
    r = s.levels[1]
    assert (r.req_per_s, r.out_tok_per_s, r.error_rate, r.goodput, r.slo_attainment, r.queue) == (
        "8.32", "531.2", "0.0%", "2.4", "93.0% met SLO", "0.4 / 1")
    assert r.latency == ["120 / 180 / 300", "20 / 30 / 50", "19 / 28.5 / 47.5", "1400 / 2100 / 3500"]
    assert r.tokens == "usage; 1 chunks/token"
    offered = {f.label: f.value for f in s.offered}
    assert offered["levels"] == "1, 4, 8" and offered["spread bound"] == "15.0%"
    assert offered["SLO"] == "TTFT ≤ 2000 ms, TPOT ≤ 200 ms" and offered["lengths"] == "128 input → 64 output tokens"
    assert {f.label: f.value for f in s.server}["URL"] == "http://127.0.0.1:8123/v1"
    assert {f.label: f.value for f in s.memory} == {"RSS before": "2048 MiB", "RSS after": "2100.5 MiB",
                                                    "KV-cache usage": "42.0%", "RSS growth": "52.5 MiB"}
    assert len(s.runs) == 9 and s.runs[3].level == "4" and s.runs[3].run == 1
    t = text(page_of([serving()]))
    assert "Scenario concurrent_short" in t and "8.32 531.2 120 / 180 / 300 20 / 30 / 50" in t
    assert "client overhead 41 µs per output token" in t
    # Each measured run and the latency percentiles are on the details page, linked from the block.
    assert 'href="report-details.html#perf-perf.serving.concurrent_short-details"' in page_of([serving()])
    details = render(build_view(results([serving()])), "details")
    assert "9 measured runs" in text(details) and "TTFT by percentile — concurrent_short" in details


def test_over_bound_spread_is_highlighted() -> None:
    levels = [level(1), level(4, spread={"ttft_ms_median": 0.22, "tpot_ms_median": 0.02, "output_tok_per_s": 0.05})]
    c = serving(levels=levels, status=Status.FAIL, message="level 4: TTFT median spread 22.0% > 15.0%")
    s = scenario(view([c]), "concurrent_short")
    assert s.spread_metrics == ["TTFT median", "TPOT median", "output tok/s"] and s.spread_bound == "15.0%"
    assert [(x.value, x.over) for x in s.levels[1].spread] == [("22.0%", True), ("2.0%", False), ("5.0%", False)]
    assert not any(x.over for x in s.levels[0].spread)
    sec = page_of([c])
    cells = re.findall(r'<td class="num over-bound">(.*?)</td>', sec)
    assert len(cells) == 1 and "22.0%" in cells[0] and "over bound" in cells[0]
    assert "bound 15.0%" in text(sec) and "✗ fail level 4: TTFT median spread 22.0% > 15.0%" in text(sec)


def test_errors_and_client_bottleneck_warning() -> None:
    errors = {f"EndpointStatusError: 500 {XSS_SCRIPT}": 2}
    client = {"cpu_percent": 99.0, "overhead_us_per_token": 410.0, "loop_lag_ms_p99": 45.0, "bottleneck": True,
              "warning": "client CPU at 99% of one core"}
    c = serving(levels=[level(4, errors=errors, failed=2)], client=client, status=Status.FAIL)
    s = scenario(view([c]), "concurrent_short")
    r = s.levels[0]
    assert r.errors == [f"EndpointStatusError: 500 {XSS_SCRIPT} ×6"] and r.errors_present and r.error_rate == "5.9%"
    assert s.client_warning.startswith("the load generator, not the server, limited this run")
    assert s.client_warning.endswith("client CPU at 99% of one core")
    sec = page_of([c])
    assert '<p class="warning"><strong>Load generator warning.</strong>' in sec
    assert XSS_SCRIPT not in sec and str(escape(f"EndpointStatusError: 500 {XSS_SCRIPT} ×6")) in sec
    assert re.search(r'<td class="num over-bound">5.9%', sec)


def test_records_link_is_relative_and_safe() -> None:
    link = scenario(view([serving()]), "concurrent_short").records
    assert link is not None and (link.text, link.href) == ("perf/serving/concurrent_short.jsonl",) * 2
    assert '<a href="perf/serving/concurrent_short.jsonl"><code>' in page_of([serving()])
    assert records_link("perf/serving/a b#c.jsonl", "../runs/r1") == records_link("perf/serving/a b#c.jsonl",
                                                                                   "../runs/r1/")
    assert records_link("perf/a b#c.jsonl", "../r1") is not None
    assert records_link("perf/a b#c.jsonl", "../r1").href == "../r1/perf/a%20b%23c.jsonl"  # type: ignore[union-attr]
    for hostile in ("javascript:alert(1)", "/etc/passwd", "//evil.example/x", "../../secret", "c:\\x.jsonl"):
        got = records_link(hostile)
        assert got is not None and got.href == "" and got.text == hostile, hostile
    assert records_link(None) is None and records_link(42) is None
    sec = page_of([serving(records="javascript:alert(1)")])
    assert "javascript:" not in re.sub(r"<code>javascript:alert\(1\)</code>", "", sec)


def test_errored_scenario_without_levels() -> None:
    c = CheckResult(step=5, id="perf.serving.long", kind="perf.serving", status=Status.ERROR,
                    message=f"server died before any measured run: {XSS_SCRIPT}", duration_s=3.0)
    s = scenario(view([c]), "long")
    assert (s.status.key, s.levels, s.latency_charts, s.throughput_charts) == ("error", [], [], [])
    assert s.no_data_note == "no measured run finished: no numbers recorded" and s.records is None
    sec = page_of([c])
    assert "! error" in text(sec) and XSS_SCRIPT not in sec and "no measured run finished" in sec


def test_scenario_charts_latency_and_throughput() -> None:
    s = scenario(view([serving()]), "concurrent_short")
    assert [c.title for c in s.latency_charts] == [f"{m} by percentile — concurrent_short"
                                                   for m in ("TTFT", "TPOT", "ITL", "E2EL")]
    assert [c.title for c in s.throughput_charts] == ["output tok/s vs level — concurrent_short",
                                                      "req/s vs level — concurrent_short"]
    root = ET.fromstring(str(s.latency_charts[0].svg))
    legend = [t.text for t in root.iter(f"{SVG}text")]
    assert {"c=1", "c=4", "c=8"} <= set(legend)
    assert len(root.findall(f".//{SVG}polyline")) == 3 and len(list(root.iter(f"{SVG}circle"))) == 63
    # Poisson levels are rates, and say so.
    p = scenario(view([serving("poisson_mix", arrival="poisson", levels=[level(0.5), level(2.0)])]), "poisson_mix")
    assert p.level_word == "rate (req/s)" and [r.level for r in p.levels] == ["0.5 req/s", "2 req/s"]
    assert "0.5 req/s" in {t.text for t in ET.fromstring(str(p.latency_charts[0].svg)).iter(f"{SVG}text")}


def test_combined_chart_across_concurrency_scenarios() -> None:
    one = view([serving("a"), serving("p", arrival="poisson")])
    assert one.combined == []  # a single concurrency scenario: its own chart says it all
    two = view([serving("a"), serving("b", levels=[level(2, 1.5), level(16, 7.0)]), serving("p", arrival="poisson")])
    assert [c.title for c in two.combined] == ["output tok/s vs level — concurrency scenarios",
                                               "req/s vs level — concurrency scenarios"]
    root = ET.fromstring(str(two.combined[0].svg))
    assert len(root.findall(f".//{SVG}polyline")) == 2
    assert {"a", "b"} <= {t.text for t in root.iter(f"{SVG}text")}
    assert "Throughput across the concurrency scenarios" in page_of(
        [serving("a"), serving("b", levels=[level(2, 1.5), level(16, 7.0)])])


def test_empty_distributions_give_no_data_not_a_crash() -> None:
    bare = level(4)
    bare["distributions"] = {"ttft_ms": [], "tpot_ms": [float("nan")] * 21, "itl_ms": None}
    bare["median"] = {}
    s = scenario(view([serving(levels=[bare])]), "concurrent_short")
    titles = {c.title.split()[0]: c.svg for c in s.latency_charts}
    for metric in ("TTFT", "TPOT", "ITL", "E2EL"):
        assert "no data" in titles[metric], metric
        ET.fromstring(str(titles[metric]))
    assert s.throughput_charts == [] and s.levels[0].req_per_s == "—" and s.levels[0].latency == ["—"] * 4


def test_hostile_scenario_text_is_escaped_in_html_and_svg() -> None:
    c = serving(XSS_SCRIPT, levels=[level(4)], message=XSS_SCRIPT, records=XSS_ATTR)
    c.details["server"]["served_model"] = XSS_ATTR
    page = render(build_view(results([c, serving(XSS_ATTR)])))
    assert XSS_SCRIPT not in page and XSS_ATTR not in page
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    assert parsed.tags.count("script") == 1 and parsed.tags.count("img") == 0
    assert not [a for a in parsed.attrs if a[1].lower().startswith("on")]
    details = render(build_view(results([c, serving(XSS_ATTR)])), "details")  # latency charts are there
    assert XSS_SCRIPT not in details and XSS_ATTR not in details
    charts = svgs(section(page)) + svgs(details[details.index('<section id="perf-details"'):])
    assert charts and all(not list(root.iter(f"{SVG}script")) and not list(root.iter("script")) for root in charts)
    titles = [root.findtext(f"{SVG}title") for root in charts]
    assert f"TTFT by percentile — {XSS_SCRIPT}" in titles  # the text survives, as text


# ---------------------------------------------------------------- the section as a whole


def test_step5_not_selected_says_not_run() -> None:
    v = build_view(make_results()).perf
    assert not v.ran and v.not_run_status is not None and v.not_run_status.key == "notrun"
    assert "step 5 not run: it was not selected" in v.not_run_reason
    assert "step 5 not run: it was not selected" in text(section(render(build_view(make_results()))))


def test_step5_ran_without_perf_checks_is_na() -> None:
    res = results([]).model_copy(update={"planned": [p for p in PLANNED if p.step != 5]})
    v = build_perf(res, {})
    assert not v.ran and v.not_run_status is not None and v.not_run_status.key == "na"
    assert v.not_run_reason == "step 5 ran but this ladder has no performance checks"


def test_planned_checks_without_result_are_not_run() -> None:
    planned = [*PLANNED, PlannedCheck(id="perf.serving", step=5, kind="perf.serving", timeout_s=900)]
    res = results([], complete=False).model_copy(update={"planned": planned})
    v = build_view(res).perf
    assert [(m.id, m.status.key, m.message) for m in v.micro] == [
        ("perf.gemm", "notrun", "not reached: the run ended before this check recorded a result")]
    assert [(s.id, s.status.label, s.no_data_note) for s in v.serving] == [("perf.serving", "not run", "")]
    sec = section(render(build_view(res)))
    assert "✓" not in sec and text(sec).count("not reached") == 2


def test_page_is_well_formed_with_unique_ids_and_live_links() -> None:
    checks = [micro("perf.gemm", "perf.gemm", [gemm_row(), not_run_row()], peak=h200_peak()),
              micro("perf.memory_bandwidth", "perf.memory_bandwidth", [copy_row()], peak=cpu_peak()),
              serving("a"), serving("b", levels=[level(2), level(16, 4.0)]), serving("p", arrival="poisson")]
    page = render(build_view(results(checks)))
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    ids = [val for _, k, val in parsed.attrs if k == "id"]
    assert len(ids) == len(set(ids)) and "perf" in ids
    hrefs = [val for _, k, val in parsed.attrs if k == "href" and val]
    assert {h[1:] for h in hrefs if h.startswith("#")} <= set(ids)
    detail_ids = {val for _, k, val in _parse(render(build_view(results(checks)), "details")).attrs if k == "id"}
    to_details = {h.partition("#")[2] for h in hrefs if h.startswith("report-details.html#")}
    assert to_details and to_details <= detail_ids  # links to the details page land on an id there
    assert sorted(h for h in hrefs if not h.startswith(("#", "report-details.html#"))) == [
        f"perf/serving/{n}.jsonl" for n in "abp"]
    assert '<li><a href="#perf">Performance baseline</a></li>' in page
    # Two different peaks: each block is numbered and lists the checks that use it.
    v = build_view(results(checks)).perf
    assert len(v.peaks) == 2 and micro_view(v, "perf.gemm").peak_note == "efficiencies against peak figures 1"
    # Main page: two throughput charts per scenario plus the combined two; the latency charts are on the details page.
    assert len(svgs(section(page))) == 3 * 2 + 2


def test_perf_view_is_plain_json_data() -> None:
    checks = [micro("perf.gemm", "perf.gemm", [gemm_row()], peak=h200_peak()), serving("a"), serving("b")]
    data = dataclasses.asdict(build_view(results(checks)))
    back = json.loads(json.dumps(data))
    assert back["perf"]["micro"][0]["rows"][0]["efficiency"] == "58.0%"
    assert back["perf"]["serving"][0]["latency_charts"][0]["svg"].startswith("<svg")


def test_template_never_bypasses_escaping() -> None:
    template = (Path(__file__).parents[2] / "adaptcheck" / "report" / "templates" / "perf.html.j2").read_text()
    assert "|safe" not in template.replace(" ", "") and "autoescape false" not in template


def test_row_fields_are_what_the_template_shows() -> None:
    """Guard: a field added to MicroRow must also get a column (or be deliberately omitted)."""
    shown = {"name", "problem", "dtype", "time", "spread", "achieved", "achieved_other", "peak", "efficiency",
             "over_peak", "intensity", "ridge", "bound", "status", "reason", "extra"}
    assert {f.name for f in dataclasses.fields(MicroRow)} == shown


def test_skipped_scenario_shows_its_reason() -> None:
    c = CheckResult(step=5, id="perf.serving.short", kind="perf.serving", status=Status.SKIP, applicable=False,
                    message="no server: framework absent and no --endpoint", duration_s=0.0)
    s = scenario(view([c]), "short")
    assert (s.status.key, s.status.label, s.no_data_note) == ("na", "n/a", "")
    t = text(page_of([c]))
    assert "○ n/a no server: framework absent and no --endpoint" in t and "✓" not in t


@pytest.mark.parametrize("details", [
    {"rows": 5, "peak": "x", "timer": None},
    {"rows": [{"time_s": [], "achieved": 3, "params": "m=1", "extra": None, "status": None}], "peak": {"flops": 1}},
    {"rows": [gemm_row(time_s={"median": "nan", "spread": "inf"}, efficiency="nan")],
     "peak": h200_peak(derivation=7, flops=None)},
])
def test_malformed_micro_details_do_not_break_the_page(details: dict[str, Any]) -> None:
    c = CheckResult(step=5, id="perf.gemm", kind="perf.gemm", status=Status.FAIL, details=details)
    m = micro_view(view([c]), "perf.gemm")
    assert m.status.key == "fail" and all(r.efficiency == "—" for r in m.rows)
    assert [r.status.label for r in m.rows if r.status.key == "pass"] in ([], ["ok"])  # only a literal 'ok' is ok
    parsed = _parse(page_of([c]))
    assert parsed.errors == [] and parsed.stack == []


@pytest.mark.parametrize("details", [
    {"levels": 5, "scenario": "x", "client": [], "server_memory": None, "records_file": "."},
    {"levels": [{"level": None, "runs": "abc", "median": [], "spread": None, "distributions": {"ttft_ms": "x"}}],
     "scenario": {"arrival": "concurrency", "levels": None, "mixed": [1, {"input_tokens": 8}], "slo": [1]}},
    {"levels": [dict(level(4), runs=[{"errors": {"boom": "inf"}}, 7])], "records_file": ["a"],
     "client": {"bottleneck": "yes"}},
])
def test_malformed_serving_details_do_not_break_the_page(details: dict[str, Any]) -> None:
    c = CheckResult(step=5, id="perf.serving.x", kind="perf.serving", status=Status.FAIL, details=details)
    s = scenario(view([c]), "x")
    assert s.status.key == "fail" and s.client_warning == ""  # only a literal true is a bottleneck
    parsed = _parse(page_of([c]))
    assert parsed.errors == [] and parsed.stack == []
    for chart in s.latency_charts + s.throughput_charts:
        ET.fromstring(str(chart.svg))


def test_a_report_written_outside_the_run_folder_links_the_records_through_it(tmp_path: Path) -> None:
    from adaptcheck.report import write_report

    run_dir = tmp_path / "reports" / "run1"
    (run_dir / "perf" / "serving").mkdir(parents=True)
    (run_dir / "perf" / "serving" / "concurrent_short.jsonl").write_text("{}\n")
    res = results([serving()])
    inside, elsewhere = run_dir / "report.html", tmp_path / "share" / "report.html"
    write_report(res, inside, run_dir=run_dir)
    write_report(res, elsewhere, run_dir=run_dir)
    for page, href in ((inside, "perf/serving/concurrent_short.jsonl"),
                       (elsewhere, "../reports/run1/perf/serving/concurrent_short.jsonl")):
        text = page.read_text(encoding="utf-8")
        assert f'href="{href}"' in text, page
        assert (page.parent / href).resolve().is_file()  # the link resolves from where the page is
