"""perf.soak's memory verdict on its confidence interval: inconclusive is an error, never a pass.

No server here: the details are built in the docs/perf.md shape around memory entries made by
the real :func:`memory_growth_verdict`, so what is tested is the step's decision on them; and
the looks (:class:`~adaptcheck.steps.perf.soak.Looker`) run live on a synthetic series handed
out as time passes, so what is tested is when they stop the load and what they leave.
"""

from __future__ import annotations

import random
import time
from typing import Any, cast

import pytest
from pydantic import ValidationError

from adaptcheck.base.schemas.results import Status
from adaptcheck.base.schemas.serving_evidence import MemoryTrend, SoakEvidence
from adaptcheck.ladder.check import Outcome
from adaptcheck.perf.telemetry import SeriesSet, Telemetry, TelemetrySampler
from adaptcheck.perf.trend import memory_growth_verdict
from adaptcheck.steps.perf import soak
from adaptcheck.steps.perf.soak import Looker, SoakParams

PARAMS = SoakParams(framework="endpoint", duration_s=40, warmup_s=10, sample_interval_s=1)


def rss_entry(slope: float, noise: float, *, n: int = 31, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    times = [10.0 + i for i in range(n)]
    values = [800.0 + slope * t / 60 + rng.gauss(0.0, noise) for t in times]
    verdict = memory_growth_verdict(zip(times, values, strict=True), 10.0, warmup_s=10.0)
    return verdict.evidence(series="server_rss_mib", source="host", label="server RSS", bounded=True).dump()


def soak_verdict(params: SoakParams, stored: dict[str, Any]) -> Outcome:
    """The step's verdict on details given as stored."""
    return soak.soak_verdict(params, SoakEvidence.model_validate(stored))


def decision_of(looker: Looker, telemetry: Telemetry, *, ran_s: float, aborted: str | None) -> dict[str, Any]:
    """The looker's ``details.decision`` as stored, with the verdict's memory entries under ``memory``."""
    decision, memory = looker.decision(telemetry, ran_s=ran_s, aborted=aborted)
    return decision.dump() | {"memory": [m.dump() for m in memory]}


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

    row = _fit_row(MemoryTrend.model_validate(rss_entry(10.13, 1.06, seed=14)))
    assert row.verdict.label == "inconclusive: run longer" and row.verdict.key == "error"
    assert row.slope.count("[") == 1 and row.slope.endswith("] MiB/min")
    # A results file written before the interval existed still shows its standard error.
    old = rss_entry(1.0, 0.2)
    old.pop("slope_bounds_mib_per_min")
    old.pop("state")
    legacy = _fit_row(MemoryTrend.model_validate(old))
    assert " ± " in legacy.slope and legacy.verdict.label == "within bound"


# --------------------------------------------------------------- the looks, live, without a server --

class FakeSampler:
    """Hands out, as time passes, the samples of a synthetic series (what the telemetry sampler
    would have collected by then)."""

    def __init__(self, series: list[tuple[float, float]], interval_s: float) -> None:
        self.series = series
        self.interval_s = interval_s
        self.t0 = time.monotonic()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def snapshot(self) -> Telemetry:
        host = SeriesSet()
        now = self.elapsed_s
        for t, v in self.series:
            if t <= now:
                host.add(t, {"server_rss_mib": v}, 0.0)
        return Telemetry(interval_s=self.interval_s, host=host, device=None, errors={}, notes=[])


# 0.1 s samples, looks at 0.6, 0.9, 1.2 and 1.5 s: the same rule as a soak of minutes, faster.
FAST = SoakParams(framework="endpoint", duration_s=0.6, max_duration_s=1.5, looks=4, warmup_s=0.0,
                  sample_interval_s=0.1, max_growth_mib_per_min=10)


def look(slope: float, noise: float, seed: int) -> tuple[Looker, float]:
    rng = random.Random(seed)
    series = [(i / 10, 800.0 + slope * i / 600 + rng.gauss(0.0, noise)) for i in range(40)]
    sampler = FakeSampler(series, 0.1)
    looker = Looker(cast(TelemetrySampler, sampler), FAST, accelerator=False).start()
    stopped = looker.stop_load.wait(5.0)
    took = sampler.elapsed_s
    looker.close()
    assert stopped, "the looks never stopped the load"
    return looker, took


def test_the_looks_stop_a_flat_soak_at_the_first_look() -> None:
    looker, took = look(0.0, 0.001, seed=1)
    assert 0.6 <= took < 0.9 and looker.stop == "decided"
    decision = decision_of(looker, cast(Telemetry, None), ran_s=took, aborted=None)
    assert decision["stop"] == "decided" and decision["stopped_at_s"] == 0.6
    assert decision["looks_at_s"] == [0.6, 0.9, 1.2, 1.5] and decision["look_confidence"] == pytest.approx(0.9875)
    assert decision["looks"] == [{"at_s": 0.6, "states": {"server_rss_mib": "within"}}]
    assert decision["why"] == "decided at 0.6 s, look 1 of 4"
    (rss,) = decision["memory"]
    assert rss["state"] == "within" and rss["fit"]["t_end_s"] <= 0.6 and rss["confidence"] == pytest.approx(0.9875)


def test_the_looks_stop_a_leak_at_the_first_look() -> None:
    looker, took = look(6000.0, 0.001, seed=2)
    assert took < 0.9 and looker.stop == "decided" and looker.looks[0].states == {"server_rss_mib": "over"}


def test_growth_at_the_bound_goes_to_the_budget_and_is_an_error() -> None:
    looker, took = look(10.0, 0.05, seed=3)
    assert took >= 1.5 and looker.stop == "budget" and len(looker.looks) == 4
    decision = decision_of(looker, cast(Telemetry, None), ran_s=1.6, aborted=None)
    assert decision["why"] == "budget of 1.5 s spent, undecided at its last look"
    memory = decision.pop("memory")
    assert [m["state"] for m in memory] == ["inconclusive"]
    outcome = soak_verdict(FAST, details(*memory) | {"decision": decision})
    assert outcome.status == Status.ERROR, outcome.message
    assert outcome.message.startswith("soak 2 s (budget of 1.5 s spent, undecided at its last look), 302 requests, "
                                      "0 errors, but memory growth inconclusive: server RSS (server_rss_mib) ")
    assert "straddles the bound 10 MiB/min" in outcome.message and outcome.metrics["soak_s"] == 1.6


def test_a_load_that_ends_before_the_first_look_is_judged_on_what_there_is() -> None:
    rng = random.Random(4)
    series = [(i / 10, 800.0 + rng.gauss(0.0, 0.01)) for i in range(8)]
    sampler = FakeSampler(series, 0.1)
    looker = Looker(cast(TelemetrySampler, sampler), FAST, accelerator=False).start()
    looker.close()  # the load ended at once (the server died)
    decision = decision_of(looker, sampler.snapshot(), ran_s=0.1, aborted="the server stopped accepting connections")
    assert decision["stop"] == "load ended" and decision["looks"] == [] and decision["stopped_at_s"] is None
    assert "the server stopped accepting connections" in decision["why"]


def test_max_duration_is_checked_and_defaults_to_one_look() -> None:
    assert PARAMS.budget_s == 40 and PARAMS.rule().times() == [40.0]
    assert PARAMS.rule().per_look_confidence == pytest.approx(0.95)
    with pytest.raises(ValidationError, match="max_duration_s"):
        SoakParams(framework="endpoint", duration_s=40, max_duration_s=30, warmup_s=10)
    with pytest.raises(ValidationError):
        SoakParams(framework="endpoint", looks=0)
