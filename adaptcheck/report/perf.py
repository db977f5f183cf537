"""View data of step 5 (the performance baseline) — plain data, no HTML: one table per
micro-benchmark check read typed (:class:`~adaptcheck.base.schemas.micro_evidence.MicroEvidence`;
details that do not fit show as no rows, never half a table), each distinct peak once with its
source and derivation, and the serving (:mod:`adaptcheck.report.perf_serving`) and soak
(:mod:`adaptcheck.report.soak`) blocks; every decision (units, which peak a row is held to,
what is over a bound) is made here, the template only lays it out. Shapes: docs/perf.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptcheck.base.schemas.micro_evidence import MicroEvidence, PeakRecord, RowExtra, TimeStats
from adaptcheck.base.schemas.micro_evidence import MicroRow as MicroEvidenceRow
from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.perf.arrival import Arrival
from adaptcheck.report.fmt import (
    STATUS_LABELS,
    Label,
    as_float,
    format_duration,
    format_float,
    format_value,
    section_anchor,
    section_not_run_reason,
    status_key,
    status_label,
)
from adaptcheck.report.framework import Fact, Link
from adaptcheck.report.perf_serving import (
    Chart,
    ScenarioView,
    build_scenario,
    pct,
    throughput_charts,
)
from adaptcheck.report.soak import SoakView, build_soak

STEP = 5
SERVING_KIND = "perf.serving"
SOAK_KIND = "perf.soak"
REGRESSION_KIND = "perf.regression"
"""Rendered by the comparison section (:mod:`adaptcheck.report.comparison`), not as a micro-benchmark."""
BENCH_NAMES: dict[str, str] = {
    "gemm": "GEMM (matrix multiply)",
    "memory_bandwidth": "memory bandwidth",
    "host_device": "host ↔ device copies",
    "attention": "attention",
    "collectives": "collectives bandwidth",
}
# Row statuses of the contract; anything else must never read as a pass.
_ROW_STATUS: dict[str, Label] = {
    "ok": Label(key="pass", label="ok", glyph="✓"),
    "not_run": Label(key="notrun", label="not run", glyph="·"),
}
_VERIFIED = Label(key="pass", label="verified", glyph="✓")
_UNVERIFIED = Label(key="skip", label="unverified", glyph="–")
_UNSTATED = Label(key="notrun", label="not stated", glyph="·")
NOT_REACHED = "not reached: the run ended before this check recorded a result"


@dataclass
class PeakView:
    """The peak figures efficiencies were computed against, and where they come from."""

    device: str
    entry: str
    source: str
    verified: Label
    figures: list[Fact]
    derivation: list[str]  # CPU: how the peak was derived from what the machine reports
    used_by: list[Link]
    note: str


@dataclass
class MicroRow:
    """One problem of one micro-benchmark."""

    name: str
    problem: str
    dtype: str
    time: str  # median per repetition
    spread: str  # (p90 - p10) / median, with the repetition count
    achieved: str
    achieved_other: str  # the other rate (bytes/s of a GEMM), when recorded
    peak: str  # the peak of the bounding resource
    efficiency: str
    over_peak: bool  # efficiency > 100 %: the peak figure (or the timing) is wrong
    intensity: str
    ridge: str
    bound: str
    status: Label
    reason: str
    extra: str


@dataclass
class MicroView:
    """One micro-benchmark check."""

    id: str
    anchor: str
    kind: str
    title: str
    status: Label
    message: str
    duration: str
    timer: str
    peak_note: str  # why efficiencies are missing, or which peak block applies
    rows: list[MicroRow]
    no_rows_note: str


@dataclass
class PerfView:
    """Step 5 as the report shows it."""

    ran: bool
    not_run_reason: str
    not_run_status: Label | None = None
    peaks: list[PeakView] = field(default_factory=list)
    micro: list[MicroView] = field(default_factory=list)
    serving: list[ScenarioView] = field(default_factory=list)
    combined: list[Chart] = field(default_factory=list)  # throughput across the concurrency scenarios
    soak: list[SoakView] = field(default_factory=list)
    legend: list[Label] = field(default_factory=list)


# ---------------------------------------------------------------- units


def rate(value: Any, unit: str) -> str:
    """A rate with an SI prefix: '989 TFLOP/s', '4.8 TB/s', '41 GB/s'; '—' when unknown."""
    f = as_float(value)
    if f is None or not math.isfinite(f):
        return "—" if f is None else format_float(f)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(f) >= scale:
            return f"{format_float(f / scale)} {prefix}{unit}"
    return f"{format_float(f)} {unit}"


def precise_time(value: Any) -> str:
    """A benchmark time to 4 significant digits ('1.2 ms', '85.31 µs'): format_duration
    rounds to whole milliseconds, too coarse for a kernel."""
    f = as_float(value)
    if f is None or not math.isfinite(f) or f <= 0:
        return "—" if f is None else format_float(f)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if f >= scale:
            return f"{format_float(f / scale)} {unit}"
    return f"{format_float(f / 1e-9)} ns"


# ---------------------------------------------------------------- micro-benchmarks


def _peak_figures(peak: PeakRecord) -> list[Fact]:
    # Integer math is counted in operations, not floating-point operations.
    facts = [Fact(f"{dt} dense", rate(v, "OP/s" if dt.startswith("int") else "FLOP/s"))
             for dt, v in peak.flops.items()]
    facts.append(Fact("memory bandwidth", rate(peak.memory_bw, "B/s")))
    link = peak.host_link_bw
    facts.append(Fact("host link", f"{rate(link, 'B/s')} per direction" if link is not None else "not known"))
    fabric = peak.interconnect_bw
    if fabric is not None:
        facts.append(Fact("device interconnect", rate(fabric, "B/s")))
    if peak.memory_bw_basis:
        facts.append(Fact("memory bandwidth basis", peak.memory_bw_basis))
    return facts


def _peak_view(peak: PeakRecord) -> PeakView:
    v = peak.verified
    verified = _VERIFIED if v is True else _UNVERIFIED if v is False else _UNSTATED
    note = ("marked unverified in matrices/peaks.yaml: every efficiency below is relative to a figure "
            "nobody has confirmed" if v is False else "")
    return PeakView(device=peak.device or "—", entry=peak.entry or "—", source=peak.source or "—",
                    verified=verified, figures=_peak_figures(peak), derivation=list(peak.derivation), used_by=[],
                    note=note)


def _row_peak(row: MicroEvidenceRow, peak: PeakRecord | None) -> str:
    """The peak of the resource that bounds the row: what its efficiency is measured against."""
    if peak is None:
        return "—"
    bound = row.bound
    # A row may be held to another dtype's figure (fp32 GEMMs with TF32 on: the tf32 peak).
    flops_peak = peak.flops_for(row.extra.peak_dtype or row.dtype)
    if bound == "network":
        return rate(peak.interconnect_bw, "B/s")
    if bound == "compute" or (bound is None and row.flops is not None and flops_peak is not None):
        return rate(flops_peak, "FLOP/s")
    if bound == "link":
        return rate(peak.host_link_bw, "B/s")
    if bound in ("memory", None):
        return rate(peak.memory_bw, "B/s")
    return "—"


def _achieved(row: MicroEvidenceRow) -> tuple[str, str]:
    flops, byts = row.achieved.flops_per_s, row.achieved.bytes_per_s
    # The bounding resource's rate goes first; a GEMM's bytes/s is context, not its score.
    if row.bound in ("memory", "link", "network") or flops is None:
        return rate(byts, "B/s"), rate(flops, "FLOP/s") if flops is not None else ""
    return rate(flops, "FLOP/s"), rate(byts, "B/s") if byts is not None else ""


def _extra(extra: RowExtra) -> str:
    # Every benchmark-specific fact, in the order the row records them (the column is "the rest").
    parts = []
    for k, v in extra.dump().items():
        if k.endswith("bw") and as_float(v) is not None:
            parts.append(f"{k} {rate(v, 'B/s')}")
        else:
            parts.append(f"{k.replace('_', ' ')} {format_value(v)}")
    return ", ".join(parts)


def _micro_row(row: MicroEvidenceRow, peak: PeakRecord | None) -> MicroRow:
    t = row.time_s or TimeStats()
    word = row.status
    status = _ROW_STATUS.get(word, Label(key="notrun", label=word or "unknown", glyph="·"))
    name = row.name or "—"
    # The parameters, unless the name already spells every one of them out.
    problem = [f"{k}={format_value(v)}" for k, v in row.params.items()]
    spread = pct(t.spread)
    if spread != "—" and t.n is not None:
        spread += f" (n={format_value(t.n)})"
    ci_width = t.ci_rel_width
    if spread != "—" and ci_width is not None and math.isfinite(ci_width):
        # The median's order-statistic CI (docs/perf.md): what the reported figure is good to.
        spread += f"; median ±{pct(ci_width / 2)}"
    achieved, other = _achieved(row)
    eff = row.efficiency
    ai, ridge = row.arithmetic_intensity, row.ridge_point
    return MicroRow(
        name=name, problem="" if all(p in name for p in problem) else " ".join(problem),
        dtype=row.dtype if row.dtype is not None else "—", time=precise_time(t.median),
        spread=spread, achieved=achieved, achieved_other=other,
        peak=_row_peak(row, peak) if word == "ok" else "—", efficiency=pct(eff),
        over_peak=eff is not None and eff > 1.0,
        intensity=f"{format_float(ai)} FLOP/B" if ai is not None else "—",
        ridge=f"{format_float(ridge)} FLOP/B" if ridge is not None else "—",
        bound=row.bound or "—", status=status, reason=row.reason,
        extra=_extra(row.extra),
    )


def _anchor(anchors: Mapping[str, str], check_id: str) -> str:
    """The Checks section's anchor of a check ('' when it has none)."""
    return anchors.get(check_id, "")


def _micro(c: CheckResult, anchors: dict[str, str], peaks: dict[str, PeakView]) -> MicroView:
    # Details that do not fit (a foreign or hand-edited file) read as none: the check's status
    # and message still show, never a half-read table.
    ev = c.evidence(MicroEvidence)
    bench = (ev.benchmark if ev is not None else None) or c.kind.split(".", 1)[-1]
    peak = ev.peak if ev is not None else None
    peak_note = ""
    if peak is not None:
        # One block per distinct peak (normally one for the whole run); checks point at theirs.
        key = json.dumps(peak.dump(), sort_keys=True, default=str)
        peaks.setdefault(key, _peak_view(peak)).used_by.append(Link(id=c.id, anchor=_anchor(anchors, c.id)))
    elif ev is not None:
        peak_note = "no peak known for this device: efficiencies and bound classes are not computed"
    rows = [_micro_row(r, peak) for r in ev.rows] if ev is not None else []
    key = status_key(c)
    no_rows = ""
    if not rows:
        no_rows = {"error": "no measurements: the check errored", "skip": "not measured: skipped",
                   "na": "not measured: not applicable here"}.get(key, "no measurements recorded")
    return MicroView(
        id=c.id, anchor=_anchor(anchors, c.id), kind=c.kind, title=BENCH_NAMES.get(bench, bench),
        status=status_label(key), message=c.message, duration=format_duration(c.duration_s),
        timer=(ev.timer if ev is not None else None) or "", peak_note=peak_note, rows=rows, no_rows_note=no_rows,
    )


# ---------------------------------------------------------------- the section


def _combined(scenarios: list[ScenarioView]) -> list[Chart]:
    """Throughput against concurrency across the concurrency scenarios (one line each)."""
    closed = Arrival.CONCURRENCY
    curves = [(s.name, s.curve) for s in scenarios if Arrival.parse(s.arrival) is closed and s.throughput_charts]
    if len(curves) < 2:  # one scenario's own chart already says it all
        return []
    return throughput_charts(f"{closed} scenarios", curves, closed.level_axis)


def _unique(anchor: str, used: set[str]) -> str:
    """``anchor``, or ``anchor-2``, ``-3`` … when a block of the section already has it."""
    block, n = anchor, 2
    while block in used:
        block, n = f"{anchor}-{n}", n + 1
    used.add(block)
    return block


def build_perf(results: RunResults, anchors: dict[str, str], records_base: str = "") -> PerfView:
    """The step-5 section. ``anchors`` are the Checks section's; ``records_base`` is the run
    folder relative to the report's folder ('' for the report ``adaptcheck run`` writes)."""
    peaks: dict[str, PeakView] = {}
    micro: list[MicroView] = []
    serving: list[ScenarioView] = []
    soak: list[SoakView] = []
    used: set[str] = set()
    for c in results.checks:
        if c.step != STEP or c.kind == REGRESSION_KIND:
            continue
        if c.kind == SOAK_KIND:
            soak.append(build_soak(c, status_label(status_key(c)), _anchor(anchors, c.id),
                                   _unique(section_anchor("soak", c.id), used), format_duration(c.duration_s),
                                   records_base))
        elif c.kind == SERVING_KIND:
            block = _unique(section_anchor("perf", c.id), used)
            serving.append(build_scenario(c, status_label(status_key(c)), _anchor(anchors, c.id), block,
                                          format_duration(c.duration_s), records_base))
        else:
            micro.append(_micro(c, anchors, peaks))
    ran = STEP in results.steps and STEP not in results.grade.steps_not_run
    result_ids = {c.id for c in results.checks}
    for p in results.planned:
        # A planned check without any result (interrupted run) is listed as not run, never a gap.
        if p.step != STEP or p.kind == REGRESSION_KIND or not ran or any(r == p.id or r.startswith(p.id + ".") for r in result_ids):
            continue
        stub = CheckResult(step=STEP, id=p.id, kind=p.kind, status=Status.SKIP, message=NOT_REACHED)
        if p.kind == SOAK_KIND:
            soak.append(build_soak(stub, status_label("notrun"), _anchor(anchors, p.id),
                                   _unique(section_anchor("soak", p.id), used), "—"))
        elif p.kind == SERVING_KIND:
            serving.append(build_scenario(stub, status_label("notrun"), _anchor(anchors, p.id),
                                          section_anchor("perf", p.id), "—"))
        else:
            mv = _micro(stub, anchors, peaks)
            mv.status, mv.duration, mv.no_rows_note = status_label("notrun"), "—", ""
            micro.append(mv)
    if not micro and not serving and not soak:
        # A step that ran without any performance check is not 'not run': n/a, so pill and text agree.
        key = "na" if ran and results.complete else "notrun"
        return PerfView(ran=False, not_run_reason=section_not_run_reason(results, STEP, "performance",
                                                                         "performance checks"),
                        not_run_status=status_label(key))
    peak_list = list(peaks.values())
    if len(peak_list) > 1:
        for m in micro:
            for i, pk in enumerate(peak_list, 1):
                if any(u.id == m.id for u in pk.used_by):
                    m.peak_note = f"efficiencies against peak figures {i}"
    present = ({m.status.key for m in micro} | {s.status.key for s in serving}
               | {r.status.key for m in micro for r in m.rows} | {s.status.key for s in soak})
    return PerfView(ran=True, not_run_reason="", peaks=peak_list, micro=micro, serving=serving,
                    combined=_combined(serving), soak=soak,
                    legend=[status_label(k) for k in STATUS_LABELS if k in present])
