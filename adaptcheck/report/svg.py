"""Inline SVG charts for the report: pure functions from numbers to an SVG string.

The report is one self-contained file under a Content-Security-Policy that forbids every
network load and script, so charts are drawn here as plain SVG elements: no external
fonts, images, styles or JavaScript. Point values are shown as native tooltips
(``<title>``), which need no script.

Every text value that goes into a chart (titles, axis labels, series names: scenario names
and levels come from ladders and plugins, so they are untrusted) is escaped with
:func:`markupsafe.escape` before it is placed in the string, and numbers are written by this
module's own formatting. Only then is the whole string wrapped in :class:`Markup`, which is
what lets the autoescaped template insert it verbatim.

Charts never raise on odd data: non-finite values are dropped (a line breaks there), a
single point or a flat series gets a padded axis, and a chart without any finite point says
"no data" instead of drawing empty axes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

from adaptcheck.report.fmt import as_float, format_float

# Geometry of every chart (SVG user units). The plot area is fixed so charts line up in a
# grid; the legend below it grows the height as needed.
WIDTH = 480
PLOT_LEFT = 64
PLOT_RIGHT = WIDTH - 16
PLOT_TOP = 30
PLOT_BOTTOM = 220
LEGEND_TOP = PLOT_BOTTOM + 48
LEGEND_ROW = 16
LEGEND_COL = 138
EMPTY_HEIGHT = 90
FONT = "system-ui, -apple-system, Segoe UI, Roboto, sans-serif"
# A linear axis squeezes everything but the largest values into a corner once the data
# spans more than this ratio; a log axis is chosen instead (only for positive data).
LOG_RATIO = 30.0
# Levels (concurrency 1, 2, 4 … 64) are usually powers of two: log spacing reads better
# from a smaller ratio on.
LEVEL_LOG_RATIO = 8.0
LOG_PAD = 1.1  # a log domain reaches this factor beyond the data on both sides
# Tick labels closer than this (px) to the previous one are left out (the tick stays).
MIN_LABEL_GAP = 22.0
MAX_LEVEL_TICKS = 12
PERCENTILE_TICKS = (0.0, 25.0, 50.0, 75.0, 90.0, 100.0)
# Okabe-Ito colours (distinguishable with the common colour-vision deficiencies), and a
# dash pattern per series as well so lines differ without colour and in print.
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")
DASHES = ("", "6 3", "2 3", "9 3 2 3", "4 2 1 2", "12 4")


@dataclass(frozen=True)
class Series:
    """One line: a label and its (x, y) points, in drawing order (None or non-finite: a gap)."""

    label: str
    points: Sequence[tuple[float | None, float | None]]


@dataclass(frozen=True)
class Axis:
    """The domain of one axis, its ticks and whether it is logarithmic."""

    lo: float
    hi: float
    ticks: tuple[float, ...]
    log: bool


@dataclass(frozen=True)
class Scale:
    """Maps a data value on ``[lo, hi]`` to a pixel on ``[start, end]`` (linear or log10)."""

    lo: float
    hi: float
    start: float
    end: float
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            a, b, v = math.log10(self.lo), math.log10(self.hi), math.log10(value)
        else:
            a, b, v = self.lo, self.hi, value
        return self.start + (v - a) / (b - a) * (self.end - self.start)


# ---------------------------------------------------------------- axes


def tick_text(value: float) -> str:
    """A short tick label: '0', '2.5', '120', '12k', '1.5M'."""
    mag = abs(value)
    if mag >= 1e6:
        return f"{value / 1e6:.3g}M"
    if mag >= 1e4:
        return f"{value / 1e3:.3g}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}"


def _nice_step(span: float, count: int = 5) -> float:
    raw = span / count
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0):
        if raw <= m * mag:
            return m * mag
    return 10.0 * mag


def _log_ticks(lo: float, hi: float) -> tuple[float, ...]:
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    # Few decades: 1-2-5 ticks so the axis still has labels in the middle.
    mults = (1.0, 2.0, 5.0) if math.log10(hi / lo) <= 2.5 else (1.0,)
    ticks = [m * 10.0**e for e in range(first, last + 1) for m in mults]
    return tuple(t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9))


def choose_axis(values: Sequence[float], *, log: bool | None = None, zero: bool = False,
                ticks: Sequence[float] | None = None, log_ratio: float = LOG_RATIO) -> Axis:
    """The axis for finite ``values`` (at least one).

    ``log`` None chooses: logarithmic when every value is positive and they span at least
    ``log_ratio``. ``zero`` puts 0 in a linear domain (throughput reads against zero).
    Explicit ``ticks`` (the levels of a run) give a tight domain around data and ticks;
    otherwise a linear domain is rounded to 'nice' ticks and a log one padded by
    :data:`LOG_PAD` with 1-2-5 (or decade) ticks.
    """
    lo, hi = min(values), max(values)
    positive = lo > 0
    if log is None:
        log = positive and hi / lo >= log_ratio
    log = log and positive  # a log axis cannot show zero or negatives
    if ticks is not None:
        tick_list = sorted({t for t in ticks if math.isfinite(t) and (t > 0 or not log)})
        if tick_list:
            lo, hi = min(lo, tick_list[0]), max(hi, tick_list[-1])
        if lo == hi:
            lo, hi = (lo / 2, hi * 2) if log else (lo - (abs(lo) or 1) * 0.5, hi + (abs(hi) or 1) * 0.5)
        return Axis(lo=lo, hi=hi, ticks=tuple(t for t in tick_list if lo <= t <= hi), log=log)
    if log:
        # Tight around the data (whole decades can waste most of the plot), unless that
        # leaves fewer than two ticks to read the axis by.
        tlo, thi = lo / LOG_PAD, hi * LOG_PAD
        log_ticks = _log_ticks(tlo, thi)
        if len(log_ticks) < 2:
            tlo, thi = 10.0 ** math.floor(math.log10(lo)), 10.0 ** math.ceil(math.log10(hi))
            thi = thi * 10 if tlo == thi else thi
            log_ticks = _log_ticks(tlo, thi)
        return Axis(lo=tlo, hi=thi, ticks=log_ticks, log=True)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if lo == hi:  # one value (or a flat line): pad so it sits inside the plot
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = (lo - pad if not (zero and lo == 0) else lo), hi + pad
    step = _nice_step(hi - lo)
    nlo, nhi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    count = round((nhi - nlo) / step)
    return Axis(lo=nlo, hi=nhi, ticks=tuple(nlo + i * step for i in range(count + 1)), log=False)


# ---------------------------------------------------------------- drawing helpers


def _e(text: str) -> str:
    return str(escape(text))


def _n(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, text: str, *, anchor: str = "middle", size: int = 11, extra: str = "") -> str:
    return (f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}" font-size="{size}"{extra}>'
            f"{_e(text)}</text>")


def _open(height: float, title: str) -> list[str]:
    return [(f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {_n(height)}" '
             f'width="{WIDTH}" height="{_n(height)}" role="img" aria-label="{_e(title)}" '
             f'font-family="{FONT}" fill="#1b1f24">'), f"<title>{_e(title)}</title>",
            _text(WIDTH / 2, 16, title, size=12, extra=' font-weight="600"')]


def empty_chart(title: str, note: str = "no data") -> Markup:
    """A chart frame that says why there is nothing to draw."""
    parts = _open(EMPTY_HEIGHT, title)
    parts.append(f'<rect x="{PLOT_LEFT}" y="{PLOT_TOP}" width="{PLOT_RIGHT - PLOT_LEFT}" height="44" '
                 'fill="#f6f8fa" stroke="#d0d7de"/>')
    parts.append(_text((PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_TOP + 27, note, extra=' fill="#57606a"'))
    parts.append("</svg>")
    return Markup("".join(parts))


def _finite(value: float | None, log: bool) -> bool:
    return value is not None and math.isfinite(value) and (value > 0 or not log)


def _log_note(axis: Axis) -> str:
    # Said in the label: a log axis read as linear makes a 10× tail look small.
    return " (log scale)" if axis.log else ""


def _axes(xs: Scale, ys: Scale, xa: Axis, ya: Axis, x_label: str, y_label: str,
          x_text: Callable[[float], str], y_text: Callable[[float], str]) -> list[str]:
    out = [(f'<rect x="{PLOT_LEFT}" y="{PLOT_TOP}" width="{PLOT_RIGHT - PLOT_LEFT}" '
            f'height="{PLOT_BOTTOM - PLOT_TOP}" fill="none" stroke="#d0d7de"/>')]
    last = -math.inf
    for t in ya.ticks:  # bottom to top
        y = ys(t)
        out.append(f'<line x1="{PLOT_LEFT}" x2="{PLOT_RIGHT}" y1="{_n(y)}" y2="{_n(y)}" stroke="#eaeef2"/>')
        out.append(f'<line x1="{PLOT_LEFT - 4}" x2="{PLOT_LEFT}" y1="{_n(y)}" y2="{_n(y)}" stroke="#57606a"/>')
        if abs(y - last) >= MIN_LABEL_GAP / 2:
            out.append(_text(PLOT_LEFT - 7, y + 4, y_text(t), anchor="end", extra=' class="tick-y"'))
            last = y
    last = -math.inf
    for t in xa.ticks:
        x = xs(t)
        out.append(f'<line x1="{_n(x)}" x2="{_n(x)}" y1="{PLOT_BOTTOM}" y2="{PLOT_BOTTOM + 4}" stroke="#57606a"/>')
        if x - last >= MIN_LABEL_GAP:
            out.append(_text(x, PLOT_BOTTOM + 16, x_text(t), extra=' class="tick-x"'))
            last = x
    out.append(_text((PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_BOTTOM + 34, x_label + _log_note(xa)))
    cy = (PLOT_TOP + PLOT_BOTTOM) / 2
    out.append(_text(14, cy, y_label + _log_note(ya), extra=f' transform="rotate(-90 14 {_n(cy)})"'))
    return out


def _legend(labels: Sequence[str]) -> tuple[list[str], float]:
    per_row = max(1, (WIDTH - PLOT_LEFT) // LEGEND_COL)
    out = []
    for i, label in enumerate(labels):
        x = PLOT_LEFT + (i % per_row) * LEGEND_COL
        y = LEGEND_TOP + (i // per_row) * LEGEND_ROW
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        out.append(f'<line x1="{x}" x2="{x + 22}" y1="{y - 4}" y2="{y - 4}" stroke="{PALETTE[i % len(PALETTE)]}" '
                   f'stroke-width="2"{dash}/>')
        # Long names are cut so they do not run into the next column; the full text is a tooltip.
        short = label if len(label) <= 17 else label[:16] + "…"
        out.append(f"<g>{_text(x + 27, y, short, anchor='start')}<title>{_e(label)}</title></g>")
    rows = (len(labels) + per_row - 1) // per_row
    return out, LEGEND_TOP + rows * LEGEND_ROW - 4


# ---------------------------------------------------------------- charts


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
               x_log: bool | None = False, y_log: bool | None = None, x_ticks: Sequence[float] | None = None,
               x_zero: bool = False, y_zero: bool = True, x_log_ratio: float = LOG_RATIO,
               x_text: Callable[[float], str] = tick_text, y_text: Callable[[float], str] = tick_text,
               x_tip: Callable[[float], str] = format_float, y_unit: str = "") -> Markup:
    """A line chart, one polyline per series, a marker with a tooltip at every point.

    ``x_log``/``y_log`` None choose from the data (see :func:`choose_axis`). ``x_text``
    and ``y_text`` write tick labels; each point's tooltip is '<series>: <x_tip(x)> → <y><y_unit>'.
    """
    pts = [(x, y) for s in series for x, y in s.points if _finite(x, False) and _finite(y, False)]
    if not pts:
        return empty_chart(title)
    xa = choose_axis([p[0] for p in pts if p[0] is not None], log=x_log, zero=x_zero, ticks=x_ticks,
                     log_ratio=x_log_ratio)
    ya = choose_axis([p[1] for p in pts if p[1] is not None], log=y_log, zero=y_zero)
    xs = Scale(xa.lo, xa.hi, PLOT_LEFT, PLOT_RIGHT, xa.log)
    ys = Scale(ya.lo, ya.hi, PLOT_BOTTOM, PLOT_TOP, ya.log)  # SVG y grows downwards
    legend, height = _legend([s.label for s in series]) if len(series) > 1 else ([], PLOT_BOTTOM + 44)
    parts = _open(height, title)
    parts += _axes(xs, ys, xa, ya, x_label, y_label, x_text, y_text)
    for i, s in enumerate(series):
        colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        segments: list[list[tuple[float, float]]] = [[]]
        for x, y in s.points:
            if x is not None and y is not None and _finite(x, xa.log) and _finite(y, ya.log):
                segments[-1].append((x, y))
            elif segments[-1]:
                segments.append([])  # a missing value breaks the line rather than bridging it
        parts.append(f'<g class="series" stroke="{colour}" fill="{colour}">')
        for seg in segments:
            if len(seg) > 1:
                coords = " ".join(f"{_n(xs(x))},{_n(ys(y))}" for x, y in seg)
                parts.append(f'<polyline points="{coords}" fill="none" stroke-width="2"{dash_attr}/>')
        for seg in segments:
            for x, y in seg:
                tip = f"{s.label}: {x_tip(x)} → {format_float(y)}{y_unit}"
                parts.append(f'<circle cx="{_n(xs(x))}" cy="{_n(ys(y))}" r="2" stroke="none">'
                             f"<title>{_e(tip)}</title></circle>")
        parts.append("</g>")
    parts += legend
    parts.append("</svg>")
    return Markup("".join(parts))


def _percentile_text(p: float) -> str:
    return f"p{p:g}"


def latency_chart(title: str, series: Sequence[tuple[str, Sequence[Any]]], *, unit: str = "ms") -> Markup:
    """The quantile function of one latency metric, one line per level.

    Each series is the 21 quantiles 0, 5, … 100 % of the contract (any length works: the
    values are spread evenly over 0–100 %). The x axis is the percentile, so a long tail
    shows as the right end of a line rising; the y axis goes logarithmic when the
    quantiles span more than :data:`LOG_RATIO`.
    """
    lines = []
    for label, values in series:
        vals = [as_float(v) for v in values] if isinstance(values, (list, tuple)) else []
        n = len(vals)
        pts = [(100.0 * i / (n - 1) if n > 1 else 50.0, v) for i, v in enumerate(vals)]
        lines.append(Series(label=label, points=pts))
    return line_chart(lines, title=title, x_label="percentile of requests", y_label=unit, x_log=False,
                      y_log=None, x_ticks=PERCENTILE_TICKS, y_zero=True, x_text=_percentile_text,
                      x_tip=_percentile_text, y_unit=f" {unit}")


def throughput_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[Any, Any]]]], *,
                     x_label: str, y_label: str, y_unit: str = "",
                     x_tip: Callable[[float], str] = format_float) -> Markup:
    """A throughput (y, from zero) against the load level (x), one line per scenario.

    The x ticks are the levels themselves (up to :data:`MAX_LEVEL_TICKS` distinct); the
    x axis goes logarithmic when the levels span :data:`LEVEL_LOG_RATIO` or more.
    """
    lines = [Series(label=label, points=[(as_float(x), as_float(y)) for x, y in pts]) for label, pts in series]
    levels = sorted({x for s in lines for x, _ in s.points if x is not None and math.isfinite(x)})
    return line_chart(lines, title=title, x_label=x_label, y_label=y_label, x_log=None,
                      x_ticks=levels if 0 < len(levels) <= MAX_LEVEL_TICKS else None,
                      x_log_ratio=LEVEL_LOG_RATIO, y_zero=True, x_tip=x_tip, y_unit=y_unit)


# ---------------------------------------------------------------- sparklines

SPARK_WIDTH = 240
SPARK_HEIGHT = 64
SPARK_LEFT, SPARK_RIGHT, SPARK_TOP, SPARK_BOTTOM = 4, SPARK_WIDTH - 4, 20, SPARK_HEIGHT - 14
SPARK_BUCKETS = 120
"""A long soak has thousands of samples: drawn as the min and max of this many time buckets
(extremes kept: a spike must not be averaged away) so the chart stays small."""


@dataclass(frozen=True)
class TrendLine:
    """A fitted straight line drawn over a sparkline, from ``(t0, v0)`` to ``(t1, v1)``."""

    t0: float
    v0: float
    t1: float
    v1: float


def _decimate(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= 2 * SPARK_BUCKETS:
        return points
    lo_t, hi_t = points[0][0], points[-1][0]
    width = (hi_t - lo_t) / SPARK_BUCKETS or 1.0
    buckets: dict[int, list[tuple[float, float]]] = {}
    for p in points:
        buckets.setdefault(min(SPARK_BUCKETS - 1, int((p[0] - lo_t) / width)), []).append(p)
    out: list[tuple[float, float]] = []
    for key in sorted(buckets):
        group = buckets[key]
        lo, hi = min(group, key=lambda p: p[1]), max(group, key=lambda p: p[1])
        out += sorted({lo, hi})  # in time order
    return out


def _point(t: float | None, v: float | None) -> tuple[float, float] | None:
    if t is None or v is None or not (math.isfinite(t) and math.isfinite(v)):
        return None
    return float(t), float(v)


def _spark_open(tip: str) -> list[str]:
    return [(f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}" '
             f'width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" role="img" aria-label="{_e(tip)}" '
             f'font-family="{FONT}" fill="#1b1f24">'), f"<title>{_e(tip)}</title>"]


def sparkline(title: str, points: Sequence[tuple[float | None, float | None]], *, unit: str = "",
              trend: TrendLine | None = None, shade_until: float | None = None) -> Markup:
    """A small time series without axes: the line, its last value and range, an optional
    fitted trend (dashed) and a shaded warm-up span from the first sample to ``shade_until``.

    Non-finite or missing values break the line. The whole chart carries one tooltip
    (first, last, min, max), not one per point: a soak has too many points for that.
    """
    drawn = [_point(t, v) for t, v in points]
    pts = [p for p in drawn if p is not None]
    suffix = f" {unit}" if unit else ""
    if not pts:
        return Markup("".join([*_spark_open(f"{title}: no data"), _text(SPARK_LEFT, 13, title, anchor="start", size=10),
                               _text(SPARK_WIDTH / 2, 40, "no data", size=10, extra=' fill="#57606a"'), "</svg>"]))
    ts = [t for t, _ in pts]
    vs = [v for _, v in pts]
    # The trend line stays inside the frame: it is drawn on the data's scale, widened to fit it.
    lo, hi = min(vs + ([trend.v0, trend.v1] if trend else [])), max(vs + ([trend.v0, trend.v1] if trend else []))
    if hi == lo:  # flat: centre the line
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    t_lo, t_hi = min(ts), max(ts)
    if t_hi == t_lo:
        t_lo, t_hi = t_lo - 1.0, t_hi + 1.0
    xs = Scale(t_lo, t_hi, SPARK_LEFT, SPARK_RIGHT)
    ys = Scale(lo, hi, SPARK_BOTTOM, SPARK_TOP)
    last = vs[-1]
    tip = (f"{title}: first {format_float(vs[0])}{suffix}, last {format_float(last)}{suffix}, "
           f"min {format_float(min(vs))}{suffix}, max {format_float(max(vs))}{suffix}")
    short = title if len(title) <= 40 else title[:39] + "…"  # the full title is in the tooltip
    parts = [*_spark_open(tip), _text(SPARK_LEFT, 13, short, anchor="start", size=10, extra=' font-weight="600"')]
    if shade_until is not None and shade_until > t_lo:
        x1 = xs(min(shade_until, t_hi))
        parts.append(f'<rect class="warmup" x="{SPARK_LEFT}" y="{SPARK_TOP}" width="{_n(x1 - SPARK_LEFT)}" '
                     f'height="{SPARK_BOTTOM - SPARK_TOP}" fill="#eaeef2"><title>warm-up (not in the trend)</title>'
                     "</rect>")
    segments: list[list[tuple[float, float]]] = [[]]
    for p in drawn:
        if p is not None:
            segments[-1].append(p)
        elif segments[-1]:
            segments.append([])  # a missing sample breaks the line rather than bridging it
    for seg in segments:
        seg = _decimate(seg)
        if len(seg) > 1:
            coords = " ".join(f"{_n(xs(t))},{_n(ys(v))}" for t, v in seg)
            parts.append(f'<polyline class="series" points="{coords}" fill="none" stroke="{PALETTE[0]}" '
                         'stroke-width="1.5"/>')
        elif seg:
            parts.append(f'<circle class="series" cx="{_n(xs(seg[0][0]))}" cy="{_n(ys(seg[0][1]))}" r="1.5" '
                         f'fill="{PALETTE[0]}"/>')
    if trend is not None:
        parts.append(f'<line class="trend" x1="{_n(xs(trend.t0))}" y1="{_n(ys(trend.v0))}" x2="{_n(xs(trend.t1))}" '
                     f'y2="{_n(ys(trend.v1))}" stroke="{PALETTE[1]}" stroke-width="1.5" stroke-dasharray="5 3">'
                     "<title>least-squares trend</title></line>")
    parts.append(_text(SPARK_LEFT, SPARK_HEIGHT - 2, f"last {format_float(last)}{suffix} · range "
                       f"{format_float(min(vs))}–{format_float(max(vs))} · {format_float(t_hi - t_lo)} s",
                       anchor="start", size=9, extra=' fill="#57606a"'))
    parts.append("</svg>")
    return Markup("".join(parts))


# ---------------------------------------------------------------- histograms


HIST_LABEL_GAP = 36.0
"""Least px between two decade labels of a log10 histogram axis ('1e-12' is ~30 px wide)."""


@dataclass(frozen=True)
class Marker:
    """A vertical line across a histogram at ``x`` (a bound, a threshold), named in the legend."""

    label: str
    x: float


def _finite_edges(edges: Sequence[Any]) -> list[float] | None:
    """Bin edges as floats, an open first or last edge (±inf: 'everything below/above')
    closed at one neighbouring bin width; None when they cannot describe bins."""
    vals = [as_float(e) for e in edges]
    if len(vals) < 2 or any(v is None or math.isnan(v) for v in vals):
        return None
    out = [float(v) for v in vals if v is not None]
    if len(out) >= 3 and math.isinf(out[0]) and out[0] < 0 and math.isfinite(out[1]) and math.isfinite(out[2]):
        out[0] = out[1] - (out[2] - out[1])
    if len(out) >= 3 and math.isinf(out[-1]) and out[-1] > 0 and math.isfinite(out[-2]) and math.isfinite(out[-3]):
        out[-1] = out[-2] + (out[-2] - out[-3])
    if not all(math.isfinite(v) for v in out) or any(b <= a for a, b in itertools.pairwise(out)):
        return None
    return out


def _pow10_text(value: float) -> str:
    """A log10 tick as the value it stands for: -3 → '1e-3', 0.5 → '3.2'."""
    return f"1e{int(value)}" if value == int(value) else f"{10.0 ** value:.2g}"


def histogram_chart(title: str, edges: Sequence[Any], series: Sequence[tuple[str, Sequence[Any]]], *,
                    x_label: str, y_label: str = "positions", markers: Sequence[Marker] = (),
                    log10_x: bool = True) -> Markup:
    """Overlaid histograms over shared bin ``edges``: one outlined, lightly filled step shape
    per series (colour and dash differ, so they read apart in print), optional vertical
    markers, a tooltip per non-empty bin.

    ``log10_x``: the edges are log10 of the quantity (KL spans decades), so ticks are labelled
    with the value itself ('1e-3'). A series whose counts do not match the bins, or edges that
    are not increasing, give a chart that says so instead of a wrong picture.
    """
    bins = _finite_edges(edges)
    if bins is None:
        return empty_chart(title, "no histogram recorded")
    counts: list[tuple[str, list[float]]] = []
    for label, values in series:
        vals = [as_float(v) for v in values] if isinstance(values, (list, tuple)) else []
        if len(vals) != len(bins) - 1 or any(v is None or not math.isfinite(v) or v < 0 for v in vals):
            return empty_chart(title, f"{label}: counts do not match the {len(bins) - 1} bins")
        counts.append((label, [float(v) for v in vals if v is not None]))
    if not counts:
        return empty_chart(title)
    marks = [m for m in markers if math.isfinite(m.x)]
    xs_all = [bins[0], bins[-1], *(m.x for m in marks)]
    xa = Axis(lo=min(xs_all), hi=max(xs_all), ticks=(), log=False)
    first, last = math.ceil(xa.lo - 1e-9), math.floor(xa.hi + 1e-9)
    if log10_x and last >= first:
        # Whole decades, every k-th one so that labels like '1e-12' do not run into each other.
        per_decade = (PLOT_RIGHT - PLOT_LEFT) / max(xa.hi - xa.lo, 1e-9)
        k = max(1, math.ceil(HIST_LABEL_GAP / per_decade))
        ticks: tuple[float, ...] = tuple(float(t) for t in range(first, last + 1) if t % k == 0)
    else:
        ticks = choose_axis([xa.lo, xa.hi]).ticks
    xa = Axis(lo=xa.lo, hi=xa.hi, ticks=tuple(t for t in ticks if xa.lo <= t <= xa.hi), log=False)
    ya = choose_axis([v for _, c in counts for v in c] + [0.0], log=False, zero=True)
    xs = Scale(xa.lo, xa.hi, PLOT_LEFT, PLOT_RIGHT)
    ys = Scale(ya.lo, ya.hi, PLOT_BOTTOM, PLOT_TOP)
    x_text = _pow10_text if log10_x else tick_text
    legend, height = _legend([label for label, _ in counts] + [m.label for m in marks])
    parts = _open(height, title)
    parts += _axes(xs, ys, xa, ya, x_label, y_label, x_text, tick_text)
    for i, (label, c) in enumerate(counts):
        colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        # One closed step outline from the baseline: bars of adjacent bins share their edges.
        pts = [(xs(bins[0]), ys(0.0))]
        for k, n in enumerate(c):
            pts += [(xs(bins[k]), ys(n)), (xs(bins[k + 1]), ys(n))]
        pts.append((xs(bins[-1]), ys(0.0)))
        coords = " ".join(f"{_n(x)},{_n(y)}" for x, y in pts)
        parts.append(f'<g class="series" data-series="{_e(label)}">')
        parts.append(f'<polygon points="{coords}" fill="{colour}" fill-opacity="0.18" stroke="{colour}" '
                     f'stroke-width="1.5"{dash_attr}/>')
        for k, n in enumerate(c):
            if n <= 0:
                continue
            lo_t, hi_t = (x_text(bins[k]), x_text(bins[k + 1])) if log10_x else (format_float(bins[k]),
                                                                                   format_float(bins[k + 1]))
            tip = f"{label}: {format_float(n)} {y_label} in [{lo_t}, {hi_t})"
            parts.append(f'<rect x="{_n(xs(bins[k]))}" y="{_n(ys(n))}" width="{_n(xs(bins[k + 1]) - xs(bins[k]))}" '
                         f'height="{_n(ys(0.0) - ys(n))}" fill="transparent"><title>{_e(tip)}</title></rect>')
        parts.append("</g>")
    for j, m in enumerate(marks, start=len(counts)):
        colour, dash = PALETTE[j % len(PALETTE)], DASHES[j % len(DASHES)] or "4 2"
        x = _n(xs(m.x))
        parts.append(f'<line class="marker" x1="{x}" x2="{x}" y1="{PLOT_TOP}" y2="{PLOT_BOTTOM}" stroke="{colour}" '
                     f'stroke-width="1.5" stroke-dasharray="{dash}"><title>{_e(m.label)}</title></line>')
    parts += legend
    parts.append("</svg>")
    return Markup("".join(parts))
