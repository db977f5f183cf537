"""Check kind ``perf.soak`` (L5): serve mixed traffic to the step-4 server while telemetry is
sampled, look at the memory trends at the rule's looks until they are decided or the budget is
spent, and judge errors, memory growth and device error counters; the details are a
:class:`~adaptcheck.base.schemas.serving_evidence.SoakEvidence`. Method, status policy and
shapes: docs/perf.md, "Soak outcome" and "A soak that decides".
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

from pydantic import Field, model_validator

from adaptcheck.base.schemas.results import Status
from adaptcheck.base.schemas.serving_evidence import (
    CounterRise,
    MemoryTrend,
    MixedShapeEcho,
    ServerProcess,
    SoakDecision,
    SoakEcho,
    SoakEvidence,
    SoakLook,
    SoakRequests,
)
from adaptcheck.frameworks.endpoint_fw import ServedEndpoint, served_endpoint
from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.perf.arrival import TIMED, Arrival
from adaptcheck.perf.arrival import describe as describe_arrivals
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig, RunResult
from adaptcheck.perf.monitors import local_server_pid
from adaptcheck.perf.telemetry import Telemetry, TelemetrySampler
from adaptcheck.perf.trend import MIN_SAMPLES, GrowthVerdict, SequentialRule, settled
from adaptcheck.perf.workload import PromptFactory, Shape, Workload
from adaptcheck.steps.frameworks.lifecycle import (
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

    duration_s: float = Field(default=300.0, gt=0, description="Shortest soak (s): the memory trends are first "
                              "judged then; with max_duration_s the soak goes on while one is undecided. Requests in "
                              "flight when it stops are waited for.")
    max_duration_s: float | None = Field(default=None, gt=0, description="Longest soak (s), the budget: while a "
                                         "memory trend's interval straddles the bound the soak goes on, judged at "
                                         "`looks` times from duration_s to this; undecided here is an error "
                                         "(inconclusive). Default: duration_s (one look).")
    looks: int = Field(default=4, ge=1, le=100, description="Looks at the memory trends, evenly spaced from "
                       "duration_s to max_duration_s (one when they are equal); each look's bounds are at the "
                       "confidence 1 - (1 - confidence)/looks (Bonferroni), docs/perf.md, Soak.")
    # Any pattern a run of a duration can use: the validator below refuses the others (a burst
    # is one wave, not a load held for a while) with why.
    arrival: Arrival = Field(default=Arrival.CONCURRENCY, description=describe_arrivals(TIMED))
    level: float = Field(default=2, gt=0, description="Requests in flight (concurrency) or rate in req/s (poisson).")
    mixed: list[MixedShape] = Field(default_factory=lambda: list(DEFAULT_MIX), min_length=1,
                                    description="Request shapes, interleaved in proportion to their weights.")
    sample_interval_s: float = Field(default=1.0, gt=0, description="Seconds between telemetry samples.")
    warmup_s: float = Field(default=30.0, ge=0, description="First seconds left out of the memory trend (first "
                            "allocations, caches filling).")
    max_growth_mib_per_min: float = Field(default=10.0, ge=0, description="Largest fitted memory growth (MiB per "
                                          "minute) of server RSS and of device memory used.")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="One-sided confidence of each bound of the "
                              "fitted slope over all looks: the lower bound above max_growth_mib_per_min fails, the "
                              "upper bound within it passes, an interval across it at the last look is inconclusive "
                              "(an error: run longer).")
    max_error_rate: float = Field(default=0.0, ge=0, le=1, description="Largest fraction of failed requests "
                                  "(default 0: none may fail).")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Longest one request may take.")

    @model_validator(mode="after")
    def _consistent(self) -> SoakParams:
        if not self.arrival.timed:
            raise ValueError(f"a soak holds a load for a duration: arrival {self.arrival} is not one "
                             f"({', '.join(TIMED)} are)")
        if not self.arrival.open_loop:  # an open loop's level is a rate; the others count requests
            if self.level != int(self.level):
                raise ValueError(f"a {self.arrival} level is a whole number of requests")
            self.level = int(self.level)
        left = self.duration_s - self.warmup_s
        if left < MIN_SAMPLES * self.sample_interval_s:
            raise ValueError(f"duration_s - warmup_s ({left:g} s) must leave at least {MIN_SAMPLES} samples of "
                             f"sample_interval_s ({self.sample_interval_s:g} s) for the memory trend")
        if self.max_duration_s is not None and self.max_duration_s < self.duration_s:
            raise ValueError(f"max_duration_s ({self.max_duration_s:g} s) must be ≥ duration_s "
                             f"({self.duration_s:g} s): it is the budget the soak may extend to")
        return self

    @property
    def budget_s(self) -> float:
        """The longest the soak may run (max_duration_s, else duration_s)."""
        return self.max_duration_s if self.max_duration_s is not None else self.duration_s

    def rule(self) -> SequentialRule:
        return SequentialRule(bound_mib_per_min=self.max_growth_mib_per_min, first_s=self.duration_s,
                              last_s=self.budget_s, looks=self.looks if self.budget_s > self.duration_s else 1,
                              warmup_s=self.warmup_s, confidence=self.confidence)

    def shapes(self) -> list[Shape]:
        return [Shape(m.input_tokens, m.output_tokens, m.weight) for m in self.mixed]


class SoakCheck(Check):
    """A stability soak: zero request errors and no memory growth under sustained mixed load."""

    kind = "perf.soak"
    step = 5
    description = ("Stability soak: mixed traffic from duration_s until the memory trends are decided (at most "
                   "max_duration_s) with device/host telemetry sampled throughout; no request errors and no fitted "
                   "memory growth beyond the bound.")
    params_model = SoakParams

    def run(self, ctx: CheckContext, params: SoakParams) -> Outcome:
        outcome = run_served(ctx, params, self.kind, _soak, no_endpoint_applicable=True)
        if outcome.status == Status.SKIP:
            # No server is "the soak was not done", not "this backend cannot have one": L5 stays blocked.
            outcome = outcome.model_copy(update={"applicable": True})
        return outcome


def _server_process(endpoint: ServedEndpoint) -> tuple[int | None, str | None]:
    if endpoint.launched_pid:
        return endpoint.launched_pid, "launched by adaptcheck"
    pid = local_server_pid(endpoint.url)
    return (pid, "listening on the endpoint's port") if pid else (None, None)


def _soak(ctx: CheckContext, active: Active, params: SoakParams) -> Outcome:
    endpoint = served_endpoint(active.framework)
    if endpoint is None:
        return Outcome.skipped(f"{active.name} serves no HTTP endpoint: perf.soak drives vllm_serve, "
                               "transformers_serve or endpoint")
    url = endpoint.url
    tokenizer = served_tokenizer(active)
    name = ctx.check_id or "perf.soak"
    workload = Workload(params.shapes(), PromptFactory(tokenizer), seed=ctx.seed_for(name))
    gen = LoadGenerator(url, workload, model=endpoint.model, tokenizer=tokenizer,
                        rejected_fields=set(endpoint.rejected_fields))
    pid, found_by = _server_process(endpoint)
    local = pid is not None or endpoint.on_this_host
    # The window's own duration is only a backstop: the looks (on the sampler's clock, which
    # starts before the warm-up requests) stop the load at the last look at the latest.
    cfg = RunConfig(arrival=params.arrival, level=params.level, duration_s=params.budget_s,
                    warmup_requests=max(1, int(params.level)) if params.arrival.closed_loop else 1,
                    request_timeout_s=params.request_timeout_s, arrival_seed=ctx.seed_for(f"{name}:arrival"))
    rel = Path("perf") / "soak" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.jsonl"
    path = ctx.run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    accelerator = ctx.backend.is_accelerator
    sampler = TelemetrySampler(params.sample_interval_s, pid=pid, backend=ctx.backend if local else None,
                               device_index=ctx.device_index).start()
    looker = Looker(sampler, params, accelerator=accelerator).start()
    started = time.monotonic()
    try:
        # Elapsed against the budget, live in the progress bar (it usually stops sooner).
        with ctx.timed_progress(params.budget_s, note="soak"):
            result = gen.run(cfg, level_index=0, run=0, stop=looker.stop_load)
    finally:
        looker.close()
        ran_s = time.monotonic() - started
        telemetry = sampler.stop()
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(rec.to_dict()) + "\n" for rec in result.records)
    decision, memory = looker.decision(telemetry, ran_s=ran_s, aborted=result.aborted)
    details = SoakEvidence(
        soak=SoakEcho(duration_s=params.duration_s, max_duration_s=params.budget_s, looks=len(params.rule().times()),
                      arrival=params.arrival.value, level=params.level,
                      mixed=[MixedShapeEcho(input_tokens=m.input_tokens, output_tokens=m.output_tokens,
                                            weight=m.weight) for m in params.mixed],
                      sample_interval_s=params.sample_interval_s, warmup_s=params.warmup_s,
                      max_growth_mib_per_min=params.max_growth_mib_per_min, confidence=params.confidence,
                      max_error_rate=params.max_error_rate, request_timeout_s=params.request_timeout_s),
        server=framework_facts(active),
        server_process=ServerProcess(pid=pid, found_by=found_by, on_this_host=local),
        requests=_requests(result),
        records_file=rel.as_posix(),
        telemetry=telemetry.evidence(),
        memory=memory,
        decision=decision,
        counters=_counters(telemetry),
        kv_cache_peak=result.kv_cache_peak,
    )
    return soak_verdict(params, details)


LOOK_SETTLE_S = 0.25
"""A look waits this long (at most half a sample interval) past its time, so that the sample due then is in."""


class Looker:
    """Judges the memory trends at the rule's looks while the load runs, and stops the load
    (:attr:`stop_load`) at the first look that settles them, or at the last.

    A thread of its own: a fit over a few hundred samples takes milliseconds, which the load
    generator's event loop (in the caller's thread) must not spend. Each look's memory
    entries are kept; the stopping look's are the verdict.
    """

    def __init__(self, sampler: TelemetrySampler, params: SoakParams, *, accelerator: bool) -> None:
        self.sampler = sampler
        self.params = params
        self.rule = params.rule()
        self.accelerator = accelerator
        self.stop_load = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adaptcheck-soak-looks", daemon=True)
        self.looks: list[SoakLook] = []
        self.memory: list[MemoryTrend] | None = None
        """The memory entries of the latest look."""
        self.stop: str | None = None
        """decided | budget | nothing to judge (no bounded series could be judged), once a look stopped the load."""
        self.error: str | None = None

    def start(self) -> Looker:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        times = self.rule.times()
        settle = min(LOOK_SETTLE_S, self.params.sample_interval_s / 2)
        try:
            for i, at in enumerate(times):
                if self._closed.wait(max(0.0, at + settle - self.sampler.elapsed_s)):
                    return  # the load ended before this look
                memory = _memory(self.sampler.snapshot(), self.params, accelerator=self.accelerator, until_s=at)
                states = {str(m.series): str(m.state) for m in memory}
                self.looks.append(SoakLook(at_s=round(at, 3), states=states))
                self.memory = memory
                bounded = [str(m.state) for m in memory if m.bounded]
                if settled(bounded) or i == len(times) - 1:
                    self.stop = ("budget" if not settled(bounded) else "decided"
                                 if {"within", "over"} & set(bounded) else "nothing to judge")
                    self.stop_load.set()
                    return
        except Exception as exc:  # noqa: BLE001 - a broken look must not leave the load running to its backstop
            self.error = f"{type(exc).__name__}: {exc}"
            self.stop_load.set()

    def decision(self, telemetry: Telemetry, *, ran_s: float, aborted: str | None
                 ) -> tuple[SoakDecision, list[MemoryTrend]]:
        """``details.decision``, and the verdict's ``memory`` entries (those of the stopping look)."""
        times = self.rule.times()
        looks_at_s = [round(t, 3) for t in times]
        confidence = round(self.rule.per_look_confidence, 6)
        if self.memory is not None and self.stop is not None:
            at = self.looks[-1].at_s or 0.0
            why = {"decided": f"decided at {at:.4g} s, look {len(self.looks)} of {len(times)}",
                   "budget": f"budget of {self.rule.last_s:.4g} s spent, undecided at its last look",
                   "nothing to judge": f"stopped at {at:.4g} s: no memory trend to judge"}[self.stop]
            return SoakDecision(looks_at_s=looks_at_s, look_confidence=confidence, looks=list(self.looks),
                                ran_s=round(ran_s, 2), stop=self.stop, stopped_at_s=at, why=why), self.memory
        # The load ended before the looks did (the server stopped answering, or a look broke):
        # the last look taken stands, else one on every sample there is.
        why = aborted or self.error or "the load ended early"
        stopped_at: float | None
        if self.memory is not None:
            stopped_at = self.looks[-1].at_s
            memory = self.memory
        else:
            stopped_at = None
            memory = _memory(telemetry, self.params, accelerator=self.accelerator)
        return SoakDecision(looks_at_s=looks_at_s, look_confidence=confidence, looks=list(self.looks),
                            ran_s=round(ran_s, 2), stop="load ended", stopped_at_s=stopped_at,
                            why=f"the load ended before the looks were done ({why})"), memory


def _requests(result: RunResult) -> SoakRequests:
    """The measured window's RunSummary, plus the warm-up requests' failures (every request counts)."""
    warm = [r for r in result.records if r.warmup]
    return SoakRequests.model_validate(result.run_summary(), from_attributes=True).model_copy(update={
        "warmup_requests": len(warm), "warmup_failed": sum(1 for r in warm if not r.ok), "aborted": result.aborted})


def _memory(telemetry: Telemetry, params: SoakParams, *, accelerator: bool,
            until_s: float | None = None) -> list[MemoryTrend]:
    """One entry per memory series sampled: its fit and verdict at a look (the samples up to
    ``until_s``; None: all of them), at the rule's per-look confidence, or why it is not bounded."""
    rule = params.rule()
    at = until_s if until_s is not None else float("inf")
    out: list[MemoryTrend] = []
    sources = [("host", telemetry.host, "server_rss_mib", True)]
    if telemetry.device is not None:
        # CPU backend: "device" memory is the whole host's, moved by every process on it.
        sources.append(("device", telemetry.device, "memory_used_mib", accelerator))
    for source, series, key, bounded in sources:
        values = series.fields.get(key)
        if not values or all(v is None for v in values):
            continue
        verdict = rule.judge(zip(series.t_s, values, strict=True), at)
        entry = verdict.evidence(series=key, source=source, bounded=bounded,
                                 label=SERIES_LABELS[key] if bounded else "host memory used (whole machine)")
        if not bounded:
            entry.ok, entry.state = None, "not bounded"
            entry.reason = f"not bounded (every process on the host moves it): {_trend_text(verdict)}"
        out.append(entry)
    return out


def _trend_text(verdict: GrowthVerdict) -> str:
    fit = verdict.fit
    return f"{fit.slope_mib_per_min:+.4g} MiB/min" if fit is not None else verdict.reason


def _counters(telemetry: Telemetry) -> list[CounterRise]:
    """Error counters of the device: first and last reading, and whether they rose."""
    out = []
    fields = telemetry.device.fields if telemetry.device is not None else {}
    for key in ERROR_COUNTERS:
        seen = [v for v in fields.get(key, []) if v is not None]
        if seen:
            out.append(CounterRise(counter=key, first=seen[0], last=seen[-1], rose=max(seen) > seen[0]))
    return out


def soak_verdict(params: SoakParams, details: SoakEvidence) -> Outcome:
    """The outcome of a soak from its ``details`` (the docs/perf.md shape): pass, fail naming
    what broke, error when a memory trend is inconclusive or nothing was served, skip when
    memory growth could not be judged."""
    req = details.requests or SoakRequests()
    aborted = req.aborted
    completed, failed_window = int(req.completed or 0), int(req.failed or 0)
    warm, warm_failed = int(req.warmup_requests or 0), int(req.warmup_failed or 0)
    failed = failed_window + warm_failed
    total = completed + failed_window + warm
    done = completed + warm - warm_failed
    metrics = _metrics(details, failed, total)
    stored = details.dump()
    if done == 0:
        why = aborted or next(iter(req.errors), "no request completed")
        return Outcome.errored(f"soak: nothing served: {why}", details=stored, metrics=metrics)
    problems: list[str] = []
    if aborted:
        problems.append(f"stopped early: {aborted}")
    if total and failed / total > params.max_error_rate:
        top = next(iter(req.errors), "")
        problems.append(f"{failed} of {total} requests failed (bound {params.max_error_rate:.0%})"
                        + (f": {top}" if top else ""))
    judged = [m for m in details.memory if m.bounded and m.ok is not None]
    problems += [f"{m.label} ({m.series}) {m.reason}" for m in judged if m.ok is False]
    problems += [f"device counter {c.counter} rose from {c.first:g} to {c.last:g}" for c in details.counters if c.rose]
    head = f"soak {_ran(params, details.decision)}, {total} requests"
    if problems:
        return Outcome.failed(f"{head}: " + "; ".join(problems), details=stored, metrics=metrics)
    # Too short to tell a leak from noise or warm-up: an error (never a pass), saying how long would do.
    undecided = [m for m in details.memory if m.bounded and m.state == "inconclusive"]
    if undecided:
        return Outcome.errored(f"{head}, 0 errors, but memory growth inconclusive: "
                               + "; ".join(f"{m.label} ({m.series}) {m.reason}" for m in undecided),
                               details=stored, metrics=metrics)
    if not judged:
        reasons = [str(m.reason) for m in details.memory if m.bounded] or [
            "no memory series could be sampled (the server is not on this machine and no device reports memory)"]
        return Outcome.skipped(f"{head}, no errors, but memory growth not judged: {reasons[0]}", details=stored,
                               metrics=metrics)
    growth = "; ".join(f"{m.label} {m.reason}" for m in judged)
    return Outcome.passed(f"{head}, 0 errors; {growth}", details=stored, metrics=metrics)


def _ran(params: SoakParams, decision: SoakDecision | None) -> str:
    """'41 s (decided at 40 s, look 2 of 4)', or the planned duration for details without a decision."""
    if decision is None or decision.ran_s is None:
        return f"{params.duration_s:g} s"
    return f"{decision.ran_s:.0f} s ({decision.why or decision.stop})"


def _metrics(details: SoakEvidence, failed: int, total: int) -> dict[str, float | int | None]:
    req = details.requests or SoakRequests()
    decision = details.decision
    out: dict[str, float | int | None] = {
        "requests": total, "failed_requests": failed, "soak_s": decision.ran_s if decision is not None else None,
        "error_rate": failed / total if total else None, "output_tok_per_s": req.output_throughput,
        "ttft_ms_p99": req.ttft_ms.p99 if req.ttft_ms is not None else None}
    for m in details.memory:
        fit = m.fit
        prefix = "server_rss" if m.series == "server_rss_mib" else f"{m.source}_memory"
        out[f"{prefix}_slope_mib_per_min"] = fit.slope_mib_per_min if fit is not None else None
        out[f"{prefix}_r2"] = fit.r2 if fit is not None else None
        lo, hi = m.slope_bounds_mib_per_min if m.slope_bounds_mib_per_min else (None, None)
        out[f"{prefix}_slope_lo_mib_per_min"], out[f"{prefix}_slope_hi_mib_per_min"] = lo, hi
    return out
