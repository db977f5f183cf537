"""View data of step 4's model numerics: the teacher-forced comparison of each framework
against the float64 reference and the healthy CPU control — plain data, no HTML.

Reads ``details.teacher_forced`` (``framework.reference``) and ``details.distribution`` (the
same-framework checks) as their typed records
(:mod:`adaptcheck.base.schemas.framework_evidence`) and turns them into rows, one sentence and
one chart; what the figures mean: docs/step4-numerics.md. Module names and implementation
strings come from the model and framework under test (untrusted: the templates escape them,
the chart escapes its own text). A fallback is never shown as teacher-forced, and a bound
without a verdict never reads as held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from markupsafe import Markup
from pydantic import JsonValue

from adaptcheck.base.schemas.framework_evidence import (
    BoundVerdict,
    ComparingEvidence,
    Distribution,
    DivergenceStats,
    FrameworkCheckEvidence,
    Localisation,
    ReferenceEvidence,
    TeacherForced,
)
from adaptcheck.report import svg
from adaptcheck.report.fmt import (
    FileLink,
    Label,
    format_float,
    format_value,
    records_link,
    section_anchor,
    status_label,
)

METHOD_TEACHER_FORCED = "teacher_forced"
METHOD_FALLBACK = "greedy_fallback"
MAX_LOCALISATION_ROWS = 400
"""A large model has hundreds of modules; the details page lists this many (results.json all)."""

# The figures every teacher-forced comparison reports, in the order shown: (key, label, percent).
FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("kl_mean", "KL mean", False),
    ("kl_p99", "KL p99", False),
    ("kl_max", "KL max", False),
    ("dlogprob_max", "|Δ logprob| max", False),
    ("same_top_rate", "same top token", True),
)
_FIGURE_LABELS = {k: label for k, label, _ in FIGURES}

@dataclass
class Chart:
    """One inline chart: the SVG is built (and its text escaped) by :mod:`adaptcheck.report.svg`."""

    title: str
    svg: Markup


@dataclass
class FigureRow:
    """One divergence figure: the device beside the control, and its bound when it has one."""

    name: str
    device: str
    control: str
    bound: str  # '≤ 0.012 (4× control 0.003 + floor 0.0001)', or '' when the figure is not bounded
    verdict: Label | None  # pass / fail / not run; None when not bounded


@dataclass
class LocalisationRow:
    """One module's hidden-state error against the float64 reference, beside the control's."""

    module: str
    where: str
    error: str
    control: str
    bound: str
    departs: Label  # fail: departs beyond the bound; pass: within it; not run: unknown


@dataclass
class NumericsView:
    """``details.teacher_forced`` of one check, as the report shows it."""

    method: str  # in words: 'teacher-forced' or 'greedy comparison (fallback)'
    fallback: bool  # anything but teacher forcing: marked visibly, never read as teacher-forced
    fallback_reason: str
    summary: str  # sequences, positions, top-K, reference, control
    figures: list[FigureRow]
    chart: Chart | None
    localisation: str  # the one line: first departing module and its error, or why there is none
    localisation_anchor: str  # its table on the details page ('' when there is no table)
    localisation_rows: list[LocalisationRow]
    localisation_more: int  # rows beyond MAX_LOCALISATION_ROWS
    implementations: list[tuple[str, str]]
    repro: FileLink | None


@dataclass
class DistributionView:
    """``details.distribution`` of a same-framework check: the teacher-forced rule between two runs."""

    text: str
    verdict: Label | None


@dataclass
class CheckNumerics:
    """What one step-4 check adds to its row: any of the three parts."""

    teacher_forced: NumericsView | None = None
    distribution: DistributionView | None = None
    repro: FileLink | None = None  # details.repro of a check without teacher-forced details


# ---------------------------------------------------------------- small readers


def _num(value: float | None) -> str:
    return "—" if value is None else format_float(value)


def _percent(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.1%}"


def _verdict(ok: bool | None) -> Label:
    # Only a literal true held; anything else with a bound is a failure or unknown, never a pass.
    return status_label("pass" if ok is True else "fail" if ok is False else "notrun")


def _bound_text(b: BoundVerdict) -> str:
    if b.bound is None:
        return "bound not recorded"
    text = f"≤ {_num(b.bound)}"
    parts = []
    if b.multiple is not None:
        parts.append(f"{format_value(b.multiple)}× control {_num(b.control)}")
    if b.floor is not None:
        parts.append(f"floor {_num(b.floor)}")
    return text + (f" ({' + '.join(parts)})" if parts else "")


# ---------------------------------------------------------------- parts


def _figures(tf: TeacherForced) -> list[FigureRow]:
    device = tf.device.recorded() if tf.device is not None else {}
    control = tf.control_stats.recorded() if tf.control_stats is not None else {}
    bounds = tf.bounds or {}
    rows = []
    keys = [k for k, _, _ in FIGURES] + [k for k in bounds if k not in _FIGURE_LABELS]
    percent = {k for k, _, p in FIGURES if p}
    for key in keys:
        b = bounds.get(key)
        if key not in device and key not in control and b is None:
            continue
        show: Callable[[float | None], str] = _percent if key in percent else _num
        rows.append(FigureRow(name=_FIGURE_LABELS.get(key, str(key)), device=show(device.get(key)),
                              control=show(control.get(key)), bound=_bound_text(b) if b is not None else "",
                              verdict=_verdict(b.ok) if b is not None else None))
    return rows


def _chart(tf: TeacherForced) -> Chart | None:
    h = tf.histogram
    if h is None or not h.edges:
        return None
    # Short: the chart sits in a table cell; the check is named by its row.
    title = "KL per position vs float64: device and CPU control"
    markers = []
    p99 = (tf.bounds or {}).get("kl_p99")
    bound = p99.bound if p99 is not None else None
    if bound is not None and bound > 0 and math.isfinite(bound):
        markers.append(svg.Marker(label=f"p99 bound {format_float(bound)}", x=math.log10(bound)))
    series = [("device", list(h.device)), ("CPU control", list(h.control))]
    return Chart(title=title, svg=svg.histogram_chart(title, h.edges, series, x_label="KL per position",
                                                      markers=markers))


def _localisation_line(loc: Localisation) -> str:
    if loc.module:
        where = " (its input)" if loc.where == "input" else ""
        text = (f"first departing module: {loc.module}{where}, normalized error {_num(loc.error)}, "
                f"control {_num(loc.control)}")
        if loc.bound is not None:
            text += f" (bound {_num(loc.bound)})"
        return text
    reason = loc.reason or "no module departs beyond the control"
    return f"localisation: {reason}"


def _localisation_rows(loc: Localisation) -> tuple[list[LocalisationRow], int]:
    rows = []
    for r in loc.table[:MAX_LOCALISATION_ROWS]:
        rows.append(LocalisationRow(
            module=r.module or "", where=r.where or "output", error=_num(r.error),
            control=_num(r.control), bound=_num(r.bound),
            departs=status_label("fail" if r.departs is True else "pass" if r.departs is False else "notrun"),
        ))
    return rows, max(0, len(loc.table) - MAX_LOCALISATION_ROWS)


def _implementations(value: dict[str, JsonValue] | None) -> list[tuple[str, str]]:
    return [(k, v if isinstance(v, str) else format_value(v)) for k, v in (value or {}).items()]


def localisation_anchor(check_id: str) -> str:
    """The details-page fragment of a check's per-module localisation table."""
    return section_anchor("tf", check_id)


def _summary(tf: TeacherForced) -> str:
    parts = []
    if tf.sequences is not None or tf.positions is not None:
        parts.append(f"{format_value(tf.sequences)} sequences, {format_value(tf.positions)} positions")
    if tf.top_k is not None:
        parts.append(f"top-{format_value(tf.top_k)} + a rest bucket")
    if tf.reference:
        parts.append(f"reference: {tf.reference}")
    if tf.control:
        parts.append(f"control: {tf.control}")
    return "; ".join(parts)


def teacher_forced_view(check_id: str, evidence: ReferenceEvidence, records_base: str = "") -> NumericsView | None:
    """``details.teacher_forced`` as view data; None when the check recorded none."""
    tf = evidence.teacher_forced
    if tf is None:
        return None
    method = tf.method
    fallback = method != METHOD_TEACHER_FORCED
    if method == METHOD_TEACHER_FORCED:
        words = "teacher-forced"
    elif method == METHOD_FALLBACK:
        words = "greedy comparison (fallback: teacher forcing did not run)"
    else:
        words = f"{format_value(method)} (not teacher-forced)"
    reason = tf.fallback_reason or ("" if not fallback else "no reason recorded")
    loc = tf.localisation
    line, anchor, more = "", "", 0
    rows: list[LocalisationRow] = []
    if loc is not None:
        line = _localisation_line(loc)
        rows, more = _localisation_rows(loc)
        anchor = localisation_anchor(check_id) if rows else ""
    return NumericsView(
        method=words, fallback=fallback, fallback_reason=reason, summary=_summary(tf), figures=_figures(tf),
        chart=_chart(tf), localisation=line, localisation_anchor=anchor, localisation_rows=rows,
        localisation_more=more, implementations=_implementations(tf.implementations),
        repro=records_link(evidence.repro, records_base),
    )


# The three figures of a same-framework sentence: (statistic, label, its value, its flat-form bound).
_DISTRIBUTION_FIGURES: tuple[tuple[str, str, Callable[[Distribution], float | None],
                                   Callable[[Distribution], float | None]], ...] = (
    ("kl_mean", "KL mean", lambda d: d.kl_mean, lambda d: d.bound_kl_mean),
    ("kl_p99", "p99", lambda d: d.kl_p99, lambda d: d.bound_kl_p99),
    ("kl_max", "max", lambda d: d.kl_max, lambda d: d.bound_kl_max),
)


def _kl_mean(stats: DivergenceStats | None) -> float | None:
    return stats.kl_mean if stats is not None else None


def distribution_view(compares: str | None, d: Distribution | None) -> DistributionView | None:
    """``details.distribution`` of a same-framework check in words, with its verdict; ``compares``
    is what its two runs are (``CheckResult.compares``).

    A bound is read from ``bounds.<stat>`` (as the teacher-forced figures carry them) or a
    flat ``bound_<stat>``; a bound the figure exceeded says so next to it.
    """
    if d is None:
        return None
    bounds = d.bounds or {}
    parts = []
    for stat, label, value, flat in _DISTRIBUTION_FIGURES:
        text = f"{label} {_num(value(d))}"
        b = bounds.get(stat)
        bound = b.bound if b is not None else flat(d)
        if bound is not None:
            text += f" (bound {format_float(bound)}{', exceeded' if b is not None and b.ok is False else ''})"
        parts.append(text)
    pair = compares or "the two runs"
    text = f"teacher-forced, {pair}: " + ", ".join(parts) + f"; |Δ logprob| max {_num(d.dlogprob_max)}"
    if d.positions is not None:
        text += f" over {format_value(d.positions)} positions"
    vs = d.vs_reference
    if vs is not None:
        # batched_vs_alone: each run's KL from float64, the batched one held to the one alone.
        vb = (vs.bounds or {}).get("kl_mean")
        text += (f"; batched vs float64 KL mean {_num(_kl_mean(vs.batched))} against alone "
                 f"{_num(_kl_mean(vs.alone))}")
        vbound = vb.bound if vb is not None else None
        if vbound is not None:
            text += f" (bound {format_float(vbound)}{', exceeded' if vb is not None and vb.ok is False else ''})"
    return DistributionView(text=text, verdict=_verdict(d.ok) if "ok" in d.model_fields_set else None)


def check_numerics(check_id: str, compares: str | None, evidence: FrameworkCheckEvidence | None,
                   records_base: str = "") -> CheckNumerics | None:
    """Everything of the model-numerics contract one step-4 check recorded; None when nothing
    (or when its details do not fit its kind's evidence: ``evidence`` is None). ``compares`` is
    what a same-framework check's two runs are (``CheckResult.compares``)."""
    reference = evidence if isinstance(evidence, ReferenceEvidence) else None
    tf = teacher_forced_view(check_id, reference, records_base) if reference is not None else None
    dist = distribution_view(compares, evidence.distribution if isinstance(evidence, ComparingEvidence) else None)
    repro = None if tf is not None or evidence is None else records_link(evidence.repro, records_base)
    if tf is None and dist is None and repro is None:
        return None
    return CheckNumerics(teacher_forced=tf, distribution=dist, repro=repro)
