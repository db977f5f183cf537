"""Serving metrics against numbers worked out by hand, numpy's percentiles and vLLM's own calculate_metrics."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from adaptcheck.base.schemas.serving_evidence import RunSummary
from adaptcheck.perf import serving_metrics as sm
from adaptcheck.perf.serving_metrics import RequestRecord

LEVEL = 4.0


def rec(index: int, *, ttft: float | None = None, e2el: float | None = None, itl: list[float] | None = None,
        chunk_tokens: list[int] | None = None, n: int | None = None, sent: float = 0.0, scheduled: float = 0.0,
        error: str | None = None, warmup: bool = False, usage: int | None = None,
        mine: int | None = None) -> RequestRecord:
    return RequestRecord(level=LEVEL, run=0, index=index, warmup=warmup, scheduled_s=scheduled, sent_s=sent,
                         ttft_s=ttft, e2el_s=e2el, itl_s=itl or [], chunk_tokens=chunk_tokens or [],
                         input_tokens=32, output_tokens=n, token_source="usage" if n is not None else None,
                         usage_tokens=usage if usage is not None else n, tokenizer_tokens=mine if mine is not None else n,
                         error=error, finish_reason="length" if error is None else None)


def records() -> list[RequestRecord]:
    """A: 5 tokens in 4 chunks (the third carries 2); B: a single token; C: failed; W: warm-up."""
    return [
        rec(0, ttft=0.1, e2el=0.7, itl=[0.1, 0.2, 0.3], chunk_tokens=[1, 1, 2, 1], n=5, sent=0.010, scheduled=0.0),
        rec(1, ttft=0.2, e2el=0.2, itl=[], chunk_tokens=[1], n=1, sent=0.504, scheduled=0.5, mine=2),
        rec(2, sent=1.002, scheduled=1.0, error="EndpointStatusError: HTTP 500: boom"),
        rec(3, ttft=9.0, e2el=9.0, chunk_tokens=[1], n=1, warmup=True, sent=-5.0, scheduled=-5.0),
    ]


def check_summary(s: dict[str, Any]) -> None:
    """What the records above must give, worked out by hand (duration 2 s)."""
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["error_rate"] == pytest.approx(1 / 3)
    assert s["errors"] == {"EndpointStatusError: HTTP 500: boom": 1}
    assert s["request_throughput"] == pytest.approx(1.0)            # 2 completed / 2 s
    assert s["output_throughput"] == pytest.approx(3.0)             # (5 + 1) tokens / 2 s
    assert s["total_output_tokens"] == 6 and s["total_input_tokens"] == 64
    # TPOT = (E2EL - TTFT) / (N - 1) = 0.6 / 4 = 150 ms; B (N = 1) has none.
    assert s["tpot_ms"]["median"] == pytest.approx(150.0) and s["tpot_ms"]["max"] == pytest.approx(150.0)
    # TTFT of A and B: 100, 200 ms; p90 interpolates 100 + 0.9 x 100.
    assert s["ttft_ms"]["median"] == pytest.approx(150.0) and s["ttft_ms"]["p90"] == pytest.approx(190.0)
    assert s["ttft_ms"]["std"] == pytest.approx(50.0)
    # ITL per chunk: 100, 200, 300 ms; per token each gap / tokens of the chunk ending it: 100, 100, 300.
    assert s["itl_ms"]["median"] == pytest.approx(200.0) and s["itl_ms"]["mean"] == pytest.approx(200.0)
    assert s["itl_per_token_ms"]["median"] == pytest.approx(100.0)
    assert s["itl_per_token_ms"]["mean"] == pytest.approx(500 / 3)
    assert s["e2el_ms"]["max"] == pytest.approx(700.0) and s["e2el_ms"]["min"] == pytest.approx(200.0)
    # Queue time of every measured request, failed ones included: 10, 4, 2 ms.
    assert s["queue_ms"]["median"] == pytest.approx(4.0) and s["queue_ms"]["max"] == pytest.approx(10.0)
    assert s["chunks_per_token"] == pytest.approx(5 / 6)            # 4 + 1 content chunks for 6 tokens
    assert s["token_mismatches"] == 1 and s["token_source"] == "usage"
    assert s["goodput"] is None and s["slo_attainment"] is None


def test_run_summary_matches_the_hand_computed_figures() -> None:
    s = sm.summarize_run(records(), duration_s=2.0).dump()
    check_summary(s)
    assert list(s) == ["completed", "failed", "error_rate", "errors", "duration_s", "request_throughput",
                       "output_throughput", "total_input_tokens", "total_output_tokens", "token_source",
                       "token_mismatches", "ttft_ms", "tpot_ms", "itl_ms", "itl_per_token_ms", "itl_basis", "e2el_ms",
                       "queue_ms", "goodput", "slo_attainment", "chunks_per_token"]
    assert list(s["ttft_ms"]) == list(sm.STAT_KEYS)


def wrong_tpot_e2el_over_n(r: RequestRecord) -> float | None:
    return (r.e2el_s or 0) / r.output_tokens if r.ok and r.output_tokens and r.output_tokens > 1 else None


def wrong_tpot_over_n(r: RequestRecord) -> float | None:
    n = r.output_tokens
    return ((r.e2el_s or 0) - (r.ttft_s or 0)) / n if r.ok and n and n > 1 else None


def wrong_itl_per_token_by_own_chunk(r: RequestRecord) -> list[float]:
    return [g / max(1, n) for g, n in zip(r.itl_s, r.chunk_tokens, strict=False)]


@pytest.mark.parametrize(("name", "wrong"), [
    ("tpot_s", wrong_tpot_e2el_over_n),
    ("tpot_s", wrong_tpot_over_n),
    ("itl_per_token_s", wrong_itl_per_token_by_own_chunk),
])
def test_a_wrong_formula_is_caught(monkeypatch: pytest.MonkeyPatch, name: str, wrong: Callable[..., Any]) -> None:
    monkeypatch.setattr(sm, name, wrong)
    with pytest.raises(AssertionError):
        check_summary(sm.summarize_run(records(), duration_s=2.0).dump())


def test_goodput_counts_requests_meeting_every_slo() -> None:
    s = sm.summarize_run(records(), duration_s=2.0, slo={"ttft_ms": 150, "tpot_ms": 160}).dump()
    assert s["goodput"] == pytest.approx(0.5) and s["slo_attainment"] == pytest.approx(0.5)  # A only
    # TPOT counts as 0 for a 1-token answer (vLLM's rule): B meets a 100 ms TPOT SLO, A does not.
    s = sm.summarize_run(records(), duration_s=2.0, slo={"tpot_ms": 100, "e2el_ms": None}).dump()
    assert s["goodput"] == pytest.approx(0.5)
    assert sm.summarize_run(records(), duration_s=2.0, slo={"e2el_ms": 1000}).dump()["slo_attainment"] == 1.0
    with pytest.raises(ValueError, match="unknown SLO"):
        sm.summarize_run(records(), slo={"latency": 1.0}).dump()


def test_duration_defaults_to_first_send_to_last_completion() -> None:
    s = sm.summarize_run(records()).dump()
    assert s["duration_s"] == pytest.approx(0.700)  # A: sent 0.010, done 0.710 (B: 0.504 to 0.704)


def test_percentile_is_numpys_linear_interpolation() -> None:
    rng = random.Random(3)
    for n in (1, 2, 3, 10, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 5, 50, 90, 95, 99, 99.9, 100):
            assert sm.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    with pytest.raises(ValueError):
        sm.percentile([], 50)


def test_an_empty_run_has_null_figures() -> None:
    s = sm.summarize_run([rec(0, error="EndpointUnreachable: refused")], duration_s=1.0).dump()
    assert s["completed"] == 0 and s["error_rate"] == 1.0 and s["output_throughput"] == 0.0
    assert s["ttft_ms"] == dict.fromkeys(sm.STAT_KEYS) and s["chunks_per_token"] is None
    assert sm.summarize_run([], duration_s=None).dump()["error_rate"] is None


def test_errors_keep_the_ten_most_frequent_kinds() -> None:
    failed = [rec(i, error=f"kind {i % 12}") for i in range(30)]
    errors = sm.summarize_run(failed, duration_s=1.0).dump()["errors"]
    assert len(errors) == 10 and sum(errors.values()) <= 30 and errors["kind 0"] == 3


def summary_with(throughput: float, ttft: float, tpot: float | None, errors: dict[str, int]) -> dict[str, Any]:
    return {"completed": 10, "output_throughput": throughput, "token_source": "usage", "errors": errors,
            "ttft_ms": {"median": ttft, "p99": ttft * 2}, "tpot_ms": {"median": tpot, "p99": None}}


def test_spread_and_median_over_runs() -> None:
    runs = [summary_with(100.0, 10.0, 2.0, {"a": 1}), summary_with(110.0, 12.0, 2.0, {}),
            summary_with(90.0, 11.0, 2.2, {"a": 2, "b": 1})]
    spread = sm.spread([RunSummary.model_validate(r) for r in runs])
    assert spread["output_tok_per_s"] == pytest.approx(0.2)   # (110 - 90) / 100
    assert spread["ttft_ms_median"] == pytest.approx(2 / 11)  # (12 - 10) / 11
    assert spread["tpot_ms_median"] == pytest.approx(0.1)     # (2.2 - 2.0) / 2.0
    median = sm.median_summary([RunSummary.model_validate(r) for r in runs]).dump()
    assert list(median) == list(RunSummary.model_validate(runs[0]).dump())  # RunSummary-shaped
    assert median["output_throughput"] == 100.0 and median["ttft_ms"]["p99"] == 22.0
    assert median["tpot_ms"] == {"median": 2.0, "p99": None}
    assert median["errors"] == {"a": 3, "b": 1} and median["token_source"] == "usage"
    assert sm.spread([RunSummary.model_validate(runs[0])])["output_tok_per_s"] is None  # one run: no spread to speak of
    assert sm.relative_spread([None, 5.0, None]) is None


def test_level_summary_and_distributions() -> None:
    first, second = records(), [rec(0, ttft=0.3, e2el=0.9, itl=[0.6], chunk_tokens=[1, 1], n=2, sent=0.0)]
    level = sm.level_summary(LEVEL, [(first, 2.0), (second, 1.0)]).dump()
    assert level["level"] == LEVEL and len(level["runs"]) == 2
    check_summary(level["runs"][0])
    dist = level["distributions"]
    assert set(dist) == {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"} and len(dist["ttft_ms"]) == 21
    assert dist["ttft_ms"][0] == pytest.approx(100.0) and dist["ttft_ms"][-1] == pytest.approx(300.0)  # warm-up left out
    assert dist["ttft_ms"][10] == pytest.approx(200.0)
    assert dist["tpot_ms"][0] == pytest.approx(150.0) and dist["tpot_ms"][-1] == pytest.approx(600.0)
    assert level["median"]["completed"] == 1.5


def test_records_round_trip_as_json_lines() -> None:
    import json

    for r in records():
        line = json.dumps(r.to_dict())
        assert RequestRecord.from_dict(json.loads(line)) == r
    assert set(records()[0].to_dict()) == {
        "level", "run", "index", "warmup", "scheduled_s", "sent_s", "ttft_s", "e2el_s", "itl_s", "chunk_tokens",
        "input_tokens", "output_tokens", "token_source", "usage_tokens", "tokenizer_tokens", "error",
        "finish_reason", "max_tokens", "input_tokens_sent", "itl_basis"}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_same_figures_as_vllm_bench_calculate_metrics() -> None:
    """vLLM's own calculate_metrics on the same requests gives the same medians, percentiles and throughput."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    rng = random.Random(11)
    ours, theirs = [], []
    for i in range(40):
        n = rng.randint(1, 20)
        ttft = rng.uniform(0.01, 0.2)
        itl = [rng.uniform(0.002, 0.02) for _ in range(n - 1)]
        ours.append(rec(i, ttft=ttft, e2el=ttft + sum(itl), itl=itl, chunk_tokens=[1] * n, n=n))
        theirs.append(RequestFuncOutput(success=True, latency=ttft + sum(itl), output_tokens=n, ttft=ttft, itl=itl,
                                        prompt_len=32, start_time=0.0))
    theirs.append(RequestFuncOutput(success=False, error="boom"))
    ours.append(rec(40, error="boom"))
    metrics, _ = calculate_metrics(input_requests=[], outputs=theirs, dur_s=3.0, tokenizer=None,
                                   selected_percentiles=[50, 90, 99], goodput_config_dict={"ttft": 100.0, "tpot": 10.0})
    s = sm.summarize_run(ours, duration_s=3.0, slo={"ttft_ms": 100.0, "tpot_ms": 10.0}).dump()
    assert s["completed"] == metrics.completed and s["failed"] == metrics.failed
    assert s["output_throughput"] == pytest.approx(metrics.output_throughput)
    assert s["request_throughput"] == pytest.approx(metrics.request_throughput)
    assert s["goodput"] == pytest.approx(metrics.request_goodput)
    for ours_key, name in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2el_ms", "e2el")):
        assert s[ours_key]["median"] == pytest.approx(getattr(metrics, f"median_{name}_ms"))
        assert s[ours_key]["mean"] == pytest.approx(getattr(metrics, f"mean_{name}_ms"))
        assert s[ours_key]["std"] == pytest.approx(getattr(metrics, f"std_{name}_ms"))
        theirs_p = dict(getattr(metrics, f"percentiles_{name}_ms"))
        assert (s[ours_key]["p90"], s[ours_key]["p99"]) == pytest.approx((theirs_p[90], theirs_p[99]))
