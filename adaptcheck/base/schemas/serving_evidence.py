"""Typed evidence of the step-5 serving checks: ``perf.serving`` (a scenario) and ``perf.soak``.

The models mirror the ``details`` shapes of docs/perf.md ("Serving outcome", "Soak outcome"),
including the keys of older results (schema 1.1's ``repeats``/``max_spread``, soaks without a
decision), so every stored file still reads. Numbers that may be whole (counts, a level, a
median of counts) are ``int | float`` so that a stored ``4`` stays ``4``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from adaptcheck.base.schemas.evidence import Evidence

Number = int | float
"""A JSON number that may be whole (kept as written: 4 stays 4, 2.5 stays 2.5)."""

# ------------------------------------------------------------------------- perf.serving --


class LatencyStats(Evidence):
    """One latency's summary over a run's requests, in ms; every figure None when no request had it."""

    mean: float | None = Field(default=None, description="Arithmetic mean.")
    median: float | None = Field(default=None, description="50th percentile (linear interpolation).")
    std: float | None = Field(default=None, description="Population standard deviation.")
    p50: float | None = Field(default=None, description="50th percentile (the same as median).")
    p90: float | None = Field(default=None, description="90th percentile.")
    p95: float | None = Field(default=None, description="95th percentile.")
    p99: float | None = Field(default=None, description="99th percentile.")
    min: float | None = Field(default=None, description="Smallest value.")
    max: float | None = Field(default=None, description="Largest value.")

    def middle(self) -> float | None:
        """The median, or the p50 for a summary written without one."""
        return self.median if "median" in self.model_fields_set else self.p50


class RunSummary(Evidence):
    """A measured run's RunSummary (adaptcheck.perf.serving_metrics.summarize_run), or the
    median of several (a level's ``median``: each number the median over the runs)."""

    completed: Number | None = Field(default=None, description="Requests completed.")
    failed: Number | None = Field(default=None, description="Requests failed (error, timeout, empty answer).")
    error_rate: float | None = Field(default=None, description="failed / measured requests; None without any.")
    errors: dict[str, Number] = Field(default_factory=dict, description="Error message → count (the most "
                                      "frequent kinds).")
    duration_s: float | None = Field(default=None, description="Measured window: first send → last completion.")
    request_throughput: float | None = Field(default=None, description="Completed requests per second.")
    output_throughput: float | None = Field(default=None, description="Output tokens per second.")
    total_input_tokens: Number | None = Field(default=None, description="Prompt tokens of the completed requests.")
    total_output_tokens: Number | None = Field(default=None, description="Output tokens of the completed requests.")
    token_source: str | None = Field(default=None, description="Where output counts came from: usage | tokenizer | "
                                     "chunks | mixed.")
    token_mismatches: Number | None = Field(default=None, description="Requests whose usage and client counts differ.")
    ttft_ms: LatencyStats | None = Field(default=None, description="Time to first token.")
    tpot_ms: LatencyStats | None = Field(default=None, description="Time per output token after the first.")
    itl_ms: LatencyStats | None = Field(default=None, description="Inter-chunk latency.")
    itl_per_token_ms: LatencyStats | None = Field(default=None, description="Inter-token latency (per token).")
    itl_basis: str | None = Field(default=None, description="How per-token ITL counts tokens: token_ids | "
                                  "usage_mean | tokenizer | chunks | mixed.")
    e2el_ms: LatencyStats | None = Field(default=None, description="End-to-end latency.")
    queue_ms: LatencyStats | None = Field(default=None, description="Client queue time (actual − scheduled send).")
    goodput: float | None = Field(default=None, description="Requests meeting every SLO per second; None "
                                  "without SLOs.")
    slo_attainment: float | None = Field(default=None, description="Share of completed requests meeting every SLO.")
    chunks_per_token: float | None = Field(default=None, description="Content chunks per output token.")


class RunHost(Evidence):
    """What the host did during one run (adaptcheck.perf.hostnoise) and the host-speed reference."""

    wall_s: float | None = Field(default=None, description="Sampled window, s.")
    samples: int | None = Field(default=None, description="Host samples taken.")
    cpus: int | None = Field(default=None, description="CPUs of the machine.")
    steal_fraction: float | None = Field(default=None, description="Share of CPU time the hypervisor stole.")
    other_cores: float | None = Field(default=None, description="Cores used by other processes, on average.")
    own_cores: float | None = Field(default=None, description="Cores used by adaptcheck and the server.")
    mhz_min: float | None = Field(default=None, description="Lowest mean CPU clock seen, MHz.")
    mhz_max: float | None = Field(default=None, description="Highest mean CPU clock seen, MHz.")
    note: str | None = Field(default=None, description="Why figures are missing (not Linux, /proc unreadable).")
    speed_before_ms: float | None = Field(default=None, description="Host-speed reference before the run, ms.")
    speed_after_ms: float | None = Field(default=None, description="Host-speed reference after the run, ms.")
    speed_ms: float | None = Field(default=None, description="Geometric mean of the two; None: not run.")


class MeasuredRun(RunSummary):
    """One run of a level: its RunSummary, whether the host disturbed it, and the host's figures."""

    disturbed: str | None = Field(default=None, description="Why the host disturbed the run (left out and "
                                  "repeated); None for a run the statistics use.")
    host: RunHost | None = Field(default=None, description="The host's figures for the run.")


class HostAdjustedDispersion(Evidence):
    """The dispersion once the host's own speed is taken out (adaptcheck.perf.host_adjust)."""

    elasticity: float = Field(description="The metric's elasticity to the host-speed reference.")
    speed_cv: float = Field(description="Run-to-run CV of the reference itself at this level.")
    verdict: str = Field(description="stable | unstable | undecided, on the adjusted interval.")
    explained: bool = Field(description="Significant raw, not once adjusted: the host's, not the server's.")
    n: int = Field(description="Runs behind the estimate.")
    cv: float = Field(description="Coefficient of variation estimate, host-adjusted.")
    lo: float = Field(description="One-sided lower confidence bound of the CV.")
    hi: float = Field(description="One-sided upper confidence bound of the CV.")


class MetricStability(Evidence):
    """One headline metric's run-to-run verdict at a level (docs/perf.md, "Run-to-run stability")."""

    n: int | None = Field(default=None, description="Runs behind the estimate.")
    cv: float | None = Field(default=None, description="Coefficient of variation estimate.")
    lo: float | None = Field(default=None, description="One-sided lower confidence bound of the CV.")
    hi: float | None = Field(default=None, description="One-sided upper confidence bound of the CV.")
    verdict: str | None = Field(default=None, description="stable | unstable | undecided.")
    values: list[float] = Field(default_factory=list, description="The metric in each undisturbed run.")
    host_adjusted: HostAdjustedDispersion | None = Field(default=None, description="The host-adjusted dispersion.")
    explained_by_host: bool | None = Field(default=None, description="True where the host-adjusted verdict replaced "
                                           "a significant raw one.")
    judged: bool | None = Field(default=None, description="False: shown, not judged (open-loop TTFT, saturated "
                                "level); absent: judged.")
    why_not_judged: str | None = Field(default=None, description="Why the metric is shown but not judged.")

    @property
    def is_judged(self) -> bool:
        return self.judged is not False


class LevelStability(Evidence):
    """A level's run-to-run verdict (docs/perf.md, "Run-to-run stability")."""

    verdict: str | None = Field(default=None, description="stable | unstable | undecided.")
    decided: bool | None = Field(default=None, description="False: the interval straddles the bound.")
    runs: int | None = Field(default=None, description="Undisturbed runs the statistics use.")
    disturbed_runs: int | None = Field(default=None, description="Runs left out and repeated.")
    stop: str | None = Field(default=None, description="Why no further run: stable | unstable | max_runs | budget | "
                             "host_noise | stopped.")
    bound: float | None = Field(default=None, description="The scenario's max_cv.")
    confidence: float | None = Field(default=None, description="One-sided confidence of the intervals.")
    worst: str | None = Field(default=None, description="The metric that decided (or the least settled).")
    metrics: dict[str, MetricStability] = Field(default_factory=dict, description="Per headline metric.")


class DriftFigures(Evidence):
    """Per-request latency against its place in the run, pooled over the undisturbed runs."""

    n: int | None = Field(default=None, description="Points fitted.")
    drift: float | None = Field(default=None, description="exp(slope) − 1 from the start to the end of a run.")
    lo: float | None = Field(default=None, description="One-sided lower bound of the drift.")
    hi: float | None = Field(default=None, description="One-sided upper bound of the drift.")
    rho: float | None = Field(default=None, description="Lag-1 autocorrelation of the residuals.")
    runs: int = Field(default=1, description="Runs with a slope of their own.")
    run_drifts: list[float] = Field(default_factory=list, description="Each such run's own drift.")
    bound: float | None = Field(default=None, description="The scenario's max_drift.")
    significant: bool | None = Field(default=None, description="The lower bound is above the bound.")
    judged: bool | None = Field(default=None, description="False at a saturated level (shown, not judged).")


class Saturated(Evidence):
    """An open-loop level the server could not keep up with (its TTFT is queueing)."""

    offered_req_per_s: Number = Field(description="The level's offered rate.")
    served_req_per_s: float | None = Field(default=None, description="The median served rate.")
    reason: str = Field(description="One line, as the outcome's message quotes it.")


class ServingLevel(Evidence):
    """One level of a scenario: every run, their median, spread, distributions and verdicts."""

    level: Number | None = Field(default=None, description="Concurrency, batch size or rate (req/s).")
    runs: list[MeasuredRun] = Field(default_factory=list, description="Every run measured, in order.")
    median: RunSummary = Field(default_factory=lambda: RunSummary(), description="Median over the undisturbed runs.")
    spread: dict[str, float | None] = Field(default_factory=dict, description="(max − min) / median per headline "
                                            "metric (informative; the verdict of older results).")
    distributions: dict[str, list[float] | None] = Field(default_factory=dict, description="Quantiles 0, 5, …, "
                                                         "100 % (ms) per latency, pooled over the runs; [] or None: "
                                                         "no value.")
    stability: LevelStability | None = Field(default=None, description="The run-to-run verdict; None in results "
                                             "written before it.")
    drift: dict[str, DriftFigures | None] = Field(default_factory=dict, description="Per latency (ttft_ms, "
                                                  "tpot_ms); None: too few requests.")
    saturated: Saturated | None = Field(default=None, description="Set at a saturated open-loop level.")


class MixedShapeEcho(Evidence):
    """One request shape of a mixed-length load."""

    input_tokens: int | None = Field(default=None, description="Prompt length in tokens.")
    output_tokens: int | None = Field(default=None, description="Output length in tokens.")
    weight: Number = Field(default=1, description="Relative share of the requests (1 when not given).")


class HostLimitsEcho(Evidence):
    """What counts as a disturbed run."""

    max_other_cores: float = Field(description="Cores other processes may use during a run.")
    max_steal_fraction: float = Field(description="Share of CPU time the hypervisor may steal.")


class SloEcho(Evidence):
    """The scenario's SLOs (ms); a request is good when it meets every one given."""

    ttft_ms: float | None = Field(default=None, description="Largest time to first token.")
    tpot_ms: float | None = Field(default=None, description="Largest time per output token.")
    e2el_ms: float | None = Field(default=None, description="Largest end-to-end latency.")


class ScenarioEcho(Evidence):
    """The scenario's params, echoed (docs/perf.md, "Serving outcome")."""

    name: str | None = Field(default=None, description="Scenario name.")
    arrival: str | None = Field(default=None, description="burst | concurrency | poisson.")
    levels: list[Number] | None = Field(default=None, description="Level of each level, in order.")
    input_tokens: int | None = Field(default=None, description="Prompt length (None with mixed).")
    output_tokens: int | None = Field(default=None, description="Output length (None with mixed).")
    mixed: list[MixedShapeEcho] | None = Field(default=None, description="Mixed request shapes, or None.")
    num_requests: int | None = Field(default=None, description="Measured requests per run (None with duration_s).")
    duration_s: float | None = Field(default=None, description="Run this long instead.")
    warmup_requests: int | None = Field(default=None, description="Warm-up requests (the most of any level).")
    repeats: int | None = Field(default=None, description="Runs per level (results before the stability verdict).")
    max_spread: float | None = Field(default=None, description="Spread bound (results before the stability verdict).")
    min_runs: int | None = Field(default=None, description="Runs per level always measured.")
    warmup_requests_by_level: dict[str, int] | None = Field(default=None, description="Warm-up requests per level.")
    max_runs: int | None = Field(default=None, description="Most runs per level.")
    max_cv: float | None = Field(default=None, description="Run-to-run CV bound.")
    confidence: float | None = Field(default=None, description="One-sided confidence of the intervals.")
    budget_s: float | None = Field(default=None, description="Time the runs may take.")
    max_drift: float | None = Field(default=None, description="Drift bound.")
    max_disturbed_runs: int | None = Field(default=None, description="Disturbed runs repeated per level.")
    host: HostLimitsEcho | None = Field(default=None, description="What counts as disturbed.")
    slo: SloEcho | None = Field(default=None, description="SLOs for goodput, or None.")

    @property
    def has_stability(self) -> bool:
        """Written with the run-to-run stability verdict (else: the min-max spread of older results)."""
        return "max_cv" in self.model_fields_set


class ClientCost(Evidence):
    """The load generator's own cost at the highest level, and whether it limited a level."""

    cpu_percent: float | None = Field(default=None, description="Client CPU over the window (100 = one core).")
    overhead_us_per_token: float | None = Field(default=None, description="Client CPU time per output token, µs.")
    loop_lag_ms_p99: float | None = Field(default=None, description="Event-loop lateness p99, ms.")
    bottleneck: bool | None = Field(default=None, description="True: the client, not the server, limited a run.")
    warning: str | None = Field(default=None, description="The one-line warning the run printed, if any.")


class ServerMemory(Evidence):
    """The server's memory around the scenario, where readable."""

    rss_mib_before: float | None = Field(default=None, description="Server process tree RSS before, MiB.")
    rss_mib_after: float | None = Field(default=None, description="Server process tree RSS after, MiB.")
    kv_cache_usage: float | None = Field(default=None, description="Peak KV-cache usage (0-1).")


class WorkloadAudit(Evidence):
    """Whether the lengths asked for are the lengths served (docs/perf.md, "Served lengths")."""

    api: str | None = Field(default=None, description="completions | chat.")
    ignore_eos: str | None = Field(default=None, description="native | emulated (…) | not accepted.")
    completed: int | None = Field(default=None, description="Completed measured requests audited.")
    output_lengths: str | None = Field(default=None, description="usage | token_ids | tokenizer | none | mixed.")
    long_outputs: int | None = Field(default=None, description="Requests served more tokens than max_tokens.")
    short_outputs: int | None = Field(default=None, description="Requests that stopped before output_tokens.")
    usage_missing: int | None = Field(default=None, description="Answers without usage.")
    prompt_lengths: str | None = Field(default=None, description="How prompt lengths were counted.")
    prompt_length_mismatches: int | None = Field(default=None, description="usage.prompt_tokens ≠ counted length.")
    input_length_off: int | None = Field(default=None, description="Prompts whose served length differs.")
    rejected_fields: list[str] = Field(default_factory=list, description="Request fields the server refused.")
    notes: list[str] = Field(default_factory=list, description="Informative lines.")
    problems: list[str] = Field(default_factory=list, description="One line each; any problem fails the scenario.")


class HostSpeed(Evidence):
    """The host-speed reference and the scenario's elasticities to it."""

    probe: str = Field(description="What the reference times.")
    unavailable: str | None = Field(default=None, description="Why it was not run, or None.")
    cores: list[int] = Field(default_factory=list, description="Cores it ran on.")
    elasticity: dict[str, float | None] = Field(default_factory=dict, description="Per headline metric.")


class ServingEvidence(Evidence):
    """``perf.serving``: one scenario, its levels and what else was measured around them."""

    scenario: ScenarioEcho | None = Field(default=None, description="The params, echoed.")
    server: dict[str, Any] | None = Field(default=None, description="The framework facts of step 4 (adapter "
                                          "describe(): free-form per framework).")
    levels: list[ServingLevel] | None = Field(default=None, description="One entry per level measured.")
    records_file: str | None = Field(default=None, description="Per-request records, relative to the run folder.")
    client: ClientCost | None = Field(default=None, description="The load generator's cost.")
    server_memory: ServerMemory | None = Field(default=None, description="Server memory, where readable.")
    workload: WorkloadAudit | None = Field(default=None, description="The served-lengths audit.")
    host_speed: HostSpeed | None = Field(default=None, description="The host-speed reference.")


# ---------------------------------------------------------------------------- perf.soak --


class SoakEcho(Evidence):
    """The soak's params, echoed (docs/perf.md, "Soak outcome")."""

    duration_s: float | None = Field(default=None, description="The first look: the shortest soak, s.")
    max_duration_s: float | None = Field(default=None, description="The budget: the last look, s.")
    looks: int | None = Field(default=None, description="Looks from duration_s to max_duration_s.")
    arrival: str | None = Field(default=None, description="concurrency | poisson.")
    level: Number | None = Field(default=None, description="Requests in flight, or req/s.")
    mixed: list[MixedShapeEcho] = Field(default_factory=list, description="Request shapes.")
    sample_interval_s: float | None = Field(default=None, description="Telemetry interval, s.")
    warmup_s: float | None = Field(default=None, description="Left out of the memory trend, s.")
    max_growth_mib_per_min: float | None = Field(default=None, description="Growth bound, MiB/min.")
    confidence: float | None = Field(default=None, description="One-sided confidence over all looks.")
    max_error_rate: float | None = Field(default=None, description="Largest failed-request fraction.")
    request_timeout_s: float | None = Field(default=None, description="Longest one request may take.")


class ServerProcess(Evidence):
    """The server process whose memory was sampled."""

    pid: int | None = Field(default=None, description="Its pid; None when not found.")
    found_by: str | None = Field(default=None, description="launched by adaptcheck | listening on the endpoint's "
                                 "port | None.")
    on_this_host: bool | None = Field(default=None, description="Whether it runs on this machine.")


class SoakRequests(RunSummary):
    """The measured window's RunSummary plus the warm-up requests (they count as requests)."""

    warmup_requests: int | None = Field(default=None, description="Requests before the window.")
    warmup_failed: int | None = Field(default=None, description="Warm-up requests that failed.")
    aborted: str | None = Field(default=None, description="Why the load stopped early, or None.")


class SampleTiming(Evidence):
    """How long one device reading took, s."""

    median: float | None = Field(default=None, description="Median.")
    max: float | None = Field(default=None, description="Longest.")


class TelemetryError(Evidence):
    """A failed telemetry reading (sampling goes on)."""

    source: str | None = Field(default=None, description="host | device.")
    error: str | None = Field(default=None, description="The exception, one line.")
    count: int | None = Field(default=None, description="How often it failed.")
    first_t_s: float | None = Field(default=None, description="When it first failed, s.")


class SoakTelemetry(Evidence):
    """Telemetry sampled during the soak; each series is a list aligned with its ``t_s``."""

    interval_s: float | None = Field(default=None, description="Sample interval, s.")
    host: dict[str, list[Number | None]] | None = Field(default=None, description="Host series by field "
                                                         "(t_s, server_rss_mib, cpu_utilization_pct, …).")
    device: dict[str, list[Number | None]] | None = Field(default=None, description="Device series by field; None "
                                                           "when the server is not on this host.")
    device_sample_s: SampleTiming | None = Field(default=None, description="Device reading time; None: no readings.")
    errors: list[TelemetryError] = Field(default_factory=list, description="Failed readings.")
    notes: list[str] = Field(default_factory=list, description="What was not sampled, and why.")


class TrendFit(Evidence):
    """The least-squares line through a memory series (adaptcheck.perf.trend.Fit)."""

    n: int | None = Field(default=None, description="Samples fitted (outliers set aside).")
    outliers: int | None = Field(default=None, description="Samples set aside.")
    t_start_s: float | None = Field(default=None, description="First fitted sample, s.")
    t_end_s: float | None = Field(default=None, description="Last fitted sample, s.")
    slope_mib_per_min: float | None = Field(default=None, description="Slope, MiB/min.")
    slope_stderr_mib_per_min: float | None = Field(default=None, description="Its standard error.")
    intercept_mib: float | None = Field(default=None, description="The line's value at t = 0.")
    r2: float | None = Field(default=None, description="R²; None when the samples do not vary.")
    residual_std_mib: float | None = Field(default=None, description="Noise around the line, MiB.")
    autocorrelation: float | None = Field(default=None, description="Lag-1 autocorrelation of the residuals.")
    effective_n: float | None = Field(default=None, description="Independent samples the series is worth.")
    increment_slope_mib_per_min: float | None = Field(default=None, description="Rate from the increments model.")
    increment_stderr_mib_per_min: float | None = Field(default=None, description="Its standard error.")
    increment_autocorrelation: float | None = Field(default=None, description="Lag-1 autocorrelation of the steps.")
    increment_effective_n: float | None = Field(default=None, description="Independent steps.")
    growth_over_window_mib: float | None = Field(default=None, description="Growth over the fitted window, MiB.")
    growth_per_hour_mib: float | None = Field(default=None, description="Projected growth per hour, MiB.")


class MemoryTrend(Evidence):
    """One memory series at the stopping look: its fit and verdict against the bound."""

    series: str | None = Field(default=None, description="server_rss_mib | memory_used_mib.")
    source: str | None = Field(default=None, description="host | device.")
    label: str | None = Field(default=None, description="As the report names it.")
    bounded: bool | None = Field(default=None, description="False: shown, not judged (the CPU backend's "
                                 "whole-host memory).")
    ok: bool | None = Field(default=None, description="True within, False over, None inconclusive / not judged.")
    state: str | None = Field(default=None, description="within | over | inconclusive | not judged | not bounded.")
    reason: str | None = Field(default=None, description="The figures or why not judged, one line.")
    slope_bounds_mib_per_min: list[float] | None = Field(default=None, description="One-sided lower and upper "
                                                         "bounds of the slope.")
    confidence: float | None = Field(default=None, description="The look's confidence.")
    decide_duration_s: float | None = Field(default=None, description="Inconclusive: about how long would decide.")
    fit: TrendFit | None = Field(default=None, description="None when not judged (too few samples).")


class SoakLook(Evidence):
    """One look taken: each memory series' state."""

    at_s: float | None = Field(default=None, description="s since the soak started.")
    states: dict[str, str] = Field(default_factory=dict, description="Series → state.")


class SoakDecision(Evidence):
    """When the soak stopped, and why."""

    looks_at_s: list[float] = Field(default_factory=list, description="The planned looks, s.")
    look_confidence: float | None = Field(default=None, description="Each look's one-sided confidence.")
    looks: list[SoakLook] = Field(default_factory=list, description="The looks taken.")
    ran_s: float | None = Field(default=None, description="From the soak's start to the end of the load, s.")
    stop: str | None = Field(default=None, description="decided | budget | nothing to judge | load ended.")
    stopped_at_s: float | None = Field(default=None, description="The look whose fits are the verdict.")
    why: str | None = Field(default=None, description="In words.")


class CounterRise(Evidence):
    """A device error counter that must not rise."""

    counter: str = Field(description="e.g. ecc_volatile_uncorrectable.")
    first: Number = Field(description="First reading.")
    last: Number = Field(description="Last reading.")
    rose: bool = Field(description="Whether it rose during the soak.")


class SoakEvidence(Evidence):
    """``perf.soak``: the load, the telemetry and the memory trends."""

    soak: SoakEcho | None = Field(default=None, description="The params, echoed.")
    server: dict[str, Any] | None = Field(default=None, description="The framework facts of step 4 (free-form).")
    server_process: ServerProcess | None = Field(default=None, description="The process sampled.")
    requests: SoakRequests | None = Field(default=None, description="The window's RunSummary and warm-up.")
    records_file: str | None = Field(default=None, description="Per-request records, relative to the run folder.")
    telemetry: SoakTelemetry | None = Field(default=None, description="What was sampled.")
    memory: list[MemoryTrend] = Field(default_factory=list, description="One entry per memory series sampled.")
    decision: SoakDecision | None = Field(default=None, description="When and why it stopped; None in results "
                                          "before the looks.")
    counters: list[CounterRise] = Field(default_factory=list, description="Device error counters.")
    kv_cache_peak: float | None = Field(default=None, description="vLLM's KV-cache gauge, peak; None without one.")

