"""What the step-5 micro-benchmark checks share: timing params, the peak they are held to,
and the status policy of ``docs/perf.md``.

Status policy (one Outcome per check):

* ``error`` — a row raised an error that is not "unsupported" (the benchmark crashed);
* ``fail`` — a measured row's timing is non-finite or non-positive (a broken timer/device);
* ``skip`` — nothing could be measured (every row not_run, with the reasons), or no peak is
  known for the device or for a measured dtype: efficiency is the point, so the message
  says how to add one to ``matrices/peaks.yaml``; not-applicable skips are the checks' own;
* ``pass`` — every row that could run ran and has an efficiency and a bound class. Rows
  ``not_run`` for a stated reason (dtype unsupported here, too slow at any size) are
  listed in the message and details, and do not fail the check.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.perf.cpu_peak import with_memory_reference
from adaptcheck.perf.micro import TimingOptions, finite_positive, memory_reference
from adaptcheck.perf.peaks import Peak, fmt_rate, peak_for
from adaptcheck.perf.timing import timer_name

MEMORY_REFERENCE_KEY = "perf.memory_reference"
"""ctx.scratch key: the host's measured copy bandwidth, measured once per worker process."""

OVER_PEAK = 1.05
"""Efficiency above which a row is called out (timing noise alone rarely gives 5 %)."""

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
    peaks_file: str | None = Field(default=None,
                                   description="Peaks YAML to use instead of matrices/peaks.yaml (same schema).")


class MicroParams(TimedParams):
    """Timing params of the single-device benchmarks, with the sizing limit."""

    max_call_s: float | None = Field(default=None, gt=0, le=3600,
                                     description="Longest single call a row may take; larger problems are shrunk "
                                                 "(and say so). None: budget_s / min_reps, at least 10 ms.")

    def timing(self) -> TimingOptions:
        return TimingOptions(warmup=self.warmup, min_reps=self.min_reps, max_reps=max(self.max_reps, self.min_reps),
                             budget_s=self.budget_s, max_call_s=self.max_call_s)


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


def row_label(row: dict[str, Any]) -> str:
    return f"{row['name']}{' ' + row['dtype'] if row.get('dtype') else ''}"


def describe_row(row: dict[str, Any]) -> str:
    """'prefill m=2048 n=4096 k=4096 bf16: 1.5 TFLOP/s, 29% (compute)'."""
    ach, extra = row["achieved"], row.get("extra", {})
    if extra.get("busbw") is not None:
        figure = f"busbw {fmt_rate(extra['busbw'], 'B/s')}"
    elif row.get("bound") == "compute" and ach.get("flops_per_s"):
        figure = fmt_rate(ach["flops_per_s"])
    else:
        figure = fmt_rate(ach.get("bytes_per_s"), "B/s")
    eff = f", {100 * row['efficiency']:.1f}%" if row.get("efficiency") is not None else ""
    return f"{row_label(row)}: {figure}{eff}{' (' + row['bound'] + ')' if row.get('bound') else ''}"


def verdict(ctx: CheckContext, benchmark: str, rows: list[dict[str, Any]], peak: Peak | None,
            metrics: dict[str, Any], notes: list[str] | None = None, timer: str | None = None) -> Outcome:
    """The Outcome of a micro-benchmark check (see the module docstring)."""
    details: dict[str, Any] = {"benchmark": benchmark, "timer": timer or timer_name(ctx.backend),
                               "peak": peak.as_dict() if peak else None, "rows": rows}
    if notes:
        details["notes"] = notes
    ran = [r for r in rows if r["status"] == "ok"]
    not_run = [r for r in rows if r["status"] != "ok"]
    skipped_note = ("; not run: " + "; ".join(f"{row_label(r)} ({r['reason']})" for r in not_run[:4])
                    + (f" … and {len(not_run) - 4} more" if len(not_run) > 4 else "")) if not_run else ""
    raised = [r for r in not_run if r.get("extra", {}).get("raised")]
    if raised:
        return Outcome.errored(f"{row_label(raised[0])} raised {raised[0]['reason']}", metrics=metrics,
                               details=details)
    broken = [r for r in ran if not finite_positive((r.get("time_s") or {}).get("median"))]
    if broken:
        r = broken[0]
        return Outcome.failed(f"{row_label(r)}: the timing came back {r['time_s']['median']!r} s (must be finite and "
                              f"> 0): the timer or the device is broken", metrics=metrics, details=details)
    if not ran:
        return Outcome.skipped(f"nothing measured{skipped_note or ': no rows'}", metrics=metrics, details=details)
    device = ctx.backend.device_name(ctx.device_index)
    if peak is None:
        return Outcome.skipped(f"no peak known for {device!r} ({ctx.backend.name}): efficiency cannot be computed; "
                               f"{ADD_PEAK_HINT}", metrics=metrics, details=details)
    missing = [r for r in ran if r.get("efficiency") is None or r.get("bound") is None]
    if missing:
        what = sorted({r.get("extra", {}).get("peak_dtype") or r.get("dtype") or "memory bandwidth" for r in missing})
        return Outcome.skipped(f"the peak for {device!r} ({peak.entry}) has no figure for {', '.join(what)}, so "
                               f"{row_label(missing[0])} has no efficiency; {ADD_PEAK_HINT}",
                               metrics=metrics, details=details)
    shown = "; ".join(describe_row(r) for r in ran[:4]) + (f"; … {len(ran) - 4} more rows" if len(ran) > 4 else "")
    basis = " (memory reference measured here, not a datasheet figure)" if peak.memory_bw_basis == "measured" \
        and any(r["bound"] in ("memory", "network") for r in ran) else ""
    # Above 100 % is not an error but a finding about the ceiling: a clock read below the
    # real one (a VM's 'cpu MHz'), a cache-resident problem, or a wrong peak entry.
    over = [r for r in ran if r["efficiency"] > OVER_PEAK]
    over_note = (f"; above 100 % of the peak: {', '.join(row_label(r) for r in over[:3])} (the data fit in a cache, "
                 "or the peak understates this device: check its derivation or entry)") if over else ""
    if over:
        details["above_peak"] = [row_label(r) for r in over]
    return Outcome.passed(f"{shown}{basis}{over_note}{skipped_note}", metrics=metrics, details=details)


def headline(metrics: dict[str, Any], prefix: str, row: dict[str, Any]) -> None:
    """Flat metrics of one row: ``<prefix>_tflops`` / ``_gbps`` / ``_efficiency``."""
    ach = row.get("achieved") or {}
    if ach.get("flops_per_s"):
        metrics[f"{prefix}_tflops"] = ach["flops_per_s"] / 1e12
    if ach.get("bytes_per_s") and row.get("bound") != "compute":
        metrics[f"{prefix}_gbps"] = ach["bytes_per_s"] / 1e9
    if row.get("efficiency") is not None:
        metrics[f"{prefix}_efficiency"] = row["efficiency"]
