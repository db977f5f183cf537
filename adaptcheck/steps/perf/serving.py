"""Check kind ``perf.serving``: one serving scenario, repeated, against the server of step 4.

One ladder check per scenario (single short, single long, concurrent short, concurrent long,
mixed lengths, stability — their sizes are ladder data). The check takes the framework
step 4 loaded with the same load options (``vllm_serve`` by default; also
``transformers_serve``, or ``endpoint`` for ``--endpoint``), so a launched server is reused,
not restarted; drives it with :mod:`adaptcheck.perf.loadgen` at every level, ``repeats``
times; writes every request to ``<run_dir>/perf/serving/<scenario>.jsonl``; and returns
the outcome in the shape ``docs/perf.md`` fixes.

Status (docs/perf.md): ``pass`` when every run finished with an error rate ≤
``max_error_rate`` and the run-to-run spread of the median TTFT, median TPOT and output
tok/s is ≤ ``max_spread`` at every level (the bound L4 asks for); ``fail`` naming the
level, the metric and by how much otherwise, or when a run had to stop (server dead or
hung: its requests are counted as errors); ``skip`` (not applicable) without a server;
``error`` when nothing could be measured at all.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig, RunResult
from adaptcheck.perf.monitors import client_verdict, local_server_pid, tree_rss_mib
from adaptcheck.perf.serving_metrics import level_summary
from adaptcheck.perf.workload import PromptFactory, Shape, Workload
from adaptcheck.steps.framework.params import FrameworkParams
from adaptcheck.steps.framework.probes import local_tokenizer
from adaptcheck.steps.framework.session import (
    Active,
    framework_facts,
    run_with_framework,
)

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

    @field_validator("framework")
    @classmethod
    def _known(cls, v: str) -> str:
        if v == AUTO:
            return v
        from adaptcheck.frameworks.registry import validate_name

        return validate_name(v)


P = TypeVar("P", bound=ServerParams)


class ServingParams(ServerParams):
    """``perf.serving``: one scenario of the serving baseline."""

    scenario: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Scenario name; names the records file "
                          "perf/serving/<scenario>.jsonl.")
    arrival: Literal["burst", "concurrency", "poisson"] = Field(
        default="concurrency", description="burst: each level is a number of requests sent at once; concurrency: "
        "each level is a number of requests kept in flight; poisson: each level is a rate (req/s).")
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
    repeats: int = Field(default=3, ge=2, description="Measured runs per level; their spread is what is bounded.")
    max_spread: float = Field(default=0.15, gt=0, description="Largest (max-min)/median over the runs of median "
                              "TTFT, median TPOT and output tok/s.")
    max_error_rate: float = Field(default=0.0, ge=0, le=1, description="Largest fraction of failed requests in a run.")
    slo: Slo | None = Field(default=None, description="SLOs for goodput (reported, not a pass condition).")
    request_timeout_s: float = Field(default=60.0, gt=0, description="Longest one request may take.")
    run_timeout_s: float | None = Field(default=None, gt=0, description="Longest one measured run may take (in-flight "
                                        "requests are then cancelled and counted as failed); default: duration_s + "
                                        "request_timeout_s, or request_timeout_s per wave of requests.")

    @model_validator(mode="after")
    def _consistent(self) -> ServingParams:
        if self.mixed is not None and (self.input_tokens is not None or self.output_tokens is not None):
            raise ValueError("give mixed, or input_tokens/output_tokens, not both")
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give num_requests or duration_s, not both")
        if self.arrival == "burst" and (self.num_requests is not None or self.duration_s is not None):
            raise ValueError("a burst sends each level's number of requests at once: no num_requests or duration_s")
        if self.arrival != "poisson":
            if any(v != int(v) or v < 1 for v in self.levels):
                raise ValueError(f"{self.arrival} levels are whole numbers of requests ≥ 1")
            self.levels = [int(v) for v in self.levels]  # reported as 4, not 4.0
        if self.mixed is None:
            self.input_tokens = self.input_tokens or DEFAULT_INPUT_TOKENS
            self.output_tokens = self.output_tokens or DEFAULT_OUTPUT_TOKENS
        if self.arrival != "burst" and self.duration_s is None and self.num_requests is None:
            self.num_requests = DEFAULT_NUM_REQUESTS
        return self

    def shapes(self) -> list[Shape]:
        if self.mixed is not None:
            return [Shape(m.input_tokens, m.output_tokens, m.weight) for m in self.mixed]
        assert self.input_tokens is not None and self.output_tokens is not None
        return [Shape(self.input_tokens, self.output_tokens)]

    def warmups(self) -> int:
        if self.warmup_requests is not None:
            return self.warmup_requests
        return min(16, max(2, math.ceil(max(self.levels))))

    def run_config(self, level: float, arrival_seed: int) -> RunConfig:
        return RunConfig(arrival=self.arrival, level=level,
                         num_requests=int(level) if self.arrival == "burst" else self.num_requests,
                         duration_s=self.duration_s, warmup_requests=self.warmups(),
                         request_timeout_s=self.request_timeout_s, run_timeout_s=self.run_timeout_s,
                         arrival_seed=arrival_seed)


class ServingCheck(Check):
    """One serving scenario, repeated at each level, against the step-4 server."""

    kind = "perf.serving"
    step = 5
    description = ("Serving scenario: TTFT/TPOT/ITL/E2EL, throughput, goodput and errors at each level, "
                   "repeated; the run-to-run spread is bounded.")
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
    from adaptcheck.frameworks.endpoint_fw import EndpointFramework
    from adaptcheck.frameworks.registry import framework_class

    params = params.model_copy(update={"framework": resolve_framework(ctx, params.framework)})
    if not issubclass(framework_class(params.framework), EndpointFramework):
        return Outcome.skipped(f"{params.framework} serves no HTTP endpoint: {kind} drives vllm_serve, "
                               "transformers_serve or endpoint", applicable=no_endpoint_applicable)
    return run_with_framework(ctx, params, body)


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
    fw: Any = active.framework
    url = getattr(fw, "url", None)
    if not url:
        return Outcome.skipped(f"{active.name} serves no HTTP endpoint: perf.serving drives vllm_serve, "
                               "transformers_serve or endpoint", applicable=False)
    tokenizer = served_tokenizer(active)
    seed = ctx.seed_for(ctx.check_id or params.scenario)
    workload = Workload(params.shapes(), PromptFactory(tokenizer), seed=seed)
    client = getattr(fw, "client", None)
    gen = LoadGenerator(url, workload, model=getattr(client, "model", None), tokenizer=tokenizer,
                        rejected_fields=set(getattr(client, "rejected_fields", set())))
    server = getattr(fw, "server", None)
    pid = getattr(server, "pid", None) or local_server_pid(url)
    rel = Path("perf") / "serving" / f"{params.scenario}.jsonl"
    path = ctx.run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    rss_before = tree_rss_mib(pid) if pid else None
    by_level: list[tuple[float, list[RunResult]]] = []
    stopped: str | None = None
    total_runs = len(params.levels) * params.repeats
    for li, level in enumerate(params.levels):
        runs: list[RunResult] = []
        by_level.append((level, runs))
        for r in range(params.repeats):
            done_runs = li * params.repeats + r
            ctx.progress(done_runs, total_runs, "runs", note=f"{params.arrival} {level:g}, run {r + 1}/{params.repeats}")
            result = gen.run(params.run_config(level, ctx.seed_for(f"{ctx.check_id}:arrival:{level:g}")),
                             level_index=li, run=r)
            runs.append(result)
            with path.open("a", encoding="utf-8") as f:  # written as it goes: a killed check keeps its records
                f.writelines(json.dumps(rec.to_dict()) + "\n" for rec in result.records)
            if result.aborted:
                stopped = f"level {level:g} run {r + 1}: {result.aborted}"
                break
        if stopped:
            break
    rss_after = tree_rss_mib(pid) if pid else None
    slo = params.slo.model_dump() if params.slo else None
    levels = [level_summary(level, [(res.records, res.duration_s) for res in runs], slo=slo)
              for level, runs in by_level]
    kv = [res.kv_cache_peak for _, runs in by_level for res in runs if res.kv_cache_peak is not None]
    details: dict[str, Any] = {
        "scenario": {"name": params.scenario, "arrival": params.arrival, "levels": params.levels,
                     "input_tokens": params.input_tokens, "output_tokens": params.output_tokens,
                     "mixed": [m.model_dump() for m in params.mixed] if params.mixed else None,
                     "num_requests": params.num_requests, "duration_s": params.duration_s,
                     "warmup_requests": params.warmups(), "repeats": params.repeats,
                     "max_spread": params.max_spread, "slo": slo},
        "server": framework_facts(active),
        "levels": levels,
        "records_file": rel.as_posix(),
        "client": _client(by_level, levels),
        "server_memory": {"rss_mib_before": rss_before, "rss_mib_after": rss_after,
                          "kv_cache_usage": max(kv) if kv else None},
        "workload": _workload_facts(by_level, gen, tokenizer),
    }
    return _verdict(params, levels, details, stopped)


def _client(by_level: list[tuple[float, list[RunResult]]], levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's cost at the highest level, and whether it limited any level."""
    verdicts = []
    for (level, runs), summary in zip(by_level, levels, strict=True):
        measured = [(res.client, s) for res, s in zip(runs, summary["runs"], strict=True) if res.client is not None]
        if not measured:
            continue
        cpu = statistics.median(c.cpu_percent for c, _ in measured)
        per_token = [v for c, s in measured if (v := c.overhead_us_per_token(s["total_output_tokens"])) is not None]
        lag = max(c.lag_p99_ms() for c, _ in measured)
        lag_mean = max(c.lag_mean_ms() for c, _ in measured)  # any run the client held back counts
        bottleneck, warning = client_verdict(cpu, lag_mean, lag, summary["median"]["itl_ms"]["median"])
        verdicts.append((level, {"cpu_percent": round(cpu, 1),
                                 "overhead_us_per_token": round(statistics.median(per_token), 1) if per_token else None,
                                 "loop_lag_ms_p99": round(lag, 3), "bottleneck": bottleneck,
                                 "warning": f"level {level:g}: {warning}" if warning else ""}))
    if not verdicts:
        return {"cpu_percent": None, "overhead_us_per_token": None, "loop_lag_ms_p99": None, "bottleneck": False,
                "warning": ""}
    top = dict(max(verdicts, key=lambda v: v[0])[1])
    flagged = [v for _, v in verdicts if v["bottleneck"]]
    if flagged and not top["bottleneck"]:
        top["bottleneck"], top["warning"] = True, flagged[0]["warning"]
    return top


def _workload_facts(by_level: list[tuple[float, list[RunResult]]], gen: LoadGenerator, tokenizer: Any) -> dict[str, Any]:
    """Whether the lengths asked for are the lengths that were served."""
    done = [r for _, runs in by_level for res in runs for r in res.measured if r.ok]
    # A request's shape depends on its index only, so what was asked is known from the record.
    short = sum(1 for r in done if (r.output_tokens or 0) < gen.workload.shape(r.index).output_tokens)
    off = sum(1 for r in done if r.input_tokens != gen.workload.shape(r.index).input_tokens)
    ignore_eos = ("emulated (generation_config min_new_tokens)" if "ignore_eos" in gen.rejected_fields
                  and "generation_config" not in gen.rejected_fields else
                  "not accepted" if "ignore_eos" in gen.rejected_fields else "native")
    return {"ignore_eos": ignore_eos, "short_outputs": short, "input_length_off": off, "completed": len(done),
            "prompt_lengths": "exact (local tokenizer)" if tokenizer is not None else "approximate (no local tokenizer)",
            "rejected_fields": sorted(gen.rejected_fields)}


def _verdict(params: ServingParams, levels: list[dict[str, Any]], details: dict[str, Any],
             stopped: str | None) -> Outcome:
    name = params.scenario
    runs = [run for lv in levels for run in lv["runs"]]
    metrics = _metrics(levels, details)
    if not any(run["completed"] for run in runs):
        errors: dict[str, int] = next((run["errors"] for run in runs if run["errors"]), {})
        why = stopped or (next(iter(errors)) if errors else "no request completed")
        return Outcome.errored(f"{name}: nothing measured: {why}", details=details, metrics=metrics)
    problems = [f"stopped at {stopped}"] if stopped else []
    for lv in levels:
        at = f"level {lv['level']:g}"
        for i, run in enumerate(lv["runs"], 1):
            rate = run["error_rate"]
            if rate is not None and rate > params.max_error_rate:
                top = next(iter(run["errors"]), "")
                problems.append(f"{at} run {i}: error rate {rate:.0%} > {params.max_error_rate:.0%} ({top})")
        for key, value in lv["spread"].items():
            if value is not None and value > params.max_spread:
                problems.append(f"{at}: spread of {key} {value:.0%} > {params.max_spread:.0%}")
    warning = details["client"]["warning"]
    if problems:
        more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
        return Outcome.failed(f"{name}: " + "; ".join(problems[:2]) + more
                              + (f"; WARNING {warning}" if warning else ""), details=details, metrics=metrics)
    top = levels[-1]["median"]
    spreads = [v for lv in levels for v in lv["spread"].values() if v is not None]
    return Outcome.passed(
        f"{name}: {len(levels)} level(s) x {params.repeats} runs; at {params.arrival} {levels[-1]['level']:g}: "
        f"TTFT p50 {_fmt(top['ttft_ms']['median'])} ms, TPOT p50 {_fmt(top['tpot_ms']['median'])} ms, "
        f"{_fmt(top['output_throughput'])} tok/s; largest spread {max(spreads, default=0):.0%} "
        f"(bound {params.max_spread:.0%})" + (f"; WARNING {warning}" if warning else ""),
        details=details, metrics=metrics)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _metrics(levels: list[dict[str, Any]], details: dict[str, Any]) -> dict[str, Any]:
    """Flat headline numbers: the highest level's medians, and each level's throughput."""
    top = levels[-1]["median"] if levels else {}
    if not top:
        return {}
    out: dict[str, Any] = {
        "ttft_ms_median": top["ttft_ms"]["median"], "tpot_ms_median": top["tpot_ms"]["median"],
        "itl_ms_median": top["itl_ms"]["median"], "e2el_ms_median": top["e2el_ms"]["median"],
        "ttft_ms_p99": top["ttft_ms"]["p99"], "output_tok_per_s": top["output_throughput"],
        "request_per_s": top["request_throughput"], "error_rate": top["error_rate"], "goodput": top["goodput"],
        "max_spread": max((v for lv in levels for v in lv["spread"].values() if v is not None), default=None),
        "client_cpu_percent": details["client"]["cpu_percent"],
        "client_overhead_us_per_token": details["client"]["overhead_us_per_token"],
    }
    for lv in levels:
        out[f"level{lv['level']:g}_output_tok_per_s"] = lv["median"].get("output_throughput")
    return out
