"""View data of the stability soak (``perf.soak``) — plain data, no HTML.

One ``perf.soak`` check (docs/perf.md, "Soak") becomes one block of the step-5 section: the
verdict, what was offered, how many requests were served and failed, the memory fits (slope
with its standard error, R², noise, projected growth over the window and per hour, against
the bound), any device error counter that rose, and a small inline SVG time series per
telemetry field — memory series with their fitted trend drawn over them and the warm-up
span (left out of the fit) shaded.

Results are read defensively (an errored soak has no telemetry, a hand-edited file may hold
anything) and every text is untrusted: charts are built by :mod:`adaptcheck.report.svg`,
which escapes what it writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from adaptcheck.base.schemas.results import CheckResult
from adaptcheck.perf.arrival import Arrival
from adaptcheck.report import svg
from adaptcheck.report.fmt import Label, as_dict, as_float, format_float, format_value
from adaptcheck.report.framework import Fact
from adaptcheck.report.perf_serving import FileLink, as_list, num, pct, records_link

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


def _offered(soak: dict[str, Any]) -> list[Fact]:
    # A soak without a pattern it names (older or edited results) ran the params' default, a closed loop.
    arrival = Arrival.parse(soak.get("arrival")) or Arrival.CONCURRENCY
    load = arrival.load_text(format_value(soak.get("level")))
    mix = [f"{format_value(m.get('input_tokens'))}→{format_value(m.get('output_tokens'))} ×{format_value(m.get('weight', 1))}"
           for m in as_list(soak.get("mixed")) if isinstance(m, dict)]
    shortest, longest = as_float(soak.get("duration_s")), as_float(soak.get("max_duration_s"))
    if longest is not None and shortest is not None and longest > shortest:
        # A soak that decides: from its shortest length, on until the memory trends are decided.
        looks = format_value(soak.get("looks")) if soak.get("looks") is not None else "several"
        duration = f"{num(shortest)} s, up to {num(longest)} s while a memory trend is undecided ({looks} looks)"
    else:
        duration = f"{num(soak.get('duration_s'))} s"
    facts = [Fact("duration", duration), Fact("load", load)]
    if mix:
        facts.append(Fact("lengths (in→out tokens, weight)", ", ".join(mix)))
    facts += [Fact("sampled every", f"{num(soak.get('sample_interval_s'))} s"),
              Fact("warm-up (not in the trend)", f"{num(soak.get('warmup_s'))} s"),
              Fact("growth bound", f"{num(soak.get('max_growth_mib_per_min'))} MiB/min"),
              Fact("error bound", pct(soak.get("max_error_rate")))]
    return facts


def _ran(decision: dict[str, Any]) -> list[Fact]:
    """How long the soak ran and why it stopped (results written before the looks have no decision)."""
    if not decision:
        return []
    facts = []
    if decision.get("ran_s") is not None:
        facts.append(Fact("ran", f"{num(decision.get('ran_s'))} s"))
    if decision.get("why"):
        facts.append(Fact("stopped", str(decision["why"])))
    looks = [x for x in as_list(decision.get("looks")) if isinstance(x, dict)]
    if looks:
        shown = "; ".join(f"{num(x.get('at_s'))} s: " + ", ".join(f"{k} {v}" for k, v in as_dict(x.get("states")).items())
                          for x in looks)
        facts.append(Fact(f"looks (each at {pct(decision.get('look_confidence'))} confidence)", shown))
    return facts


def _requests(req: dict[str, Any]) -> tuple[list[Fact], list[str]]:
    if not req:
        return [], []
    failed = (as_float(req.get("failed")) or 0) + (as_float(req.get("warmup_failed")) or 0)
    facts = [Fact("completed", num(req.get("completed"))), Fact("failed", format_float(failed)),
             Fact("warm-up requests", num(req.get("warmup_requests"))),
             Fact("req/s", num(req.get("request_throughput"))), Fact("output tok/s", num(req.get("output_throughput")))]
    ttft = as_dict(req.get("ttft_ms"))
    if ttft.get("p50") is not None:
        facts.append(Fact("TTFT ms median / p99", f"{num(ttft.get('p50'))} / {num(ttft.get('p99'))}"))
    if req.get("aborted"):
        facts.append(Fact("stopped early", str(req["aborted"])))
    errors = [f"{msg} ×{format_value(n)}" for msg, n in as_dict(req.get("errors")).items()]
    return facts, errors


def _fit_row(m: dict[str, Any]) -> FitRow:
    fit = as_dict(m.get("fit"))
    ok = m.get("ok")
    verdict = (_SHOWN if m.get("bounded") is False else _OK if ok is True else _OVER if ok is False
               else _INCONCLUSIVE if m.get("state") == "inconclusive" else _NOT_JUDGED)
    slope = as_float(fit.get("slope_mib_per_min"))
    err = as_float(fit.get("slope_stderr_mib_per_min"))
    bounds = [as_float(b) for b in as_list(m.get("slope_bounds_mib_per_min"))]
    if len(bounds) == 2 and None not in bounds:
        # The interval the verdict was taken on (one-sided bounds, autocorrelation included).
        spread = f" [{_signed(bounds[0] or 0.0)}, {_signed(bounds[1] or 0.0)}]"
    else:  # results written before the interval existed
        spread = f" ± {format_float(err)}" if err is not None else ""
    slope_text = "—" if slope is None else _signed(slope) + spread + " MiB/min"
    n, out = fit.get("n"), as_float(fit.get("outliers"))
    samples = "—" if n is None else format_value(n) + (f" ({format_float(out)} outliers set aside)" if out else "")

    def mib(key: str) -> str:
        v = as_float(fit.get(key))
        return "—" if v is None else f"{_signed(v)} MiB"

    return FitRow(label=str(m.get("label") or m.get("series") or "—"), series=str(m.get("series") or ""),
                  verdict=verdict, slope=slope_text, r2=num(fit.get("r2")),
                  noise="—" if fit.get("residual_std_mib") is None else f"{num(fit['residual_std_mib'])} MiB",
                  growth_window=mib("growth_over_window_mib"), growth_hour=mib("growth_per_hour_mib"),
                  # With a fit the columns say it all; without one the reason is the only answer.
                  samples=samples, reason="" if fit else str(m.get("reason") or ""))


def _signed(value: float) -> str:
    return ("+" if value > 0 else "") + format_float(value)


def _trend(m: dict[str, Any]) -> svg.TrendLine | None:
    fit = as_dict(m.get("fit"))
    vals = [as_float(fit.get(k)) for k in ("t_start_s", "t_end_s", "intercept_mib", "slope_mib_per_min")]
    t0, t1, b, a = vals
    if t0 is None or t1 is None or b is None or a is None or not all(math.isfinite(v) for v in (t0, t1, b, a)):
        return None
    return svg.TrendLine(t0=t0, v0=b + a * t0 / 60.0, t1=t1, v1=b + a * t1 / 60.0)


def _sparks(telemetry: dict[str, Any], memory: list[dict[str, Any]], warmup: float | None) -> list[Spark]:
    fits = {(str(m.get("source")), str(m.get("series"))): m for m in memory}
    out = []
    for source in ("host", "device"):
        series = as_dict(telemetry.get(source))
        times = [as_float(t) for t in as_list(series.get("t_s"))]
        for key, values in series.items():
            if key == "t_s" or not isinstance(values, list) or not any(as_float(v) is not None for v in values):
                continue
            label, unit = _field(key)
            m = fits.get((source, key))
            if m is not None and m.get("label"):
                label = str(m["label"])  # the CPU backend's "device" memory is the host's
            points = list(zip(times, [as_float(v) for v in values], strict=False))
            chart = svg.sparkline(label, points, unit=unit, trend=_trend(m) if m else None,
                                  shade_until=warmup if m else None)
            out.append(Spark(source=source, key=key, label=label, svg=chart))
    return out


def build_soak(c: CheckResult, status: Label, anchor: str, block: str, duration: str,
               records_base: str = "") -> SoakView:
    """The view of one ``perf.soak`` result."""
    d = as_dict(c.details)
    soak = as_dict(d.get("soak"))
    telemetry = as_dict(d.get("telemetry"))
    memory = [m for m in as_list(d.get("memory")) if isinstance(m, dict)]
    requests, errors = _requests(as_dict(d.get("requests")))
    proc = as_dict(d.get("server_process"))
    process = []
    if proc:
        pid = proc.get("pid")
        process.append(Fact("server process", f"pid {format_value(pid)} ({proc.get('found_by') or '—'})" if pid
                            else "not found on this machine: server memory not sampled"))
    counters = [Fact(str(x.get("counter")), f"{num(x.get('first'))} → {num(x.get('last'))}"
                     + (" (rose during the soak)" if x.get("rose") is True else ""))
                for x in as_list(d.get("counters")) if isinstance(x, dict)]
    notes = [str(n) for n in as_list(telemetry.get("notes"))]
    notes += [f"{e.get('source')}: {e.get('error')} ×{format_value(e.get('count'))} (first at "
              f"{num(e.get('first_t_s'))} s)" for e in as_list(telemetry.get("errors")) if isinstance(e, dict)]
    call = as_dict(telemetry.get("device_sample_s"))
    sparks = _sparks(telemetry, memory, as_float(soak.get("warmup_s")))
    return SoakView(
        id=c.id, anchor=anchor, block=block, status=status, message=c.message, duration=duration,
        offered=(_offered(soak) if soak else []) + _ran(as_dict(d.get("decision"))), requests=requests,
        errors=errors, process=process,
        fits=[_fit_row(m) for m in memory],
        bound=f"{num(soak.get('max_growth_mib_per_min'))} MiB/min" if soak else "",
        counters=counters, sparks=sparks, notes=notes,
        records=records_link(d.get("records_file"), records_base),
        no_data_note="" if sparks or status.key in ("skip", "na", "notrun") else "no telemetry recorded",
        device_sample=(f"one device reading took {num(call.get('median'))} s (median), {num(call.get('max'))} s at most"
                       if call else ""),
    )

