"""Inline SVG charts: well-formed, self-contained, escaped, and points where the axes say.

Coordinates are checked against formulas written out here from the plot geometry, not
against the module's own :class:`Scale`, so a wrong mapping (flipped, shifted, linear
where the axis is labelled log) fails the tests; one test breaks the scale on purpose to
prove it.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest
from markupsafe import Markup

from adaptcheck.report import svg
from adaptcheck.report.svg import (
    PLOT_BOTTOM,
    PLOT_LEFT,
    PLOT_RIGHT,
    PLOT_TOP,
    Scale,
    Series,
    choose_axis,
    empty_chart,
    latency_chart,
    line_chart,
    throughput_chart,
    tick_text,
)

from .factory import XSS_ATTR, XSS_SCRIPT

NS = "{http://www.w3.org/2000/svg}"
W, H = PLOT_RIGHT - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP


def parse(chart: Markup) -> ET.Element:
    assert isinstance(chart, Markup)
    return ET.fromstring(str(chart))  # raises on anything that is not well-formed XML


def circles(root: ET.Element) -> list[tuple[float, float, str]]:
    return [(float(c.attrib["cx"]), float(c.attrib["cy"]), c.findtext(f"{NS}title") or "")
            for c in root.iter(f"{NS}circle")]


def polylines(root: ET.Element) -> list[list[tuple[float, float]]]:
    return [[(float(x), float(y)) for x, y in (p.split(",") for p in pl.attrib["points"].split())]
            for pl in root.iter(f"{NS}polyline")]


def ticks(root: ET.Element, cls: str) -> dict[str, float]:
    """Tick label → its position along the axis (x, or the y of its tick line)."""
    out = {}
    for t in root.iter(f"{NS}text"):
        if t.attrib.get("class") == cls and t.text:
            out[t.text] = float(t.attrib["x"]) if cls == "tick-x" else float(t.attrib["y"]) - 4
    return out


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def lin_x(v: float, lo: float, hi: float) -> float:
    return PLOT_LEFT + (v - lo) / (hi - lo) * W


def lin_y(v: float, lo: float, hi: float) -> float:
    return PLOT_BOTTOM - (v - lo) / (hi - lo) * H


def log_y(v: float, lo: float, hi: float) -> float:
    return PLOT_BOTTOM - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * H


def assert_points(root: ET.Element, expected: list[tuple[float, float]]) -> None:
    got = [(x, y) for x, y, _ in circles(root)]
    assert len(got) == len(expected)
    for (gx, gy), (ex, ey) in zip(got, expected, strict=False):
        assert gx == pytest.approx(ex, abs=0.01) and gy == pytest.approx(ey, abs=0.01), (got, expected)


LINEAR = [Series("a", [(0.0, 0.0), (5.0, 50.0), (10.0, 100.0)])]


def linear_expected() -> list[tuple[float, float]]:
    # x 0..10 and y 0..100 are already 'nice': the domains are exactly the data's.
    return [(lin_x(x, 0, 10), lin_y(y, 0, 100)) for x, y in [(0, 0), (5, 50), (10, 100)]]


# ---------------------------------------------------------------- scale and axes


def test_scale_maps_linear_and_log() -> None:
    assert Scale(0, 100, 10, 110)(50) == 60
    assert Scale(0, 100, 200, 0)(25) == 150  # y: pixels grow downwards
    assert Scale(1, 1000, 0, 300, log=True)(10) == pytest.approx(100)
    assert Scale(1, 1000, 0, 300, log=True)(1000) == pytest.approx(300)


def test_choose_axis_domains_and_ticks() -> None:
    a = choose_axis([3, 7], zero=True)
    assert (a.lo, a.hi, a.ticks, a.log) == (0, 8, (0, 2, 4, 6, 8), False)
    a = choose_axis([3, 7])
    assert (a.lo, a.hi, a.log) == (3, 7, False) and a.ticks[0] == 3 and a.ticks[-1] == 7
    assert choose_axis([0, 0], zero=True).hi == 1  # all zero: still a usable axis
    one = choose_axis([5])
    assert one.lo < 5 < one.hi and len(one.ticks) >= 2
    assert choose_axis([1, 100]).log and not choose_axis([1, 10]).log  # spans LOG_RATIO or not
    assert not choose_axis([0, 100]).log and not choose_axis([-5, 100], log=True).log  # log cannot show <= 0
    lg = choose_axis([12, 30000])  # over 2.5 decades: one tick per decade
    assert lg.log and lg.lo < 12 and lg.hi > 30000 and lg.ticks == (100, 1000, 10000)
    small = choose_axis([60, 4000])  # under 2.5 decades: 1-2-5 ticks
    assert small.ticks == (100, 200, 500, 1000, 2000)
    levels = choose_axis([1, 64], ticks=[1, 2, 4, 8, 16, 32, 64], log_ratio=8)
    assert (levels.lo, levels.hi, levels.log, levels.ticks) == (1, 64, True, (1, 2, 4, 8, 16, 32, 64))
    assert choose_axis([4], ticks=[4]).lo < 4 < choose_axis([4], ticks=[4]).hi


def test_tick_text() -> None:
    assert [tick_text(v) for v in (0, 2.5, 120, 12_000, 1_500_000, 0.125)] == ["0", "2.5", "120", "12k", "1.5M",
                                                                               "0.125"]


# ---------------------------------------------------------------- coordinates


def test_linear_points_land_on_their_coordinates() -> None:
    root = parse(line_chart(LINEAR, title="t", x_label="x", y_label="y", x_log=False, y_log=False))
    assert_points(root, linear_expected())
    assert polylines(root) == [[pytest.approx(p, abs=0.01) for p in linear_expected()]]
    # The tick labels agree with the points: '100' sits where y = 100 was drawn.
    y_ticks, x_ticks = ticks(root, "tick-y"), ticks(root, "tick-x")
    assert y_ticks["100"] == pytest.approx(lin_y(100, 0, 100)) and y_ticks["0"] == pytest.approx(PLOT_BOTTOM)
    assert x_ticks["10"] == pytest.approx(PLOT_RIGHT) and x_ticks["4"] == pytest.approx(lin_x(4, 0, 10))


def test_a_wrong_scale_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the mapping on purpose (as a refactor might): the coordinate check must fail."""
    right: Callable[[Scale, float], float] = Scale.__call__

    def off_by_a_tenth(self: Scale, value: float) -> float:
        return right(Scale(self.lo, self.hi * 1.1, self.start, self.end, self.log), value)

    def flipped(self: Scale, value: float) -> float:
        return right(Scale(self.lo, self.hi, self.end, self.start, self.log), value)

    for broken in (off_by_a_tenth, flipped):
        monkeypatch.setattr(Scale, "__call__", broken)
        root = parse(line_chart(LINEAR, title="t", x_label="x", y_label="y", x_log=False, y_log=False))
        with pytest.raises(AssertionError):
            assert_points(root, linear_expected())
    monkeypatch.undo()
    assert_points(parse(line_chart(LINEAR, title="t", x_label="x", y_label="y", x_log=False, y_log=False)),
                  linear_expected())


def test_log_axis_points_and_label() -> None:
    values = [10.0, 100.0, 1000.0]
    root = parse(latency_chart("TTFT", [("c=1", values)]))
    axis = choose_axis(values, zero=True)
    assert axis.log and axis.lo == pytest.approx(10 / svg.LOG_PAD) and axis.hi == pytest.approx(1000 * svg.LOG_PAD)
    # Three values spread over 0-100 %: p0, p50, p100; y on the log axis.
    expected = [(lin_x(p, 0, 100), log_y(v, axis.lo, axis.hi)) for p, v in zip((0, 50, 100), values, strict=False)]
    assert_points(root, expected)
    assert ticks(root, "tick-y")["100"] == pytest.approx(expected[1][1])  # the '100' tick is the middle point
    assert "ms (log scale)" in texts(root)
    # A linear reading of the same chart would put 100 ms near the bottom, not in the middle.
    assert expected[1][1] != pytest.approx(lin_y(100, axis.lo, axis.hi), abs=1)


def test_latency_quantiles_spread_over_percentiles() -> None:
    q = [float(10 + i) for i in range(21)]
    root = parse(latency_chart("TPOT", [("c=4", q), ("c=8", [v * 2 for v in q])]))
    pts = circles(root)
    assert len(pts) == 42 and len(polylines(root)) == 2
    assert pts[10][0] == pytest.approx((PLOT_LEFT + PLOT_RIGHT) / 2)  # p50 mid-plot
    assert pts[18][2] == "c=4: p90 → 28 ms" and pts[20][0] == pytest.approx(PLOT_RIGHT)
    assert {"p0", "p50", "p90", "p100"} <= set(ticks(root, "tick-x"))
    assert {"c=4", "c=8"} <= set(texts(root))  # legend


def test_throughput_against_levels() -> None:
    root = parse(throughput_chart("tok/s", [("short", [(1, 100), (4, 380), (16, 1200), (64, 1500)])],
                                  x_label="concurrency", y_label="output tok/s", y_unit=" tok/s"))
    x_ticks = ticks(root, "tick-x")
    assert list(x_ticks) == ["1", "4", "16", "64"]  # the levels themselves
    # log2-spaced levels are evenly spaced on the log axis.
    xs = [x for x, _, _ in circles(root)]
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.02) == pytest.approx(xs[3] - xs[2], abs=0.02)
    assert xs[0] == pytest.approx(PLOT_LEFT) and xs[3] == pytest.approx(PLOT_RIGHT)
    assert "concurrency (log scale)" in texts(root)
    y_axis = choose_axis([100, 380, 1200, 1500], zero=True)
    assert y_axis.lo == 0  # throughput reads against zero
    assert circles(root)[2][1] == pytest.approx(lin_y(1200, 0, y_axis.hi), abs=0.01)
    assert circles(root)[2][2] == "short: 16 → 1200 tok/s"
    # Few, close levels: linear axis.
    lin = parse(throughput_chart("t", [("s", [(2, 1), (3, 2), (4, 3)])], x_label="c", y_label="y"))
    assert "c" in texts(lin) and "c (log scale)" not in texts(lin)


# ---------------------------------------------------------------- odd data


@pytest.mark.parametrize("series", [
    [],
    [Series("a", [])],
    [Series("a", [(1.0, math.nan), (None, 2.0), (math.inf, 3.0), (2.0, None)])],
])
def test_no_finite_point_says_no_data(series: list[Series]) -> None:
    root = parse(line_chart(series, title="empty", x_label="x", y_label="y"))
    assert "no data" in texts(root) and circles(root) == [] and polylines(root) == []


def test_empty_inputs_of_the_chart_helpers() -> None:
    for chart in (latency_chart("TTFT", []), latency_chart("TTFT", [("c=1", [])]),
                  latency_chart("TTFT", [("c=1", None)]),  # type: ignore[list-item]
                  latency_chart("TTFT", [("c=1", ["n/a", "nan", None])]),
                  throughput_chart("t", [("s", [(None, 1), (2, None)])], x_label="x", y_label="y"),
                  empty_chart("why", "nothing measured")):
        root = parse(chart)
        assert circles(root) == [] and ("no data" in texts(root) or "nothing measured" in texts(root))


def test_one_point_and_flat_lines_stay_inside_the_plot() -> None:
    for series in ([Series("a", [(4.0, 7.0)])], [Series("a", [(1.0, 5.0), (2.0, 5.0), (3.0, 5.0)])],
                   [Series("a", [(0.0, 0.0), (1.0, 0.0)])]):
        for y_zero in (True, False):
            root = parse(line_chart(series, title="t", x_label="x", y_label="y", y_zero=y_zero))
            for x, y, _ in circles(root):
                assert PLOT_LEFT <= x <= PLOT_RIGHT and PLOT_TOP <= y <= PLOT_BOTTOM
    assert polylines(parse(line_chart([Series("a", [(4.0, 7.0)])], title="t", x_label="x", y_label="y"))) == []
    assert len(circles(parse(latency_chart("t", [("one", [12.5])])))) == 1


def test_gaps_break_the_line() -> None:
    pts: list[tuple[float | None, float | None]] = [(1.0, 1.0), (2.0, 2.0), (3.0, math.nan), (4.0, 4.0), (5.0, 5.0)]
    root = parse(line_chart([Series("a", pts)], title="t", x_label="x", y_label="y"))
    assert [len(p) for p in polylines(root)] == [2, 2] and len(circles(root)) == 4


def test_forced_log_drops_non_positive_points() -> None:
    root = parse(line_chart([Series("a", [(1.0, 0.0), (2.0, 10.0), (3.0, 1000.0)])], title="t", x_label="x",
                            y_label="y", y_log=None))
    assert len(circles(root)) == 3  # 0 present: the axis stays linear and shows it
    root = parse(line_chart([Series("a", [(1.0, 1.0), (2.0, 10.0), (3.0, 1000.0)])], title="t", x_label="x",
                            y_label="y", y_log=True))
    assert len(circles(root)) == 3 and "y (log scale)" in texts(root)


# ---------------------------------------------------------------- escaping and self-containment


def test_every_text_is_escaped() -> None:
    chart = line_chart([Series(XSS_SCRIPT, [(1.0, 2.0), (2.0, 3.0)]), Series(XSS_ATTR, [(1.0, 1.0)])],
                       title=XSS_ATTR + XSS_SCRIPT, x_label=XSS_SCRIPT, y_label=XSS_ATTR)
    assert "<script" not in chart and "<img" not in chart
    root = parse(chart)
    assert root.attrib["aria-label"] == XSS_ATTR + XSS_SCRIPT and root.findtext(f"{NS}title") == XSS_ATTR + XSS_SCRIPT
    assert XSS_SCRIPT in texts(root)  # the axis label, as text
    assert {e.tag for e in root.iter()} <= {f"{NS}{t}" for t in ("svg", "title", "text", "rect", "line", "g",
                                                                   "polyline", "circle")}
    assert not [k for e in root.iter() for k in e.attrib if k.lower().startswith("on")]
    assert circles(root)[0][2] == f"{XSS_SCRIPT}: 1 → 2"
    lat = latency_chart(XSS_SCRIPT, [(XSS_ATTR, [1, 2, 3])])
    assert "<script" not in lat and parse(lat).findtext(f"{NS}title") == XSS_SCRIPT
    assert "<script" not in empty_chart(XSS_SCRIPT, XSS_SCRIPT)


def test_charts_are_self_contained() -> None:
    charts = [line_chart(LINEAR, title="t", x_label="x", y_label="y"), latency_chart("l", [("a", [1, 2, 3])]),
              throughput_chart("t", [("a", [(1, 2), (8, 9)])], x_label="x", y_label="y"), empty_chart("e")]
    for chart in charts:
        text = str(chart)
        assert text.startswith('<svg xmlns="http://www.w3.org/2000/svg"') and text.endswith("</svg>")
        rest = text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        for needle in ("href", "url(", "http", "<script", "<image", "<style", "<foreignObject", "@import"):
            assert needle not in rest, needle


def test_legend_only_with_several_series_and_long_names_cut() -> None:
    one = parse(line_chart([Series("only", [(1.0, 1.0), (2.0, 2.0)])], title="t", x_label="x", y_label="y"))
    assert "only" not in texts(one)
    long = "a_really_long_scenario_name_indeed"
    two = parse(line_chart([Series(long, [(1.0, 1.0)]), Series("b", [(1.0, 2.0)])], title="t", x_label="x",
                           y_label="y"))
    assert long[:16] + "…" in texts(two) and "b" in texts(two)
    assert long in [t.text for t in two.iter(f"{NS}title")]  # the full name as a tooltip
    # Each series differs by dash as well as colour (readable without colour, in print).
    dashes = [ln.attrib.get("stroke-dasharray", "") for ln in two.iter(f"{NS}line") if ln.attrib.get("stroke-width")]
    assert len(set(dashes)) == 2
