"""Serving metrics: per-request records → RunSummary (vLLM ``bench serve`` definitions), the
median over runs, the run-to-run spread and the latency distributions. Pure functions, no I/O
and no clock; summaries are :mod:`adaptcheck.base.schemas.serving_evidence` records.
Definitions and shapes: docs/perf.md, "RunSummary" and "Served lengths".
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import JsonValue

from adaptcheck.base.schemas.serving_evidence import LatencyStats, MeasuredRun, RunSummary, ServingLevel

STAT_KEYS = ("mean", "median", "std", "p50", "p90", "p95", "p99", "min", "max")
QUANTILES = tuple(range(0, 101, 5))
"""Percent points of the charted distributions (21 numbers, 0 and 100 included)."""
MAX_ERROR_KINDS = 10
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
SPREAD_METRICS = ("ttft_ms_median", "tpot_ms_median", "output_tok_per_s")
"""The headline metrics of a run (:func:`headline`): the spread's keys, the stability verdict's metrics."""


@dataclass
class RequestRecord:
    """One request as the load generator saw it (one JSON line of the records file).

    Times are seconds: ``scheduled_s`` and ``sent_s`` relative to the run's start,
    ``ttft_s`` and ``e2el_s`` relative to the send, ``itl_s`` the gaps between content
    chunks, ``chunk_tokens`` the tokens each content chunk carried (empty when unknown).
    """

    level: float
    run: int
    index: int
    warmup: bool
    scheduled_s: float
    sent_s: float | None = None
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    token_source: str | None = None
    """Where ``output_tokens`` comes from: usage | tokenizer | chunks (None on error)."""
    usage_tokens: int | None = None
    tokenizer_tokens: int | None = None
    """The client's own count: streamed token ids, else the local tokenizer on the text."""
    error: str | None = None
    finish_reason: str | None = None
    max_tokens: int | None = None
    """The output length asked for (fixed with ignore_eos)."""
    input_tokens_sent: int | None = None
    """The prompt's length as the client counted it before sending (local tokenizer or the
    server's ``/tokenize``); None when only approximate. ``input_tokens`` is what was served
    (usage), else this."""
    itl_basis: str | None = None
    """How ``itl_per_token`` counts the tokens of a chunk: token_ids | usage_mean | tokenizer | chunks."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None and self.e2el_s is not None

    def to_dict(self) -> dict[str, JsonValue]:
        """The record as one JSON line of the records file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# --------------------------------------------------------------------------------- numbers --

def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation, as ``numpy.percentile`` does by default."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats_ms(values_s: Sequence[float]) -> LatencyStats:
    """{mean, median, std, p50, p90, p95, p99, min, max} in milliseconds; all None for no values.

    ``std`` is the population standard deviation (``numpy.std``'s default, as vLLM reports).
    """
    if not values_s:
        return LatencyStats(mean=None, median=None, std=None, p50=None, p90=None, p95=None, p99=None, min=None,
                            max=None)
    ms = [v * 1000.0 for v in values_s]
    return LatencyStats(mean=statistics.fmean(ms), median=percentile(ms, 50), std=statistics.pstdev(ms),
                        p50=percentile(ms, 50), p90=percentile(ms, 90), p95=percentile(ms, 95),
                        p99=percentile(ms, 99), min=min(ms), max=max(ms))


def tpot_s(rec: RequestRecord) -> float | None:
    """(E2EL − TTFT) / (N − 1) for a completed request with N > 1 output tokens, else None."""
    n = rec.output_tokens
    if not rec.ok or n is None or n <= 1:
        return None
    assert rec.e2el_s is not None and rec.ttft_s is not None
    return (rec.e2el_s - rec.ttft_s) / (n - 1)


def itl_per_token_s(rec: RequestRecord) -> list[float]:
    """Each inter-chunk gap divided by the tokens carried by the chunk that ended it (see ``itl_basis``).

    ``usage_mean``: the chunk's tokens are the request's total over its chunk count. Only
    without any count (``chunks``) is every chunk one token (the per-chunk view).
    """
    if rec.itl_basis == "usage_mean" and rec.output_tokens:
        per_chunk = rec.output_tokens / (len(rec.itl_s) + 1)
        return [gap / per_chunk for gap in rec.itl_s]
    if len(rec.chunk_tokens) != len(rec.itl_s) + 1:
        return list(rec.itl_s)
    return [gap / max(1, n) for gap, n in zip(rec.itl_s, rec.chunk_tokens[1:], strict=True)]


def _one_or_mixed(values: set[str]) -> str | None:
    return values.pop() if len(values) == 1 else ("mixed" if values else None)


def meets_slo(rec: RequestRecord, slo: Mapping[str, float | None]) -> bool:
    """Every SLO given (ms) holds for a completed request; TPOT counts as 0 when N ≤ 1 (as vLLM)."""
    if not rec.ok:
        return False
    assert rec.ttft_s is not None and rec.e2el_s is not None
    measured = {"ttft_ms": rec.ttft_s * 1000.0, "tpot_ms": (tpot_s(rec) or 0.0) * 1000.0,
                "e2el_ms": rec.e2el_s * 1000.0}
    return all(measured[k] <= float(v) for k, v in slo.items() if v is not None)


def _active_slo(slo: Mapping[str, float | None] | None) -> dict[str, float]:
    if not slo:
        return {}
    unknown = set(slo) - set(SLO_KEYS)
    if unknown:
        raise ValueError(f"unknown SLO keys {sorted(unknown)}: use {', '.join(SLO_KEYS)}")
    return {k: float(v) for k, v in slo.items() if v is not None}


def _window(records: Sequence[RequestRecord]) -> float | None:
    """First send → last completion of the completed requests (when no duration is given)."""
    done = [r for r in records if r.ok and r.sent_s is not None]
    if not done:
        return None
    start = min(r.sent_s for r in done if r.sent_s is not None)
    end = max((r.sent_s or 0.0) + (r.e2el_s or 0.0) for r in done)
    return end - start


# ------------------------------------------------------------------------------ summaries --

def summarize_run(records: Iterable[RequestRecord], *, duration_s: float | None = None,
                  slo: Mapping[str, float | None] | None = None) -> RunSummary:
    """One measured run at one level → RunSummary (warm-up records are left out).

    ``duration_s``: the measured window (first send → last completion, failures
    included) as the load generator timed it; derived from the records when None.
    """
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    duration = duration_s if duration_s is not None else _window(measured)

    def rate(count: float) -> float | None:
        return count / duration if duration else None

    total_out = sum(r.output_tokens or 0 for r in done)
    errors = Counter(r.error or "no content in the answer" for r in failed)
    sources = {r.token_source for r in done if r.token_source}
    bases = {r.itl_basis for r in done if r.itl_basis and r.itl_s}
    chunks = sum(len(r.itl_s) + 1 for r in done)
    active_slo = _active_slo(slo)
    good = sum(1 for r in done if meets_slo(r, active_slo)) if active_slo else None
    return RunSummary(
        completed=len(done),
        failed=len(failed),
        error_rate=len(failed) / len(measured) if measured else None,
        errors=dict(errors.most_common(MAX_ERROR_KINDS)),
        duration_s=duration,
        request_throughput=rate(len(done)),
        output_throughput=rate(total_out),
        total_input_tokens=sum(r.input_tokens or 0 for r in done),
        total_output_tokens=total_out,
        token_source=_one_or_mixed(sources),
        token_mismatches=sum(1 for r in done if r.usage_tokens is not None and r.tokenizer_tokens is not None
                             and r.usage_tokens != r.tokenizer_tokens),
        ttft_ms=stats_ms([r.ttft_s for r in done if r.ttft_s is not None]),
        tpot_ms=stats_ms([t for t in (tpot_s(r) for r in done) if t is not None]),
        itl_ms=stats_ms([g for r in done for g in r.itl_s]),
        itl_per_token_ms=stats_ms([g for r in done for g in itl_per_token_s(r)]),
        itl_basis=_one_or_mixed(bases),
        e2el_ms=stats_ms([r.e2el_s for r in done if r.e2el_s is not None]),
        queue_ms=stats_ms([r.sent_s - r.scheduled_s for r in measured if r.sent_s is not None]),
        goodput=rate(good) if good is not None else None,
        slo_attainment=(good / len(done) if done else None) if good is not None else None,
        chunks_per_token=chunks / total_out if total_out else None,
    )


def _median(values: Sequence[JsonValue]) -> JsonValue:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, dict) for v in present):
        dicts = [v for v in present if isinstance(v, dict)]
        keys = list(dict.fromkeys(k for v in dicts for k in v))
        return {k: _median([v.get(k) for v in dicts]) for k in keys}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return statistics.median([v for v in present if isinstance(v, (int, float))])
    return present[0] if all(v == present[0] for v in present) else "mixed"


def median_summary(runs: Sequence[RunSummary]) -> RunSummary:
    """RunSummary-shaped: the median over the runs of every number (nested stats too).

    ``errors`` is the sum over the runs (the kinds seen, how often in all); text fields
    keep their value when the runs agree, else read "mixed". Taken over the runs' JSON form,
    so a field the runs share is taken the same way whatever its type.
    """
    if not runs:
        return RunSummary()
    stored = [r.dump() for r in runs]
    out = {k: _median([r.get(k) for r in stored]) for k in stored[0] if k != "errors"}
    errors: Counter[str] = Counter()
    for r in runs:
        errors.update({msg: int(n) for msg, n in r.errors.items()})
    out["errors"] = dict(errors.most_common(MAX_ERROR_KINDS))
    return RunSummary.model_validate({k: out[k] for k in stored[0]})


def headline(summary: RunSummary) -> dict[str, float | None]:
    """The headline metrics of a run (:data:`SPREAD_METRICS`): median TTFT, median TPOT, output tok/s."""
    return {"ttft_ms_median": summary.ttft_ms.median if summary.ttft_ms is not None else None,
            "tpot_ms_median": summary.tpot_ms.median if summary.tpot_ms is not None else None,
            "output_tok_per_s": summary.output_throughput}


def relative_spread(values: Sequence[float | None]) -> float | None:
    """(max − min) / median of the values present; None with fewer than two or a zero median."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    mid = statistics.median(present)
    return (max(present) - min(present)) / mid if mid else None


def spread(runs: Sequence[RunSummary]) -> dict[str, float | None]:
    """Run-to-run spread of the median TTFT, median TPOT and output tok/s: (max − min) / median."""
    values = [headline(r) for r in runs]
    return {key: relative_spread([v[key] for v in values]) for key in SPREAD_METRICS}


def distributions(records: Iterable[RequestRecord]) -> dict[str, list[float] | None]:
    """Quantiles 0, 5, …, 100 % (ms) of TTFT, TPOT, per-chunk ITL and E2EL, pooled over the runs given."""
    done = [r for r in records if not r.warmup and r.ok]
    values = {
        "ttft_ms": [r.ttft_s for r in done if r.ttft_s is not None],
        "tpot_ms": [t for t in (tpot_s(r) for r in done) if t is not None],
        "itl_ms": [g for r in done for g in r.itl_s],
        "e2el_ms": [r.e2el_s for r in done if r.e2el_s is not None],
    }
    return {k: [percentile(v, q) * 1000.0 for q in QUANTILES] if v else [] for k, v in values.items()}


def level_summary(level: float, runs: Sequence[tuple[Sequence[RequestRecord], float | None]], *,
                  slo: Mapping[str, float | None] | None = None) -> ServingLevel:
    """One level's entry of the outcome: every run's RunSummary, their median, spread and distributions.

    ``runs``: (records, measured duration) per repeat.
    """
    summaries = [summarize_run(records, duration_s=duration, slo=slo) for records, duration in runs]
    return ServingLevel(level=level, runs=[MeasuredRun.model_validate(s, from_attributes=True) for s in summaries],
                        median=median_summary(summaries), spread=spread(summaries),
                        distributions=distributions([r for records, _ in runs for r in records]))
