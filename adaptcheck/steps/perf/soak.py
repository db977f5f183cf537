"""Check kind ``perf.soak``: serve mixed traffic for a while, watch telemetry the whole time (L5).

The check takes the server step 4 loaded (same load options; ``framework: auto`` as for
``perf.serving``), drives it for ``duration_s`` with mixed request lengths through
:mod:`adaptcheck.perf.loadgen` (a closed loop of ``level`` requests in flight, or Poisson
arrivals at ``level`` req/s), and meanwhile samples, every ``sample_interval_s``, the
server's process-tree RSS, host CPU utilisation and frequency, and the backend's device
telemetry (:mod:`adaptcheck.perf.telemetry`). Every request is written to
``<run_dir>/perf/soak/<check id>.jsonl``.

Status (docs/perf.md, "Soak"): ``pass`` only when no request failed (``max_error_rate``,
default 0) and the least-squares memory trend after ``warmup_s``
(:func:`adaptcheck.perf.trend.memory_growth_verdict`) is significantly within
``max_growth_mib_per_min`` (the upper confidence bound of the slope at most the bound) for
every memory series sampled — server RSS, and device memory used on an accelerator (on the
CPU backend the "device" memory is the whole host's, moved by every process: it is shown,
not bounded) — and no uncorrectable-error counter of the device rose. ``fail`` names the
series, its slope, interval and the bound (its lower confidence bound above the bound), or
the errors. ``error`` when a slope's interval straddles the bound ("inconclusive: run
longer", with the duration that would decide): the soak measured, but too briefly to say,
which is neither a pass nor a fault of the server — and, unlike a skip, shows as an error
in CI (JUnit) and blocks L5. ``skip`` when there is no server to soak, or when no memory
series could be sampled: a soak without memory evidence is not a pass, and the skip stays
*applicable* (L5 still lacks its soak). ``error`` also when no request completed at all.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.models.results import Status
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig, RunResult
from adaptcheck.perf.monitors import local_server_pid
from adaptcheck.perf.telemetry import Telemetry, TelemetrySampler
from adaptcheck.perf.trend import MIN_SAMPLES, GrowthVerdict, memory_growth_verdict
from adaptcheck.perf.workload import PromptFactory, Shape, Workload
from adaptcheck.steps.framework.lifecycle import (
    Active,
    framework_facts,
)
from adaptcheck.steps.perf.serving import (
    MixedShape,
    ServerParams,
    run_served,
    served_tokenizer,
)

DEFAULT_MIX = [MixedShape(input_tokens=32, output_tokens=32, weight=2),
               MixedShape(input_tokens=256, output_tokens=64, weight=1),
               MixedShape(input_tokens=512, output_tokens=16, weight=1)]
ERROR_COUNTERS = ("ecc_volatile_uncorrectable",)
"""Device counters that must not rise during a soak (a rise is a hardware error under load)."""
SERIES_LABELS = {"server_rss_mib": "server RSS", "memory_used_mib": "device memory used"}


class SoakParams(ServerParams):
    """``perf.soak``: a stability run under mixed load with telemetry."""

    duration_s: float = Field(default=300.0, gt=0, description="How long requests keep starting (they are then "
                              "waited for).")
    arrival: Literal["concurrency", "poisson"] = Field(default="concurrency", description="concurrency: keep "
                                                       "`level` requests in flight; poisson: `level` req/s.")
    level: float = Field(default=2, gt=0, description="Requests in flight (concurrency) or rate in req/s (poisson).")
    mixed: list[MixedShape] = Field(default_factory=lambda: list(DEFAULT_MIX), min_length=1,
                                    description="Request shapes, interleaved in proportion to their weights.")
    sample_interval_s: float = Field(default=1.0, gt=0, description="Seconds between telemetry samples.")
    warmup_s: float = Field(default=30.0, ge=0, description="First seconds left out of the memory trend (first "
                            "allocations, caches filling).")
    max_growth_mib_per_min: float = Field(default=10.0, ge=0, description="Largest fitted memory growth (MiB per "
                                          "minute) of server RSS and of device memory used.")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="One-sided confidence of each bound of the "
                              "fitted slope: the lower bound above max_growth_mib_per_min fails, the upper bound "
                              "within it passes, an interval across it is inconclusive (an error: run longer).")
    max_error_rate: float = Field(default=0.0, ge=0, le=1, description="Largest fraction of failed requests "
                                  "(default 0: none may fail).")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Longest one request may take.")

    @model_validator(mode="after")
    def _consistent(self) -> SoakParams:
        if self.arrival == "concurrency":
            if self.level != int(self.level):
                raise ValueError("a concurrency level is a whole number of requests")
            self.level = int(self.level)
        left = self.duration_s - self.warmup_s
        if left < MIN_SAMPLES * self.sample_interval_s:
            raise ValueError(f"duration_s - warmup_s ({left:g} s) must leave at least {MIN_SAMPLES} samples of "
                             f"sample_interval_s ({self.sample_interval_s:g} s) for the memory trend")
        return self

    def shapes(self) -> list[Shape]:
        return [Shape(m.input_tokens, m.output_tokens, m.weight) for m in self.mixed]


class SoakCheck(Check):
    """A stability soak: zero request errors and no memory growth under sustained mixed load."""

    kind = "perf.soak"
    step = 5
    description = ("Stability soak: mixed traffic for duration_s with device/host telemetry sampled throughout; "
                   "no request errors and no fitted memory growth beyond the bound.")
    params_model = SoakParams

    def run(self, ctx: CheckContext, params: SoakParams) -> Outcome:
        outcome = run_served(ctx, params, self.kind, _soak, no_endpoint_applicable=True)
        if outcome.status == Status.SKIP:
            # No server is "the soak was not done", not "this backend cannot have one": L5 stays blocked.
            outcome = outcome.model_copy(update={"applicable": True})
        return outcome


def _on_this_host(url: str) -> bool:
    host = (urlsplit(url if "://" in url else "http://" + url).hostname or "").lower()
    return host == "localhost" or host.startswith("127.") or host == "::1"


def _server_process(fw: Any, url: str) -> tuple[int | None, str | None]:
    pid = getattr(getattr(fw, "server", None), "pid", None)
    if pid:
        return int(pid), "launched by adaptcheck"
    pid = local_server_pid(url)
    return (pid, "listening on the endpoint's port") if pid else (None, None)


def _soak(ctx: CheckContext, active: Active, params: SoakParams) -> Outcome:
    fw: Any = active.framework
    url = getattr(fw, "url", None)
    if not url:
        return Outcome.skipped(f"{active.name} serves no HTTP endpoint: perf.soak drives vllm_serve, "
                               "transformers_serve or endpoint")
    tokenizer = served_tokenizer(active)
    name = ctx.check_id or "perf.soak"
    workload = Workload(params.shapes(), PromptFactory(tokenizer), seed=ctx.seed_for(name))
    client = getattr(fw, "client", None)
    gen = LoadGenerator(url, workload, model=getattr(client, "model", None), tokenizer=tokenizer,
                        rejected_fields=set(getattr(client, "rejected_fields", set())))
    pid, found_by = _server_process(fw, url)
    local = pid is not None or getattr(fw, "server", None) is not None or _on_this_host(url)
    cfg = RunConfig(arrival=params.arrival, level=params.level, duration_s=params.duration_s,
                    warmup_requests=max(1, int(params.level)) if params.arrival == "concurrency" else 1,
                    request_timeout_s=params.request_timeout_s, arrival_seed=ctx.seed_for(f"{name}:arrival"))
    rel = Path("perf") / "soak" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.jsonl"
    path = ctx.run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    sampler = TelemetrySampler(params.sample_interval_s, pid=pid, backend=ctx.backend if local else None,
                               device_index=ctx.device_index).start()
    try:
        # Elapsed against duration_s, live in the progress bar (requests still in flight are then waited for).
        with ctx.timed_progress(params.duration_s, note="soak"):
            result = gen.run(cfg, level_index=0, run=0)
    finally:
        telemetry = sampler.stop()
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(rec.to_dict()) + "\n" for rec in result.records)
    memory = _memory(telemetry, params, accelerator=ctx.backend.is_accelerator)
    details: dict[str, Any] = {
        "soak": {"duration_s": params.duration_s, "arrival": params.arrival, "level": params.level,
                 "mixed": [m.model_dump() for m in params.mixed], "sample_interval_s": params.sample_interval_s,
                 "warmup_s": params.warmup_s, "max_growth_mib_per_min": params.max_growth_mib_per_min,
                 "confidence": params.confidence,
                 "max_error_rate": params.max_error_rate, "request_timeout_s": params.request_timeout_s},
        "server": framework_facts(active),
        "server_process": {"pid": pid, "found_by": found_by, "on_this_host": local},
        "requests": _requests(result),
        "records_file": rel.as_posix(),
        "telemetry": telemetry.to_dict(),
        "memory": memory,
        "counters": _counters(telemetry),
        "kv_cache_peak": result.kv_cache_peak,
    }
    return soak_verdict(params, details)


def _requests(result: RunResult) -> dict[str, Any]:
    """The measured window's RunSummary, plus the warm-up requests' failures (every request counts)."""
    summary = result.summary()
    warm = [r for r in result.records if r.warmup]
    summary["warmup_requests"] = len(warm)
    summary["warmup_failed"] = sum(1 for r in warm if not r.ok)
    summary["aborted"] = result.aborted
    return summary


def _memory(telemetry: Telemetry, params: SoakParams, *, accelerator: bool) -> list[dict[str, Any]]:
    """One entry per memory series sampled: its fit and verdict, or why it is not bounded."""
    out: list[dict[str, Any]] = []
    sources = [("host", telemetry.host, "server_rss_mib", True)]
    if telemetry.device is not None:
        # CPU backend: "device" memory is the whole host's, moved by every process on it.
        sources.append(("device", telemetry.device, "memory_used_mib", accelerator))
    for source, series, key, bounded in sources:
        values = series.fields.get(key)
        if not values or all(v is None for v in values):
            continue
        verdict = memory_growth_verdict(zip(series.t_s, values, strict=True), params.max_growth_mib_per_min,
                                        warmup_s=params.warmup_s, confidence=params.confidence)
        entry: dict[str, Any] = {"series": key, "source": source,
                                 "label": SERIES_LABELS[key] if bounded else "host memory used (whole machine)",
                                 "bounded": bounded, **verdict.to_dict()}
        if not bounded:
            entry["ok"] = None
            entry["state"] = "not bounded"
            entry["reason"] = f"not bounded (every process on the host moves it): {_trend_text(verdict)}"
        out.append(entry)
    return out


def _trend_text(verdict: GrowthVerdict) -> str:
    fit = verdict.fit
    return f"{fit.slope_mib_per_min:+.4g} MiB/min" if fit is not None else verdict.reason


def _counters(telemetry: Telemetry) -> list[dict[str, Any]]:
    """Error counters of the device: first and last reading, and whether they rose."""
    out = []
    fields = telemetry.device.fields if telemetry.device is not None else {}
    for key in ERROR_COUNTERS:
        seen = [v for v in fields.get(key, []) if v is not None]
        if seen:
            out.append({"counter": key, "first": seen[0], "last": seen[-1], "rose": max(seen) > seen[0]})
    return out


def soak_verdict(params: SoakParams, details: dict[str, Any]) -> Outcome:
    """The outcome of a soak from its ``details`` (the docs/perf.md shape): pass, fail naming
    what broke, error when a memory trend is inconclusive or nothing was served, skip when
    memory growth could not be judged."""
    req = details["requests"]
    aborted = req.get("aborted")
    failed = int(req["failed"]) + int(req["warmup_failed"])
    total = int(req["completed"]) + int(req["failed"]) + int(req["warmup_requests"])
    done = int(req["completed"]) + int(req["warmup_requests"]) - int(req["warmup_failed"])
    metrics = _metrics(details, failed, total)
    if done == 0:
        why = aborted or next(iter(req["errors"]), "no request completed")
        return Outcome.errored(f"soak: nothing served: {why}", details=details, metrics=metrics)
    problems: list[str] = []
    if aborted:
        problems.append(f"stopped early: {aborted}")
    if total and failed / total > params.max_error_rate:
        top = next(iter(req["errors"]), "")
        problems.append(f"{failed} of {total} requests failed (bound {params.max_error_rate:.0%})"
                        + (f": {top}" if top else ""))
    judged = [m for m in details["memory"] if m["bounded"] and m["ok"] is not None]
    problems += [f"{m['label']} ({m['series']}) {m['reason']}" for m in judged if m["ok"] is False]
    problems += [f"device counter {c['counter']} rose from {c['first']:g} to {c['last']:g}"
                 for c in details["counters"] if c["rose"]]
    head = f"soak {params.duration_s:g} s, {total} requests"
    if problems:
        return Outcome.failed(f"{head}: " + "; ".join(problems), details=details, metrics=metrics)
    # Too short to tell a leak from noise or warm-up: an error (never a pass), saying how long would do.
    undecided = [m for m in details["memory"] if m["bounded"] and m.get("state") == "inconclusive"]
    if undecided:
        return Outcome.errored(f"{head}, 0 errors, but memory growth inconclusive: "
                               + "; ".join(f"{m['label']} ({m['series']}) {m['reason']}" for m in undecided),
                               details=details, metrics=metrics)
    if not judged:
        why = [m["reason"] for m in details["memory"] if m["bounded"]] or [
            "no memory series could be sampled (the server is not on this machine and no device reports memory)"]
        return Outcome.skipped(f"{head}, no errors, but memory growth not judged: {why[0]}", details=details,
                               metrics=metrics)
    growth = "; ".join(f"{m['label']} {m['reason']}" for m in judged)
    return Outcome.passed(f"{head}, 0 errors; {growth}", details=details, metrics=metrics)


def _metrics(details: dict[str, Any], failed: int, total: int) -> dict[str, Any]:
    req = details["requests"]
    out: dict[str, Any] = {"requests": total, "failed_requests": failed,
                           "error_rate": failed / total if total else None,
                           "output_tok_per_s": req["output_throughput"], "ttft_ms_p99": req["ttft_ms"]["p99"]}
    for m in details["memory"]:
        fit = m["fit"] or {}
        prefix = "server_rss" if m["series"] == "server_rss_mib" else f"{m['source']}_memory"
        out[f"{prefix}_slope_mib_per_min"] = fit.get("slope_mib_per_min")
        out[f"{prefix}_r2"] = fit.get("r2")
        bounds = m.get("slope_bounds_mib_per_min") or [None, None]
        out[f"{prefix}_slope_lo_mib_per_min"], out[f"{prefix}_slope_hi_mib_per_min"] = bounds
    return out
