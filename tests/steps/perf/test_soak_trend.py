"""perf.soak's memory verdict on its confidence interval: inconclusive is an error, never a pass.

No server here: the details are built in the docs/perf.md shape around memory entries made by
the real :func:`memory_growth_verdict`, so what is tested is the step's decision on them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from adaptcheck.models.results import Status
from adaptcheck.perf.trend import memory_growth_verdict
from adaptcheck.steps.perf.soak import SoakParams, soak_verdict

PARAMS = SoakParams(framework="endpoint", duration_s=40, warmup_s=10, sample_interval_s=1)


def rss_entry(slope: float, noise: float, *, n: int = 31, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    times = [10.0 + i for i in range(n)]
    values = [800.0 + slope * t / 60 + rng.gauss(0.0, noise) for t in times]
    verdict = memory_growth_verdict(zip(times, values, strict=True), 10.0, warmup_s=10.0)
    return {"series": "server_rss_mib", "source": "host", "label": "server RSS", "bounded": True,
            **verdict.to_dict()}


def details(*memory: dict[str, Any], failed: int = 0) -> dict[str, Any]:
    return {"requests": {"completed": 300, "failed": failed, "warmup_requests": 2, "warmup_failed": 0,
                         "aborted": None, "errors": {"HTTP 500": failed} if failed else {},
                         "output_throughput": 120.0, "ttft_ms": {"p99": 80.0}},
            "memory": list(memory), "counters": []}


def test_the_issue_14_warm_up_slope_is_an_inconclusive_error_not_a_fail() -> None:
    # +10.13 MiB/min over 30 s with 1.06 MiB noise: failed a healthy vLLM server before.
    entry = rss_entry(10.13, 1.06, seed=14)
    assert entry["state"] == "inconclusive"
    outcome = soak_verdict(PARAMS, details(entry))
    assert outcome.status == Status.ERROR, outcome.message
    assert outcome.message.startswith("soak 40 s, 302 requests, 0 errors, but memory growth inconclusive: "
                                      "server RSS (server_rss_mib) ")
    assert "inconclusive: run longer (the slope's interval [" in outcome.message
    assert "min would decide)" in outcome.message
    lo, hi = entry["slope_bounds_mib_per_min"]
    assert outcome.metrics["server_rss_slope_lo_mib_per_min"] == lo < 10 < hi


def test_whole_interval_within_passes_and_above_fails() -> None:
    within = soak_verdict(PARAMS, details(rss_entry(1.0, 0.2)))
    assert within.status == Status.PASS and "≤ bound 10 MiB/min" in within.message
    over = soak_verdict(PARAMS, details(rss_entry(60.0, 0.5)))
    assert over.status == Status.FAIL and "server RSS (server_rss_mib) grows +" in over.message
    assert "> bound 10 MiB/min" in over.message


def test_a_fail_elsewhere_wins_over_an_inconclusive_trend() -> None:
    # Failed requests are a fault of the server whatever memory did: fail, naming them.
    outcome = soak_verdict(PARAMS, details(rss_entry(10.13, 1.06, seed=14), failed=3))
    assert outcome.status == Status.FAIL and "3 of 305 requests failed" in outcome.message


def test_one_inconclusive_series_blocks_even_when_another_is_within() -> None:
    device = rss_entry(1.0, 0.2) | {"series": "memory_used_mib", "source": "device", "label": "device memory used"}
    outcome = soak_verdict(PARAMS, details(device, rss_entry(10.13, 1.06, seed=14)))
    assert outcome.status == Status.ERROR and "server RSS" in outcome.message
    assert "device memory used" not in outcome.message


def test_an_unbounded_series_never_decides() -> None:
    # The CPU backend's whole-host memory: shown, not judged, whatever its interval.
    shown = rss_entry(10.13, 1.06, seed=14) | {"bounded": False, "ok": None, "state": "not bounded"}
    outcome = soak_verdict(PARAMS, details(shown, rss_entry(1.0, 0.2)))
    assert outcome.status == Status.PASS


def test_confidence_is_a_checked_param() -> None:
    assert PARAMS.confidence == 0.95
    for bad in (0.5, 1.0):
        with pytest.raises(ValidationError):
            SoakParams(framework="endpoint", confidence=bad)


def test_the_report_shows_the_interval_and_an_inconclusive_label() -> None:
    from adaptcheck.report.soak import _fit_row

    row = _fit_row(rss_entry(10.13, 1.06, seed=14))
    assert row.verdict.label == "inconclusive: run longer" and row.verdict.key == "error"
    assert row.slope.count("[") == 1 and row.slope.endswith("] MiB/min")
    # A results file written before the interval existed still shows its standard error.
    old = rss_entry(1.0, 0.2)
    old.pop("slope_bounds_mib_per_min")
    old.pop("state")
    legacy = _fit_row(old)
    assert " ± " in legacy.slope and legacy.verdict.label == "within bound"
