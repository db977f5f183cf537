"""What the step-5 micro-benchmark checks share: the peak they are held to (raised or
re-measured when a row shows it too low), the memory rows held to the cache instead, and the
status policy of one micro-benchmark outcome. Policy and shapes: docs/perf.md,
"Micro-benchmark outcome", "Above 100 %" and "Memory rows and the last-level cache".
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.schemas.micro_evidence import MicroEvidence, MicroRow
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.perf.caches import DRAM_FACTOR, LastLevelCache, device_llc, residency
from adaptcheck.perf.cpu_peak import remeasure_cpu_clock, with_memory_reference
from adaptcheck.perf.micro import MIB, TimingOptions, finite_positive, memory_reference
from adaptcheck.perf.peak_lookup import peak_for
from adaptcheck.perf.peaks import Peak, efficiency, fmt_rate, roofline
from adaptcheck.perf.timing import timer_name

MEMORY_REFERENCE_KEY = "perf.memory_reference"
"""ctx.scratch key: the host's measured copy bandwidth, measured once per worker process."""
LLC_KEY = "perf.last_level_cache"
"""ctx.scratch key: the device's last-level cache (read once per worker process)."""

OVER_PEAK = 1.05
"""Efficiency the slow end of a row's CI must exceed for the check to error: beyond timing
noise, and beyond the few percent a boost clock moves between its measurement and the row."""

ADD_PEAK_HINT = ("add an entry for it to matrices/peaks.yaml (or a file given as peaks_file) with id, match (a regex "
                 "for the device name), backends, dense_tflops per dtype, memory_gbps, source and verified")


class TimedParams(BaseModel):
    """Timing and peak params shared by every micro-benchmark (collectives included)."""

    model_config = ConfigDict(extra="forbid")

    budget_s: float = Field(default=1.0, ge=0, le=600,
                            description="Wall time spent on each row's timed repetitions once min_reps are done "
                                        "(warm-up and sizing probes come on top); 0: exactly min_reps.")
    warmup: int = Field(default=2, ge=1, le=1000,
                        description="Warm-up calls before timing (kernel selection, lazy init, first-touch faults).")
    min_reps: int = Field(default=5, ge=1, le=100_000, description="Fewest timed repetitions per row.")
    max_reps: int = Field(default=100, ge=1, le=1_000_000, description="Most timed repetitions per row.")
    ci_target: float | None = Field(default=0.02, gt=0, le=10,
                                    description="Stop a row's repetitions (after min_reps) once the 95 % confidence "
                                                "interval of its median time is narrower than this fraction of the "
                                                "median; null: always spend budget_s. See docs/perf.md.")
    peaks_file: str | None = Field(default=None,
                                   description="Peaks YAML to use instead of matrices/peaks.yaml (same schema).")


class MicroParams(TimedParams):
    """Timing params of the single-device benchmarks, with the sizing limit."""

    max_call_s: float | None = Field(default=None, gt=0, le=3600,
                                     description="Longest single call a row may take; larger problems are shrunk "
                                                 "(and say so). None: budget_s / min_reps, at least 10 ms.")

    def timing(self) -> TimingOptions:
        return TimingOptions(warmup=self.warmup, min_reps=self.min_reps, max_reps=max(self.max_reps, self.min_reps),
                             budget_s=self.budget_s, max_call_s=self.max_call_s, ci_target=self.ci_target)


def resolve_peak(ctx: CheckContext, peaks_file: str | None) -> Peak | None:
    """The peak this device is held to. On a host CPU without a datasheet memory figure,
    the measured copy bandwidth fills in (measured once per worker, labelled ``measured``)."""
    backend = ctx.backend
    host = not backend.is_accelerator
    peak = peak_for(backend.name, backend.device_name(ctx.device_index), peaks_file, host_cpu=host)
    if peak is not None and host and peak.memory_bw is None:
        ref = ctx.scratch.get(MEMORY_REFERENCE_KEY)
        if ref is None:
            ref = memory_reference(backend, ctx.device_index)
            ctx.scratch[MEMORY_REFERENCE_KEY] = ref
        peak = with_memory_reference(peak, ref[0], "measured", ref[1])
    return peak


def last_level_cache(ctx: CheckContext) -> LastLevelCache | None:
    if LLC_KEY not in ctx.scratch:
        ctx.scratch[LLC_KEY] = device_llc(ctx.backend, ctx.device_index)
    llc: LastLevelCache | None = ctx.scratch[LLC_KEY]
    return llc


def hold_to_memory(ctx: CheckContext, row: MicroRow) -> MicroRow:
    """``row``, relabelled ``bound: cache`` without an efficiency when it is memory-bound but
    its footprint (its minimum bytes: every buffer touched once) is under DRAM_FACTOR × the
    LLC: such a row measures the cache and is not held to the DRAM peak."""
    if row.status != "ok" or row.bound != "memory" or not row.bytes:
        return row
    llc = last_level_cache(ctx)
    label = residency(float(row.bytes), llc)
    if label is None or llc is None:
        return row
    row.bound, row.efficiency = "cache", None
    row.extra.cache = (f"{label}: footprint {row.bytes / MIB:g} MiB < {DRAM_FACTOR} × the "
                       f"{llc.describe()}; not held to the memory peak")
    return row


def raise_reference(ctx: CheckContext, peak: Peak | None, rows: list[MicroRow]) -> Peak | None:
    """Where the memory reference was measured here and a copy row known to be DRAM-sized
    (footprint ≥ DRAM_FACTOR × a known LLC) had a best repetition faster than it, lift the
    reference to that copy (for this check and the ones after) and recompute the memory
    rows' efficiencies: the reference is the best DRAM copy this worker has seen, so a
    quieter moment after the reference cannot put a row above 100 %."""
    llc = last_level_cache(ctx)
    if peak is None or peak.memory_bw_basis != "measured" or not peak.memory_bw or llc is None:
        return peak
    best_bw, best_row = peak.memory_bw, None
    for r in rows:
        fastest = r.time_s.min if r.time_s is not None else None
        if r.status == "ok" and r.bound == "memory" and r.flops is None and r.bytes is not None \
                and residency(float(r.bytes), llc) is None \
                and fastest is not None and finite_positive(fastest) and r.bytes / fastest > best_bw:
            best_bw, best_row = r.bytes / fastest, r
    if best_row is None:
        return peak
    note = (f"lifted from {fmt_rate(peak.memory_bw, 'B/s')} to the best repetition of {best_row.name} "
            "(a faster DRAM-sized copy than the reference measured earlier)")
    ctx.scratch[MEMORY_REFERENCE_KEY] = (best_bw, note)
    lines = [ln for ln in peak.derivation if not ln.startswith("memory:")]
    lines.append(f"memory: {fmt_rate(best_bw, 'B/s')} (measured): {note}")
    new = peak.replace(memory_bw=best_bw, interconnect_bw=best_bw, derivation=tuple(lines))
    for r in rows:
        if r.status == "ok" and r.bound == "memory" and r.efficiency is not None:
            r.efficiency = efficiency("memory", new, None, None, r.achieved.bytes_per_s)
    return new


def recheck_clock(ctx: CheckContext, peak: Peak | None, rows: list[MicroRow],
                  peaks_file: str | None) -> Peak | None:
    """Where a compute row ran above a CPU peak derived from the measured vector clock,
    measure the clock again (keeping the best of both: :func:`~adaptcheck.perf.cpu_clock.remeasure_vector_clock`)
    and hold every row with FLOPs to the new peak. Once per check: a row still above the
    peak afterwards is the ceiling's defect and :func:`verdict` says so.

    Why: the clock is measured once per worker, in ~0.3 s; a moment when the host's SMT
    sibling or another guest ran vector work gives a low clock (issue 14: 2.30 GHz zmm, ymm
    3.65 GHz beside it, then a GEMM at 124 % of the peak; 3.45 GHz on the other runs)."""
    if peak is None or not peak.entry.startswith("derived:cpu") or not any(
            r.status == "ok" and r.bound == "compute" and (r.efficiency or 0) > 1.0 for r in rows):
        return peak
    if not remeasure_cpu_clock():
        return peak  # no clock was measured (fallback to cpufreq/cpuinfo): nothing to redo
    new = resolve_peak(ctx, peaks_file)
    if new is None:
        return peak
    before = next((ln for ln in peak.derivation if ln.startswith("clock:")), "clock: ?")
    first = before.removeprefix("clock: ").split(" GHz")[0]
    note = f"clock re-measured after a compute row ran above the peak (the first measurement gave {first} GHz)"
    new = new.replace(derivation=(*new.derivation, note))
    for i, r in enumerate(rows):
        if r.status != "ok" or r.flops is None or r.bound == "cache":
            continue
        key = r.extra.peak_dtype or r.dtype
        _, ridge, bound = roofline(r.flops, r.bytes, new, key)
        r.ridge_point, r.bound = ridge, bound
        r.efficiency = efficiency(bound, new, key, r.achieved.flops_per_s, r.achieved.bytes_per_s)
        rows[i] = hold_to_memory(ctx, r)
    return new


def efficiency_low(row: MicroRow) -> float | None:
    """The efficiency at the slow end of the row's median CI (the lowest it plausibly is)."""
    eff, t = row.efficiency, row.time_s
    ci = t.median_ci if t is not None else None
    median = t.median if t is not None else None
    if eff is None or ci is None or median is None or not finite_positive(ci[1]) or not finite_positive(median):
        return eff
    return float(eff) * float(median) / float(ci[1])


def describe_row(row: MicroRow) -> str:
    """'prefill m=2048 n=4096 k=4096 bf16: 1.5 TFLOP/s, 29% (compute)'."""
    ach = row.achieved
    if row.extra.busbw is not None:
        figure = f"busbw {fmt_rate(row.extra.busbw, 'B/s')}"
    elif row.bound == "compute" and ach.flops_per_s:
        figure = fmt_rate(ach.flops_per_s)
    else:
        figure = fmt_rate(ach.bytes_per_s, "B/s")
    eff = f", {100 * row.efficiency:.1f}%" if row.efficiency is not None else ""
    return f"{row.label}: {figure}{eff}{' (' + row.bound + ')' if row.bound else ''}"


Metrics = dict[str, float | int | str | None]
"""An outcome's flat metrics: numbers, and a few words (a collective's library)."""


def verdict(ctx: CheckContext, benchmark: str, rows: list[MicroRow], peak: Peak | None,
            metrics: Metrics, notes: list[str] | None = None, timer: str | None = None) -> Outcome:
    """The Outcome of a micro-benchmark check (see the module docstring).

    Its details are a :class:`MicroEvidence` holding ``rows`` themselves: a row flagged above
    the peak below is flagged in the details too."""
    evidence = MicroEvidence(benchmark=benchmark, timer=timer or timer_name(ctx.backend),
                             peak=peak.record() if peak else None, rows=rows)
    if notes:
        evidence.notes = notes
    ran = [r for r in rows if r.status == "ok"]
    not_run = [r for r in rows if r.status != "ok"]
    skipped_note = ("; not run: " + "; ".join(f"{r.label} ({r.reason})" for r in not_run[:4])
                    + (f" … and {len(not_run) - 4} more" if len(not_run) > 4 else "")) if not_run else ""
    raised = [r for r in not_run if r.extra.raised]
    if raised:
        return Outcome.errored(f"{raised[0].label} raised {raised[0].reason}", metrics=metrics,
                               details=evidence.dump())
    broken = [r for r in ran if r.time_s is None or not finite_positive(r.time_s.median)]
    if broken:
        r = broken[0]
        median = r.time_s.median if r.time_s is not None else None
        return Outcome.failed(f"{r.label}: the timing came back {median!r} s (must be finite and "
                              f"> 0): the timer or the device is broken", metrics=metrics, details=evidence.dump())
    if not ran:
        return Outcome.skipped(f"nothing measured{skipped_note or ': no rows'}", metrics=metrics,
                               details=evidence.dump())
    device = ctx.backend.device_name(ctx.device_index)
    if peak is None:
        return Outcome.skipped(f"no peak known for {device!r} ({ctx.backend.name}): efficiency cannot be computed; "
                               f"{ADD_PEAK_HINT}", metrics=metrics, details=evidence.dump())
    missing = [r for r in ran if (r.efficiency is None and r.bound != "cache") or r.bound is None]
    if missing:
        what = sorted({r.extra.peak_dtype or r.dtype or "memory bandwidth" for r in missing})
        return Outcome.skipped(f"the peak for {device!r} ({peak.entry}) has no figure for {', '.join(what)}, so "
                               f"{missing[0].label} has no efficiency; {ADD_PEAK_HINT}",
                               metrics=metrics, details=evidence.dump())
    shown = "; ".join(describe_row(r) for r in ran[:4]) + (f"; … {len(ran) - 4} more rows" if len(ran) > 4 else "")
    basis = " (memory reference measured here, not a datasheet figure)" if peak.memory_bw_basis == "measured" \
        and any(r.bound in ("memory", "network") for r in ran) else ""
    cached = [r for r in ran if r.bound == "cache"]
    cache_note = (f"; in cache, not held to the memory peak: {', '.join(r.label for r in cached[:3])}"
                  if cached else "")
    # Above 100 % is a defect of the ceiling (a clock or per-cycle figure too low, a wrong
    # peaks entry), never a finding in the device's favour: always flagged; an error when
    # it is beyond noise, because every efficiency of the check is then meaningless.
    over = [(r, eff) for r in ran if (eff := r.efficiency) is not None and eff > 1.0]
    if over:
        evidence.above_peak = [r.label for r, _ in over]
        for r, eff in over:
            r.extra.above_peak = (f"{100 * eff:.1f}% of the peak (slow end of its CI "
                                  f"{100 * (efficiency_low(r) or 0):.1f}%): the peak understates this device")
    sure = [(r, eff) for r, eff in over if (efficiency_low(r) or 0) > OVER_PEAK]
    if sure:
        r, eff = sure[0]
        return Outcome.errored(
            f"{r.label} ran at {100 * eff:.0f}% of the {peak.entry} peak (at least "
            f"{100 * (efficiency_low(r) or 0):.0f}% within its timing CI): the peak understates this device, so no "
            f"efficiency here means anything; check the derivation in details.peak (clock, FLOP per cycle) or "
            f"{ADD_PEAK_HINT}", metrics=metrics, details=evidence.dump())
    over_note = (f"; above 100 % of the peak within timing noise: {', '.join(r.label for r, _ in over[:3])} "
                 "(flagged: the peak may understate this device)") if over else ""
    return Outcome.passed(f"{shown}{basis}{cache_note}{over_note}{skipped_note}", metrics=metrics,
                          details=evidence.dump())


def headline(metrics: Metrics, prefix: str, row: MicroRow) -> None:
    """Flat metrics of one row: ``<prefix>_tflops`` / ``_gbps`` / ``_efficiency``."""
    ach = row.achieved
    if ach.flops_per_s:
        metrics[f"{prefix}_tflops"] = ach.flops_per_s / 1e12
    if ach.bytes_per_s and row.bound != "compute":
        metrics[f"{prefix}_gbps"] = ach.bytes_per_s / 1e9
    if row.efficiency is not None:
        metrics[f"{prefix}_efficiency"] = row.efficiency
