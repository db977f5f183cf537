"""View data of the step-5 serving scenarios (``perf.serving``) — plain data, no HTML: what was
offered, per level the median run's figures with the run-to-run CV against the bound, the
drift, the runs, the client's cost, server memory and the charts, read from the check's
:class:`~adaptcheck.base.schemas.serving_evidence.ServingEvidence` (details that do not fit
read as none; every text is untrusted). Shapes: docs/perf.md, "Serving outcome".
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from markupsafe import Markup

from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.results import CheckResult
from adaptcheck.base.schemas.serving_evidence import (
    ClientCost,
    DriftFigures,
    LatencyStats,
    LevelStability,
    MeasuredRun,
    RunSummary,
    ScenarioEcho,
    ServerMemory,
    ServingEvidence,
    ServingLevel,
)
from adaptcheck.perf.arrival import Arrival
from adaptcheck.report import svg

# FileLink and records_link live in fmt (step 4's reproducers link the same way); re-exported here.
from adaptcheck.report.fmt import (
    FileLink,
    Label,
    as_float,
    format_float,
    format_value,
    records_link,
)
from adaptcheck.report.framework import FACT_LABELS, Fact

# The latency metrics of a RunSummary / distributions, in the order the tables show them.
LATENCY_METRICS: dict[str, str] = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2el_ms": "E2EL"}
# Spread keys of the contract with their column names; other keys follow under their own.
SPREAD_NAMES: dict[str, str] = {"ttft_ms_median": "TTFT median", "tpot_ms_median": "TPOT median",
                                "output_tok_per_s": "output tok/s"}
MAX_ERRORS_SHOWN = 10
_SERVER_MONO = {"url", "served_model", "server_command", "server_log"}


@dataclass
class Chart:
    """One inline chart: the SVG is built (and its text escaped) by :mod:`adaptcheck.report.svg`."""

    title: str
    svg: Markup


@dataclass
class SpreadCell:
    metric: str
    value: str
    over: bool  # significantly above the scenario's max_cv (older results: over max_spread)


@dataclass
class ServingLevelRow:
    """The median run of one level, and how much the runs differed."""

    level: str
    runs: int
    completed: str
    failed: str
    error_rate: str
    errors_present: bool
    req_per_s: str
    out_tok_per_s: str
    goodput: str
    slo_attainment: str  # '93.0% met SLO', '' without SLOs
    queue: str  # client queue time, median / p99 ms
    latency: list[str]  # per LATENCY_METRICS: 'median / p90 / p99'
    spread: list[SpreadCell]
    stability: str  # 'stable after 3 runs', 'not significant after 5 runs (+1 disturbed)', '' for older results
    drift: str  # 'TTFT −3% [−8%, +2%], TPOT +1% [−2%, +4%]', '' when not measured
    drift_over: bool  # a drift significantly above max_drift
    tokens: str  # token source, mismatches, chunks per token
    errors: list[str]  # 'message ×count', pooled over the runs


@dataclass
class RunRow:
    """One measured run of one level (behind the spread)."""

    level: str
    run: int
    completed: str
    failed: str
    duration: str
    req_per_s: str
    out_tok_per_s: str
    ttft: str
    tpot: str
    disturbed: str = ""  # why the host disturbed this run (left out of the statistics, repeated)


@dataclass
class ScenarioView:
    """One serving scenario (one ``perf.serving`` check)."""

    id: str
    anchor: str  # the check's entry in the Checks section
    block: str  # this block's own fragment id
    name: str
    status: Label
    message: str
    duration: str
    offered: list[Fact]
    server: list[Fact]
    level_word: str
    spread_bound: str
    spread_metrics: list[str]
    levels: list[ServingLevelRow]
    runs: list[RunRow]
    records: FileLink | None
    client: list[Fact]
    client_warning: str
    memory: list[Fact]
    latency_charts: list[Chart]
    throughput_charts: list[Chart]
    no_data_note: str  # why there are no level numbers ('' when there are)
    arrival: str = ""
    latency_names: list[str] = field(default_factory=lambda: list(LATENCY_METRICS.values()))
    # (level, req/s, output tok/s) of the medians, for the combined chart across scenarios.
    curve: list[tuple[float | None, float | None, float | None]] = field(default_factory=list)


# ---------------------------------------------------------------- small readers


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a list, else empty (a hand-edited or truncated file may hold anything)."""
    return value if isinstance(value, list) else []


def pct(value: Any) -> str:
    """A fraction as a percentage, or — when missing or not finite."""
    f = as_float(value)
    return "—" if f is None or not math.isfinite(f) else f"{f:.1%}"


def num(value: Any) -> str:
    """A number to a few significant digits, or — when missing."""
    f = as_float(value)
    return "—" if f is None else format_float(f)


def _latency(summary: RunSummary, metric: str) -> LatencyStats | None:
    """The summary's stats of one latency (a key of :data:`LATENCY_METRICS`, or ``queue_ms``)."""
    by_key = {"ttft_ms": summary.ttft_ms, "tpot_ms": summary.tpot_ms, "itl_ms": summary.itl_ms,
              "e2el_ms": summary.e2el_ms, "queue_ms": summary.queue_ms}
    return by_key[metric]


def _stat(stats: LatencyStats | None, key: Literal["median", "p90", "p99"]) -> float | None:
    if stats is None:
        return None
    return stats.middle() if key == "median" else stats.p90 if key == "p90" else stats.p99


def _triple(summary: RunSummary, metric: str) -> str:
    stats = _latency(summary, metric)
    vals = [num(_stat(stats, "median")), num(_stat(stats, "p90")), num(_stat(stats, "p99"))]
    return "—" if all(v == "—" for v in vals) else " / ".join(vals)


def given(model: Evidence) -> bool:
    """Whether the stored object held anything (an empty ``{}`` reads as absent, as before)."""
    return bool(model.model_fields_set or model.model_extra)


# How a level reads (table, legend, header, axis) is asked of the arrival pattern
# (adaptcheck.perf.arrival); a pattern this version does not know reads as a bare number.

def level_text(level: Any, arrival: str) -> str:
    """A level as the table shows it ('4', '2.5 req/s')."""
    text = format_value(level)
    pattern = Arrival.parse(arrival)
    return pattern.level_text(text) if pattern is not None else text


def level_legend(level: Any, arrival: str) -> str:
    """A level as a chart legend names it ('c=4', '2.5 req/s', 'burst 32')."""
    text = format_value(level)
    pattern = Arrival.parse(arrival)
    return pattern.legend(text) if pattern is not None else text


def level_words(arrival: str) -> tuple[str, str]:
    """(the level column's header, a chart's level axis) of a scenario with this arrival."""
    pattern = Arrival.parse(arrival)
    return (pattern.level_word, pattern.level_axis) if pattern is not None else ("level", "level")


# ---------------------------------------------------------------- parts of a scenario


def _offered(sc: ScenarioEcho) -> list[Fact]:
    facts = [Fact("arrival", sc.arrival or "—")]
    arrival = sc.arrival or ""
    if sc.levels is not None:
        facts.append(Fact("levels", ", ".join(level_text(v, arrival) for v in sc.levels) or "none"))
    if sc.mixed is not None:
        mix = [f"{format_value(m.input_tokens)}→{format_value(m.output_tokens)} ×{format_value(m.weight)}"
               for m in sc.mixed]
        facts.append(Fact("lengths (in→out tokens, weight)", "mixed: " + ", ".join(mix)))
    else:
        facts.append(Fact("lengths", f"{format_value(sc.input_tokens)} input → "
                                     f"{format_value(sc.output_tokens)} output tokens"))
    if sc.duration_s is not None:
        facts.append(Fact("measured", f"{num(sc.duration_s)} s per run"))
    else:
        facts.append(Fact("measured", f"{format_value(sc.num_requests)} requests per run"))
    facts.append(Fact("warm-up", f"{format_value(sc.warmup_requests)} requests (not measured)"))
    if sc.has_stability:
        runs = f"{format_value(sc.min_runs)} to {format_value(sc.max_runs)} per level"
        if sc.budget_s is not None:
            runs += f" (more than {format_value(sc.min_runs)} within {num(sc.budget_s)} s)"
        facts.append(Fact("runs", runs))
        conf = sc.confidence
        facts.append(Fact("run-to-run CV bound", pct(sc.max_cv)
                          + (f" (fails when significantly above, {pct(conf)} confidence)" if conf else "")))
        facts.append(Fact("drift bound", pct(sc.max_drift)))
    else:  # results from before the stability verdict
        facts.append(Fact("repeats", format_value(sc.repeats)))
        facts.append(Fact("spread bound", pct(sc.max_spread)))
    if sc.slo is not None and given(sc.slo):
        slo = sc.slo
        bounds = [(k, v) for k, v in (("ttft_ms", slo.ttft_ms), ("tpot_ms", slo.tpot_ms), ("e2el_ms", slo.e2el_ms))
                 if k in slo.model_fields_set] + list(slo.extras.items())
        facts.append(Fact("SLO", ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {num(v)} ms" if k.endswith("_ms")
                                           else f"{k} ≤ {format_value(v)}" for k, v in bounds)))
    return facts


def _server(server: dict[str, Any]) -> list[Fact]:
    # Nested values (capabilities, plugin lists) are step 4's to show; here only the identity.
    return [Fact(FACT_LABELS.get(k, k), format_value(v), mono=k in _SERVER_MONO)
            for k, v in server.items() if not isinstance(v, (dict, list)) and v is not None]


def _client(client: ClientCost) -> tuple[list[Fact], str]:
    facts = []
    if client.cpu_percent is not None:
        facts.append(Fact("client CPU", f"{num(client.cpu_percent)}% (100% = one core)"))
    if client.overhead_us_per_token is not None:
        facts.append(Fact("client overhead", f"{num(client.overhead_us_per_token)} µs per output token"))
    if client.loop_lag_ms_p99 is not None:
        facts.append(Fact("event-loop lag p99", f"{num(client.loop_lag_ms_p99)} ms"))
    if "bottleneck" in client.model_fields_set:
        facts.append(Fact("client was the bottleneck", "yes" if client.bottleneck is True else "no"))
    warning = client.warning or ""
    if client.bottleneck is True:
        # Numbers from a saturated load generator describe the client, not the server.
        warning = "the load generator, not the server, limited this run: throughput is understated" + (
            f" — {warning}" if warning else "")
    return facts, warning


def _memory(mem: ServerMemory) -> list[Fact]:
    facts = []
    stored = [(k, v) for k, v in (("rss_mib_before", mem.rss_mib_before), ("rss_mib_after", mem.rss_mib_after),
                                 ("kv_cache_usage", mem.kv_cache_usage)) if k in mem.model_fields_set]
    for k, v in stored + list(mem.extras.items()):
        f = as_float(v)
        parts = k.split("_")
        label = " ".join(p.upper() if p in ("rss", "kv") else p for p in parts if p != "mib")
        if "mib" in parts and f is not None:  # rss_mib_before: the unit sits inside the key
            facts.append(Fact(label, f"{format_float(f)} MiB"))
        elif k == "kv_cache_usage" and f is not None and 0 <= f <= 1:
            facts.append(Fact("KV-cache usage", pct(f)))
        else:
            facts.append(Fact(label, format_value(v)))
    before, after = mem.rss_mib_before, mem.rss_mib_after
    if before is not None and after is not None:
        facts.append(Fact("RSS growth", f"{format_float(after - before)} MiB"))
    return facts


def _errors(runs: list[MeasuredRun]) -> list[str]:
    pooled: Counter[str] = Counter()
    for r in runs:
        pooled.update({msg: int(n) if math.isfinite(n) else 0 for msg, n in r.errors.items()})
    ranked = sorted(pooled.items(), key=lambda kv: -kv[1])
    return [f"{msg} ×{n}" for msg, n in ranked[:MAX_ERRORS_SHOWN]]


def _spread_cell(k: str, lv: ServingLevel, bound: float | None) -> SpreadCell:
    """One metric's run-to-run cell: the CV with its interval, or (older results) the min-max spread."""
    label = SPREAD_NAMES.get(k, k)
    if lv.stability is not None and given(lv.stability):
        m = lv.stability.metrics.get(k)
        if m is None:
            return SpreadCell(metric=label, value="—", over=False)
        value = f"{pct(m.cv)} [{pct(m.lo)}, {_upper(m.hi)}]" if m.cv is not None else "—"
        if m.explained_by_host and m.host_adjusted is not None:
            # Significant as measured, not once the host's own speed is out (docs/perf.md, "Host speed").
            value += f"; host-adjusted {pct(m.host_adjusted.cv)}"
        return SpreadCell(metric=label, value=value, over=m.verdict == "unstable")
    f = lv.spread.get(k)
    over = f is not None and bound is not None and (not math.isfinite(f) or f > bound)
    return SpreadCell(metric=label, value=pct(f) if f is not None else "—", over=over)


def _level_row(lv: ServingLevel, arrival: str, bound: float | None, spread_keys: list[str]) -> ServingLevelRow:
    med = lv.median
    drift, drift_over = _drift(lv.drift)
    err = med.error_rate
    goodput = num(med.goodput) if med.goodput is not None else "— (no SLO)"
    attained = f"{pct(med.slo_attainment)} met SLO" if med.slo_attainment is not None else ""
    tokens = med.token_source or "—"
    if med.token_mismatches:
        tokens += f", {num(med.token_mismatches)} count mismatches"
    if med.chunks_per_token is not None:
        tokens += f"; {num(med.chunks_per_token)} chunks/token"
    queue = med.queue_ms
    return ServingLevelRow(
        level=level_text(lv.level, arrival), runs=len(lv.runs), completed=num(med.completed),
        failed=num(med.failed), error_rate=pct(err), errors_present=bool(err),
        req_per_s=num(med.request_throughput), out_tok_per_s=num(med.output_throughput),
        goodput=goodput, slo_attainment=attained,
        queue=(f"{num(_stat(queue, 'median'))} / {num(_stat(queue, 'p99'))}"
               if queue is not None and given(queue) else "—"),
        latency=[_triple(med, m) for m in LATENCY_METRICS],
        spread=[_spread_cell(k, lv, bound) for k in spread_keys], stability=_stability(lv.stability),
        drift=drift, drift_over=drift_over, tokens=tokens, errors=_errors(lv.runs),
    )


STABILITY_WORDS = {"stable": "within the bound", "unstable": "significantly above the bound",
                   "undecided": "not significant"}


def _upper(hi: float | None) -> str:
    return "∞" if hi is not None and (not math.isfinite(hi) or hi >= 100) else pct(hi)


def _stability(stab: LevelStability | None) -> str:
    """'within the bound after 3 runs (+1 disturbed, repeated)'; '' for results without a stability verdict."""
    if stab is None or not given(stab):
        return ""
    verdict = str(stab.verdict)
    text = f"{STABILITY_WORDS.get(verdict, verdict)} after {format_value(stab.runs)} runs"
    return text + (f" (+{format_value(stab.disturbed_runs)} disturbed, repeated)" if stab.disturbed_runs else "")


def _drift(drift: dict[str, DriftFigures | None]) -> tuple[str, bool]:
    """'TTFT −3% [−8%, +2%]; TPOT +1% [−2%, +4%]' and whether one is significantly above its bound."""
    parts, over = [], False
    for key, word in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        d = drift.get(key)
        if d is None or d.drift is None or d.lo is None or d.hi is None:
            continue
        parts.append(f"{word} {d.drift:+.0%} [{d.lo:+.0%}, {d.hi:+.0%}]")
        over = over or d.significant is True
    return "; ".join(parts), over


def _run_rows(levels: list[ServingLevel], arrival: str) -> list[RunRow]:
    return [RunRow(level=level_text(lv.level, arrival), run=i + 1, completed=num(r.completed), failed=num(r.failed),
                   duration=num(r.duration_s), req_per_s=num(r.request_throughput),
                   out_tok_per_s=num(r.output_throughput), ttft=num(_stat(r.ttft_ms, "median")),
                   tpot=num(_stat(r.tpot_ms, "median")), disturbed=r.disturbed or "")
            for lv in levels for i, r in enumerate(lv.runs)]


def _latency_charts(name: str, levels: list[ServingLevel], arrival: str) -> list[Chart]:
    dists = [(level_legend(lv.level, arrival), lv.distributions) for lv in levels]
    if not any(d for _, d in dists):
        return []
    charts = []
    for key, word in LATENCY_METRICS.items():
        title = f"{word} by percentile — {name}"
        series = [(label, values) for label, d in dists if (values := d.get(key)) is not None]
        charts.append(Chart(title=title, svg=svg.latency_chart(title, series) if series else svg.empty_chart(title)))
    return charts


def throughput_charts(name: str, curves: list[tuple[str, list[tuple[float | None, float | None, float | None]]]],
                      axis: str) -> list[Chart]:
    """Output tok/s and req/s against the level, one line per named curve."""
    out = []
    for idx, (what, unit) in ((2, ("output tok/s", " tok/s")), (1, ("req/s", " req/s"))):
        title = f"{what} vs level — {name}"
        series = [(label, [(p[0], p[idx]) for p in pts]) for label, pts in curves]
        out.append(Chart(title=title, svg=svg.throughput_chart(title, series, x_label=axis, y_label=what,
                                                               y_unit=unit)))
    return out


# ---------------------------------------------------------------- one scenario


def build_scenario(c: CheckResult, status: Label, anchor: str, block: str, duration: str,
                   records_base: str = "") -> ScenarioView:
    """The view of one ``perf.serving`` result (details that do not fit read as none: the
    check's message still says what happened)."""
    d = c.evidence(ServingEvidence) or ServingEvidence()
    sc = d.scenario or ScenarioEcho()
    arrival = sc.arrival or ""
    name = sc.name or c.id.rsplit(".", 1)[-1]
    levels = d.levels or []
    bound = sc.max_cv if sc.has_stability else sc.max_spread
    keys: list[str] = [k for k in SPREAD_NAMES if any(k in lv.spread for lv in levels)]
    keys += [k for lv in levels for k in lv.spread if k not in keys]
    keys = list(dict.fromkeys(keys))
    client, warning = _client(d.client or ClientCost())
    word, axis = level_words(arrival)
    curve = [(as_float(lv.level), lv.median.request_throughput, lv.median.output_throughput) for lv in levels]
    has_curve = any(p[0] is not None and (p[1] is not None or p[2] is not None) for p in curve)
    return ScenarioView(
        id=c.id, anchor=anchor, block=block, name=name, status=status, message=c.message, duration=duration,
        offered=_offered(sc) if given(sc) else [], server=_server(d.server or {}), level_word=word,
        spread_bound=pct(bound) if bound is not None else "", spread_metrics=[SPREAD_NAMES.get(k, k) for k in keys],
        levels=[_level_row(lv, arrival, bound, keys) for lv in levels], runs=_run_rows(levels, arrival),
        records=records_link(d.records_file, records_base), client=client, client_warning=warning,
        memory=_memory(d.server_memory or ServerMemory()),
        latency_charts=_latency_charts(name, levels, arrival),
        throughput_charts=throughput_charts(name, [(name, curve)], axis) if has_curve else [],
        # A skipped or unreached scenario's message says why; only a run that went wrong lacks numbers.
        no_data_note="" if levels or status.key in ("skip", "na", "notrun") else
        "no measured run finished: no numbers recorded",
        arrival=arrival, curve=curve,
    )
