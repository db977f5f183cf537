"""View data of step 4's model numerics: the teacher-forced comparison of each framework
against the float64 reference and the healthy CPU control — plain data, no HTML.

``framework.*`` checks that compare against the reference record
``details.teacher_forced`` (the method: docs/step4-numerics.md): the
method that ran (teacher forcing, or the greedy comparison a server that cannot score falls
back to, with why), the device's and the control's divergence figures, each bound with its
verdict, a log10-KL histogram of both, the first module whose output departs (in-process
frameworks), which implementation each layer type ran, and the reproducer's path. The
same-framework checks (alone vs batched, cache hit vs recompute, compile on vs off) record
``details.distribution``. This module turns both into rows, one sentence and one chart.

Everything is read defensively: a crashed check has no details, a hand-edited or older
results file may lack any field, and module names and implementation strings come from the
model and framework under test (untrusted: the templates escape them, the chart escapes its
own text). A fallback is never shown as teacher-forced, and a bound without a verdict never
reads as held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from adaptcheck.report import svg
from adaptcheck.report.fmt import (
    FileLink,
    Label,
    as_dict,
    as_float,
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


def _num(value: Any) -> str:
    f = as_float(value)
    return "—" if f is None else format_float(f)


def _percent(value: Any) -> str:
    f = as_float(value)
    return "—" if f is None or not math.isfinite(f) else f"{f:.1%}"


def _verdict(ok: Any) -> Label:
    # Only a literal true held; anything else with a bound is a failure or unknown, never a pass.
    return status_label("pass" if ok is True else "fail" if ok is False else "notrun")


def _bound_text(b: dict[str, Any]) -> str:
    if as_float(b.get("bound")) is None:
        return "bound not recorded"
    text = f"≤ {_num(b.get('bound'))}"
    parts = []
    if as_float(b.get("multiple")) is not None:
        parts.append(f"{format_value(b.get('multiple'))}× control {_num(b.get('control'))}")
    if as_float(b.get("floor")) is not None:
        parts.append(f"floor {_num(b.get('floor'))}")
    return text + (f" ({' + '.join(parts)})" if parts else "")


# ---------------------------------------------------------------- parts


def _figures(tf: dict[str, Any]) -> list[FigureRow]:
    device, control, bounds = as_dict(tf.get("device")), as_dict(tf.get("control_stats")), as_dict(tf.get("bounds"))
    rows = []
    keys = [k for k, _, _ in FIGURES] + [k for k in bounds if k not in _FIGURE_LABELS]
    percent = {k for k, _, p in FIGURES if p}
    for key in keys:
        b = bounds.get(key)
        if key not in device and key not in control and b is None:
            continue
        show = _percent if key in percent else _num
        bd = as_dict(b)
        rows.append(FigureRow(name=_FIGURE_LABELS.get(key, str(key)), device=show(device.get(key)),
                              control=show(control.get(key)), bound=_bound_text(bd) if b is not None else "",
                              verdict=_verdict(bd.get("ok")) if b is not None else None))
    return rows


def _chart(tf: dict[str, Any]) -> Chart | None:
    h = as_dict(tf.get("histogram"))
    if not h.get("edges"):
        return None
    # Short: the chart sits in a table cell; the check is named by its row.
    title = "KL per position vs float64: device and CPU control"
    markers = []
    bound = as_float(as_dict(as_dict(tf.get("bounds")).get("kl_p99")).get("bound"))
    if bound is not None and bound > 0 and math.isfinite(bound):
        markers.append(svg.Marker(label=f"p99 bound {format_float(bound)}", x=math.log10(bound)))
    series = [("device", h.get("device") or []), ("CPU control", h.get("control") or [])]
    return Chart(title=title, svg=svg.histogram_chart(title, h["edges"], series, x_label="KL per position",
                                                      markers=markers))


def _localisation_line(loc: dict[str, Any]) -> str:
    module = loc.get("module")
    if isinstance(module, str) and module:
        where = " (its input)" if loc.get("where") == "input" else ""
        text = (f"first departing module: {module}{where}, normalized error {_num(loc.get('error'))}, "
                f"control {_num(loc.get('control'))}")
        if as_float(loc.get("bound")) is not None:
            text += f" (bound {_num(loc.get('bound'))})"
        return text
    reason = str(loc.get("reason") or "no module departs beyond the control")
    return f"localisation: {reason}"


def _localisation_rows(loc: dict[str, Any]) -> tuple[list[LocalisationRow], int]:
    table = [r for r in loc.get("table") or [] if isinstance(r, dict)]
    rows = []
    for r in table[:MAX_LOCALISATION_ROWS]:
        d = r.get("departs")
        rows.append(LocalisationRow(
            module=str(r.get("module", "")), where=str(r.get("where") or "output"), error=_num(r.get("error")),
            control=_num(r.get("control")), bound=_num(r.get("bound")),
            departs=status_label("fail" if d is True else "pass" if d is False else "notrun"),
        ))
    return rows, max(0, len(table) - MAX_LOCALISATION_ROWS)


def _implementations(value: Any) -> list[tuple[str, str]]:
    return [(str(k), v if isinstance(v, str) else format_value(v)) for k, v in as_dict(value).items()]


def localisation_anchor(check_id: str) -> str:
    """The details-page fragment of a check's per-module localisation table."""
    return section_anchor("tf", check_id)


def _summary(tf: dict[str, Any]) -> str:
    parts = []
    if tf.get("sequences") is not None or tf.get("positions") is not None:
        parts.append(f"{format_value(tf.get('sequences'))} sequences, {format_value(tf.get('positions'))} positions")
    if tf.get("top_k") is not None:
        parts.append(f"top-{format_value(tf.get('top_k'))} + a rest bucket")
    if tf.get("reference"):
        parts.append(f"reference: {tf['reference']}")
    if tf.get("control"):
        parts.append(f"control: {tf['control']}")
    return "; ".join(parts)


def teacher_forced_view(check_id: str, details: dict[str, Any], records_base: str = "") -> NumericsView | None:
    """``details.teacher_forced`` as view data; None when the check recorded none."""
    tf = details.get("teacher_forced")
    if not isinstance(tf, dict):
        return None
    method = tf.get("method")
    fallback = method != METHOD_TEACHER_FORCED
    if method == METHOD_TEACHER_FORCED:
        words = "teacher-forced"
    elif method == METHOD_FALLBACK:
        words = "greedy comparison (fallback: teacher forcing did not run)"
    else:
        words = f"{format_value(method)} (not teacher-forced)"
    reason = str(tf.get("fallback_reason") or ("" if not fallback else "no reason recorded"))
    loc = tf.get("localisation")
    line, anchor, more = "", "", 0
    rows: list[LocalisationRow] = []
    if isinstance(loc, dict):
        line = _localisation_line(loc)
        rows, more = _localisation_rows(loc)
        anchor = localisation_anchor(check_id) if rows else ""
    return NumericsView(
        method=words, fallback=fallback, fallback_reason=reason, summary=_summary(tf), figures=_figures(tf),
        chart=_chart(tf), localisation=line, localisation_anchor=anchor, localisation_rows=rows,
        localisation_more=more, implementations=_implementations(tf.get("implementations")),
        repro=records_link(details.get("repro"), records_base),
    )


def distribution_view(compares: str | None, details: dict[str, Any]) -> DistributionView | None:
    """``details.distribution`` of a same-framework check in words, with its verdict; ``compares``
    is what its two runs are (``CheckResult.compares``).

    A bound is read from ``bounds.<stat>`` (as the teacher-forced figures carry them) or a
    flat ``bound_<stat>``; a bound the figure exceeded says so next to it.
    """
    d = details.get("distribution")
    if not isinstance(d, dict):
        return None
    bounds = as_dict(d.get("bounds"))
    parts = []
    for stat, label in (("kl_mean", "KL mean"), ("kl_p99", "p99"), ("kl_max", "max")):
        text = f"{label} {_num(d.get(stat))}"
        b = as_dict(bounds.get(stat))
        bound = as_float(b.get("bound")) if b else as_float(d.get(f"bound_{stat}"))
        if bound is not None:
            text += f" (bound {format_float(bound)}{', exceeded' if b.get('ok') is False else ''})"
        parts.append(text)
    pair = compares or "the two runs"
    text = f"teacher-forced, {pair}: " + ", ".join(parts) + f"; |Δ logprob| max {_num(d.get('dlogprob_max'))}"
    if d.get("positions") is not None:
        text += f" over {format_value(d.get('positions'))} positions"
    vs = as_dict(d.get("vs_reference"))
    if vs:
        # batched_vs_alone: each run's KL from float64, the batched one held to the one alone.
        vb = as_dict(as_dict(vs.get("bounds")).get("kl_mean"))
        text += (f"; batched vs float64 KL mean {_num(as_dict(vs.get('batched')).get('kl_mean'))} against alone "
                 f"{_num(as_dict(vs.get('alone')).get('kl_mean'))}")
        vbound = as_float(vb.get("bound")) if vb else None
        if vbound is not None:
            text += f" (bound {format_float(vbound)}{', exceeded' if vb.get('ok') is False else ''})"
    return DistributionView(text=text, verdict=_verdict(d.get("ok")) if "ok" in d else None)


def check_numerics(check_id: str, compares: str | None, details: dict[str, Any],
                   records_base: str = "") -> CheckNumerics | None:
    """Everything of the model-numerics contract one step-4 check recorded; None when nothing."""
    tf = teacher_forced_view(check_id, details, records_base)
    dist = distribution_view(compares, details)
    repro = None if tf is not None else records_link(details.get("repro"), records_base)
    if tf is None and dist is None and repro is None:
        return None
    return CheckNumerics(teacher_forced=tf, distribution=dist, repro=repro)
