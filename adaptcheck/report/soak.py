"""View data of the stability soak (``perf.soak``) — plain data, no HTML: the verdict, what was
offered, how long it ran and why it stopped, the requests, the memory fits against the bound,
device error counters and a sparkline per telemetry field, read from the check's
:class:`~adaptcheck.base.schemas.serving_evidence.SoakEvidence` (details that do not fit read
as none; charts escape what they write). Shapes: docs/perf.md, "Soak outcome".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from markupsafe import Markup

from adaptcheck.base.schemas.results import CheckResult
from adaptcheck.base.schemas.serving_evidence import (
    MemoryTrend,
    SoakDecision,
    SoakEcho,
    SoakEvidence,
    SoakRequests,
    SoakTelemetry,
)
from adaptcheck.perf.arrival import Arrival
from adaptcheck.report import svg
from adaptcheck.report.fmt import Label, as_float, format_float, format_value
from adaptcheck.report.framework import Fact
from adaptcheck.report.perf_serving import FileLink, num, pct, records_link
from adaptcheck.report.perf_serving import given as _given

# Telemetry fields as the report names them, with their unit; others show under their key.
FIELDS: dict[str, tuple[str, str]] = {
    "server_rss_mib": ("server RSS", "MiB"),
    "cpu_utilization_pct": ("host CPU busy", "%"),
    "cpu_frequency_mhz": ("CPU frequency", "MHz"),
    "memory_used_mib": ("device memory used", "MiB"),
    "utilization_pct": ("device utilisation", "%"),
    "temperature_c": ("temperature", "°C"),
    "memory_temperature_c": ("memory temperature", "°C"),
    "power_w": ("power", "W"),
    "graphics_clock_mhz": ("graphics clock", "MHz"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "memory_clock_mhz": ("memory clock", "MHz"),
    "ecc_volatile_correctable": ("ECC corrected (since driver load)", ""),
    "ecc_volatile_uncorrectable": ("ECC uncorrectable (since driver load)", ""),
}
_UNIT_SUFFIXES = {"_mib": "MiB", "_pct": "%", "_mhz": "MHz", "_c": "°C", "_w": "W"}
_OK = Label(key="pass", label="within bound", glyph="✓")
_OVER = Label(key="fail", label="over bound", glyph="✗")
_NOT_JUDGED = Label(key="skip", label="not judged", glyph="–")
_INCONCLUSIVE = Label(key="error", label="inconclusive: run longer", glyph="?")
_SHOWN = Label(key="na", label="shown, not bounded", glyph="○")


@dataclass
class Spark:
    """One telemetry field drawn as a sparkline."""

    source: str  # host | device
    key: str
    label: str
    svg: Markup


@dataclass
class FitRow:
    """One memory series: its least-squares trend and the verdict against the bound."""

    label: str
    series: str
    verdict: Label
    slope: str  # MiB/min ± standard error
    r2: str
    noise: str
    growth_window: str
    growth_hour: str
    samples: str  # fitted (outliers set aside)
    reason: str


@dataclass
class SoakView:
    """One soak check as the report shows it."""

    id: str
    anchor: str  # the check's entry in the Checks section
    block: str  # this block's own fragment id
    status: Label
    message: str
    duration: str
    offered: list[Fact]
    requests: list[Fact]
    errors: list[str]  # request errors, 'message ×count'
    process: list[Fact]
    fits: list[FitRow]
    bound: str
    counters: list[Fact]
    sparks: list[Spark]
    notes: list[str]  # telemetry notes and errors (what could not be sampled, and why)
    records: FileLink | None
    no_data_note: str
    device_sample: str = ""


def _field(key: str) -> tuple[str, str]:
    if key in FIELDS:
        return FIELDS[key]
    unit = next((u for suffix, u in _UNIT_SUFFIXES.items() if key.endswith(suffix)), "")
    return key.replace("_", " "), unit


def _offered(soak: SoakEcho) -> list[Fact]:
    # A soak without a pattern it names (older or edited results) ran the params' default, a closed loop.
    arrival = Arrival.parse(soak.arrival) or Arrival.CONCURRENCY
    load = arrival.load_text(format_value(soak.level))
    mix = [f"{format_value(m.input_tokens)}→{format_value(m.output_tokens)} ×{format_value(m.weight)}"
           for m in soak.mixed]
    shortest, longest = soak.duration_s, soak.max_duration_s
    if longest is not None and shortest is not None and longest > shortest:
        # A soak that decides: from its shortest length, on until the memory trends are decided.
        looks = format_value(soak.looks) if soak.looks is not None else "several"
        duration = f"{num(shortest)} s, up to {num(longest)} s while a memory trend is undecided ({looks} looks)"
    else:
        duration = f"{num(soak.duration_s)} s"
    facts = [Fact("duration", duration), Fact("load", load)]
    if mix:
        facts.append(Fact("lengths (in→out tokens, weight)", ", ".join(mix)))
    facts += [Fact("sampled every", f"{num(soak.sample_interval_s)} s"),
              Fact("warm-up (not in the trend)", f"{num(soak.warmup_s)} s"),
              Fact("growth bound", f"{num(soak.max_growth_mib_per_min)} MiB/min"),
              Fact("error bound", pct(soak.max_error_rate))]
    return facts


def _ran(decision: SoakDecision | None) -> list[Fact]:
    """How long the soak ran and why it stopped (results written before the looks have no decision)."""
    if decision is None or not _given(decision):
        return []
    facts = []
    if decision.ran_s is not None:
        facts.append(Fact("ran", f"{num(decision.ran_s)} s"))
    if decision.why:
        facts.append(Fact("stopped", decision.why))
    if decision.looks:
        shown = "; ".join(f"{num(x.at_s)} s: " + ", ".join(f"{k} {v}" for k, v in x.states.items())
                          for x in decision.looks)
        facts.append(Fact(f"looks (each at {pct(decision.look_confidence)} confidence)", shown))
    return facts


def _requests(req: SoakRequests | None) -> tuple[list[Fact], list[str]]:
    if req is None or not _given(req):
        return [], []
    failed = (as_float(req.failed) or 0) + (as_float(req.warmup_failed) or 0)
    facts = [Fact("completed", num(req.completed)), Fact("failed", format_float(failed)),
             Fact("warm-up requests", num(req.warmup_requests)),
             Fact("req/s", num(req.request_throughput)), Fact("output tok/s", num(req.output_throughput))]
    ttft = req.ttft_ms
    if ttft is not None and ttft.p50 is not None:
        facts.append(Fact("TTFT ms median / p99", f"{num(ttft.p50)} / {num(ttft.p99)}"))
    if req.aborted:
        facts.append(Fact("stopped early", req.aborted))
    errors = [f"{msg} ×{format_value(n)}" for msg, n in req.errors.items()]
    return facts, errors


def _fit_row(m: MemoryTrend) -> FitRow:
    fit = m.fit if m.fit is not None and _given(m.fit) else None
    ok = m.ok
    verdict = (_SHOWN if m.bounded is False else _OK if ok is True else _OVER if ok is False
               else _INCONCLUSIVE if m.state == "inconclusive" else _NOT_JUDGED)
    slope = fit.slope_mib_per_min if fit else None
    err = fit.slope_stderr_mib_per_min if fit else None
    bounds = m.slope_bounds_mib_per_min or []
    if len(bounds) == 2:
        # The interval the verdict was taken on (one-sided bounds, autocorrelation included).
        spread = f" [{_signed(bounds[0])}, {_signed(bounds[1])}]"
    else:  # results written before the interval existed
        spread = f" ± {format_float(err)}" if err is not None else ""
    slope_text = "—" if slope is None else _signed(slope) + spread + " MiB/min"
    n, out = (fit.n, as_float(fit.outliers)) if fit else (None, None)
    samples = "—" if n is None else format_value(n) + (f" ({format_float(out)} outliers set aside)" if out else "")

    def mib(v: float | None) -> str:
        return "—" if v is None else f"{_signed(v)} MiB"

    return FitRow(label=m.label or m.series or "—", series=m.series or "",
                  verdict=verdict, slope=slope_text, r2=num(fit.r2 if fit else None),
                  noise="—" if fit is None or fit.residual_std_mib is None else f"{num(fit.residual_std_mib)} MiB",
                  growth_window=mib(fit.growth_over_window_mib if fit else None),
                  growth_hour=mib(fit.growth_per_hour_mib if fit else None),
                  # With a fit the columns say it all; without one the reason is the only answer.
                  samples=samples, reason="" if fit else (m.reason or ""))


def _signed(value: float) -> str:
    return ("+" if value > 0 else "") + format_float(value)


def _trend(m: MemoryTrend) -> svg.TrendLine | None:
    fit = m.fit
    if fit is None:
        return None
    t0, t1, b, a = fit.t_start_s, fit.t_end_s, fit.intercept_mib, fit.slope_mib_per_min
    if t0 is None or t1 is None or b is None or a is None or not all(math.isfinite(v) for v in (t0, t1, b, a)):
        return None
    return svg.TrendLine(t0=t0, v0=b + a * t0 / 60.0, t1=t1, v1=b + a * t1 / 60.0)


def _sparks(telemetry: SoakTelemetry, memory: list[MemoryTrend], warmup: float | None) -> list[Spark]:
    fits = {(str(m.source), str(m.series)): m for m in memory}
    out = []
    for source, series in (("host", telemetry.host or {}), ("device", telemetry.device or {})):
        times = [as_float(t) for t in series.get("t_s", [])]
        for key, values in series.items():
            if key == "t_s" or not any(v is not None for v in values):
                continue
            label, unit = _field(key)
            m = fits.get((source, key))
            if m is not None and m.label:
                label = m.label  # the CPU backend's "device" memory is the host's
            points = list(zip(times, [as_float(v) for v in values], strict=False))
            chart = svg.sparkline(label, points, unit=unit, trend=_trend(m) if m else None,
                                  shade_until=warmup if m else None)
            out.append(Spark(source=source, key=key, label=label, svg=chart))
    return out


def build_soak(c: CheckResult, status: Label, anchor: str, block: str, duration: str,
               records_base: str = "") -> SoakView:
    """The view of one ``perf.soak`` result (details that do not fit read as none)."""
    d = c.evidence(SoakEvidence) or SoakEvidence()
    soak = d.soak if d.soak is not None and _given(d.soak) else None
    telemetry = d.telemetry or SoakTelemetry()
    requests, errors = _requests(d.requests)
    proc = d.server_process
    process = []
    if proc is not None and _given(proc):
        process.append(Fact("server process", f"pid {format_value(proc.pid)} ({proc.found_by or '—'})" if proc.pid
                            else "not found on this machine: server memory not sampled"))
    counters = [Fact(x.counter, f"{num(x.first)} → {num(x.last)}" + (" (rose during the soak)" if x.rose else ""))
                for x in d.counters]
    notes = list(telemetry.notes)
    notes += [f"{e.source}: {e.error} ×{format_value(e.count)} (first at {num(e.first_t_s)} s)"
              for e in telemetry.errors]
    call = telemetry.device_sample_s
    sparks = _sparks(telemetry, d.memory, soak.warmup_s if soak else None)
    return SoakView(
        id=c.id, anchor=anchor, block=block, status=status, message=c.message, duration=duration,
        offered=(_offered(soak) if soak else []) + _ran(d.decision), requests=requests,
        errors=errors, process=process,
        fits=[_fit_row(m) for m in d.memory],
        bound=f"{num(soak.max_growth_mib_per_min)} MiB/min" if soak else "",
        counters=counters, sparks=sparks, notes=notes,
        records=records_link(d.records_file, records_base),
        no_data_note="" if sparks or status.key in ("skip", "na", "notrun") else "no telemetry recorded",
        device_sample=(f"one device reading took {num(call.median)} s (median), {num(call.max)} s at most"
                       if call is not None and _given(call) else ""),
    )
