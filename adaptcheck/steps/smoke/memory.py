"""Memory smoke checks: ``smoke.alloc_free``, ``smoke.roundtrip`` (bit-exact copies) and
``smoke.fill_zero`` (patterns in every element, with a positive control).

What each proves: docs/smoke.md (Memory checks).
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.dtypes import ALL_DTYPES, DeviceDtype, is_fnuz, torch_dtype
from adaptcheck.base.schemas.smoke_evidence import (
    AllocCycle,
    AllocFreeEvidence,
    BitDiffEvidence,
    FillPhase,
    FillZeroEvidence,
    PositiveControl,
    RoundTripEvidence,
    RoundTripRow,
)
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.smoke.numerics import bit_diff, pattern_tensor
from adaptcheck.steps.smoke.ops import SmokeCheck, timed

if TYPE_CHECKING:
    import torch

MIB = 1 << 20


def process_rss_bytes() -> int | None:
    """Resident set size of this process (Linux /proc), None where unreadable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# --- alloc / free -------------------------------------------------------------------------

class AllocFreeParams(BaseModel):
    """How much to allocate and how often."""

    model_config = ConfigDict(extra="forbid")

    size_mib: float = Field(default=64, gt=0, le=1 << 20, description="Size of each allocation in MiB.")
    repeats: int = Field(default=3, ge=1, le=1000, description="Allocate/release cycles.")
    max_fraction_of_free: float = Field(
        default=0.5, gt=0, le=1,
        description="The size is reduced to this share of free device memory when it would not fit (recorded).")


class AllocFreeCheck(SmokeCheck):
    """Allocate and release device memory; memory returns to its baseline."""

    kind = "smoke.alloc_free"
    description = "Device memory can be allocated, used and released, returning to its baseline."
    params_model = AllocFreeParams

    # Without allocator stats the RSS is noisy (allocator arenas, page cache of imports):
    # demand half the size while held and allow a quarter (at least 32 MiB) left after release.
    RSS_HELD_SHARE = 0.5
    RSS_SLACK_SHARE = 0.25
    RSS_SLACK_MIN = 32 * MIB

    def run(self, ctx: CheckContext, params: AllocFreeParams) -> Outcome:
        import torch

        backend, idx = ctx.backend, ctx.device_index
        size = int(params.size_mib * MIB)
        evidence = AllocFreeEvidence(requested_mib=params.size_mib)
        free = backend.free_memory_bytes(idx)
        if free is not None and size > params.max_fraction_of_free * free:
            size = int(params.max_fraction_of_free * free)
            evidence.reduced_to_mib = size / MIB
            evidence.reason = f"only {free / MIB:.0f} MiB free"
        if size < 1:
            return Outcome.skipped("no free device memory to allocate", details=evidence.dump())
        stats0 = backend.memory_stats(idx)
        mode = "allocator" if "memory_allocated" in stats0 else ("rss" if process_rss_bytes() is not None else "success")
        evidence.evidence = {
            "allocator": "allocator statistics (memory_allocated) of the backend",
            "rss": "process RSS (the backend reports no allocator statistics)",
            "success": "allocation success only (neither allocator statistics nor RSS readable)",
        }[mode]
        backend.synchronize(idx)
        backend.empty_cache()
        before_alloc = backend.memory_stats(idx).get("memory_allocated", 0.0)
        before_rss = process_rss_bytes() or 0
        cycles: list[AllocCycle] = []
        problems: list[str] = []
        size -= size % 8  # whole int64 words: 8× fewer elements to verify than bytes
        for i in range(params.repeats):
            t = torch.empty(size // 8, dtype=torch.int64, device=ctx.device)
            value = 0x0123456789ABCDEF + i  # differs per cycle: a stale buffer handed back is caught
            # Touch every page: an untouched allocation may never be backed by memory.
            self.ops.fill_(t, value)
            backend.synchronize(idx)
            held_alloc = backend.memory_stats(idx).get("memory_allocated", 0.0)
            held_rss = process_rss_bytes() or 0
            wrong = self.ops.count_ne(t, value)
            del t
            backend.synchronize(idx)
            backend.empty_cache()
            after_alloc = backend.memory_stats(idx).get("memory_allocated", 0.0)
            after_rss = process_rss_bytes() or 0
            cycles.append(AllocCycle(held_allocated=held_alloc, after_allocated=after_alloc, held_rss=held_rss,
                                     after_rss=after_rss, wrong_elements=wrong))
            if wrong:
                problems.append(f"cycle {i}: {wrong} words did not hold the value written")
            if mode == "allocator":
                if held_alloc - before_alloc < size:
                    problems.append(f"cycle {i}: allocated grew by {(held_alloc - before_alloc) / MIB:.1f} MiB "
                                    f"while holding {size / MIB:.1f} MiB")
                if after_alloc != before_alloc:
                    problems.append(f"cycle {i}: allocated is {after_alloc / MIB:.1f} MiB after release, "
                                    f"baseline {before_alloc / MIB:.1f} MiB")
            elif mode == "rss":
                if held_rss - before_rss < self.RSS_HELD_SHARE * size:
                    problems.append(f"cycle {i}: RSS grew by {(held_rss - before_rss) / MIB:.1f} MiB while holding "
                                    f"{size / MIB:.1f} MiB")
                if after_rss - before_rss > max(self.RSS_SLACK_MIN, self.RSS_SLACK_SHARE * size):
                    problems.append(f"cycle {i}: RSS is {(after_rss - before_rss) / MIB:.1f} MiB above baseline "
                                    "after release")
        stats_end = backend.memory_stats(idx)
        metrics: dict[str, float | str] = {"size_mib": size / MIB, "repeats": params.repeats, "mode": mode}
        if mode == "allocator":
            metrics.update(allocated_before=before_alloc, allocated_after=cycles[-1].after_allocated,
                           peak_allocated=max(stats_end.get("max_memory_allocated", 0.0),
                                              *(c.held_allocated for c in cycles)))
            if "memory_reserved" in stats_end:
                metrics["reserved_after_empty_cache"] = stats_end["memory_reserved"]
        elif mode == "rss":
            metrics.update(rss_before=before_rss, rss_after=cycles[-1].after_rss,
                           rss_peak=max(c.held_rss for c in cycles))
        evidence.cycles = cycles
        details = evidence.dump()
        if problems:
            return Outcome.failed("; ".join(problems[:3]), metrics=metrics, details=details)
        return Outcome.passed(f"{params.repeats}× {size / MIB:.0f} MiB allocated, written and released "
                              f"(evidence: {mode})", metrics=metrics, details=details)


# --- round trip ---------------------------------------------------------------------------

class RoundTripParams(BaseModel):
    """How many bytes to send, in which dtypes."""

    model_config = ConfigDict(extra="forbid")

    size_mib: float = Field(default=16, gt=0, le=1 << 16, description="Bytes sent in total, split over the dtypes.")
    dtypes: list[DeviceDtype] | None = Field(
        default=None,
        description="Dtypes to send (default: all). Those the backend declares are judged; others are informational.")


class RoundTripCheck(SmokeCheck):
    """Host → device → host is bit-exact."""

    kind = "smoke.roundtrip"
    description = "Host → device → host copies are bit-exact for every declared dtype (NaN, inf, denormal, -0.0)."
    params_model = RoundTripParams

    def run(self, ctx: CheckContext, params: RoundTripParams) -> Outcome:
        names = list(dict.fromkeys(params.dtypes or ALL_DTYPES))
        per_dtype = int(params.size_mib * MIB) // len(names)
        table: dict[str, RoundTripRow] = {}
        failures: list[str] = []
        moved = 0
        h2d_s = d2h_s = 0.0
        for name in names:
            declared = name in ctx.backend.dtypes
            row = RoundTripRow(declared=declared)
            table[name] = row
            try:
                dtype = torch_dtype(name, fnuz=is_fnuz(ctx.backend.fp8_flavour))
                src = pattern_tensor(name, dtype, per_dtype, ctx.generator(f"smoke.roundtrip.{name}"))
                expected = src.clone()
                for label, part, want in (("whole", src, expected), ("offset_view", src[1:], expected[1:])):
                    evidence, problem, t_in, t_out = self._round_trip(ctx, part, want)
                    setattr(row, label, evidence)
                    if label == "whole":
                        moved += part.numel() * part.element_size()
                        h2d_s += t_in
                        d2h_s += t_out
                    if problem:
                        row.ok = False
                        if declared:
                            failures.append(f"{name} {label}: {problem}")
                if not bit_diff(expected, src).exact:
                    row.ok = False
                    if declared:
                        failures.append(f"{name}: the host source tensor was modified by the copy")
                if row.ok is None:
                    row.ok = True
            except Exception as exc:  # noqa: BLE001 - a dtype that cannot be copied is a finding, not a crash
                row.ok, row.error = False, f"{type(exc).__name__}: {exc}"
                if declared:
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
        judged = [n for n in names if table[n].declared]
        metrics = {"bytes": moved, "dtypes_judged": len(judged),
                                   "h2d_gb_s": moved / max(h2d_s, 1e-9) / 1e9, "d2h_gb_s": moved / max(d2h_s, 1e-9) / 1e9}
        record = RoundTripEvidence(dtypes=table)
        if not ctx.backend.is_accelerator:
            record.note = "the device is host memory: the round trip is two host copies"
        details = record.dump()
        if not judged:
            return Outcome.skipped("none of the requested dtypes is declared by the backend", applicable=False,
                                   metrics=metrics, details=details)
        if failures:
            return Outcome.failed("round trip not bit-exact: " + "; ".join(failures[:3]), metrics=metrics, details=details)
        return Outcome.passed(f"bit-exact for {', '.join(judged)} ({moved / MIB:.1f} MiB)", metrics=metrics, details=details)


    def _round_trip(self, ctx: CheckContext, part: torch.Tensor,
                    want: torch.Tensor) -> tuple[BitDiffEvidence, str, float, float]:
        """Send ``part`` to the device and back; (evidence, problem or '', seconds in, seconds out)."""
        dev, t_in = timed(ctx.backend, ctx.device_index, partial(self.ops.to_device, part, ctx.device))
        back, t_out = timed(ctx.backend, ctx.device_index, partial(self.ops.to_host, dev))
        diff = bit_diff(want, back)
        evidence = diff.evidence()
        if dev.device.type != ctx.backend.device_type:
            problem = f"landed on {dev.device}, not on the {ctx.backend.device_type} device"
            evidence.problem = problem
            return evidence, problem, t_in, t_out
        if diff.exact:
            return evidence, "", t_in, t_out
        problem = diff.problem or (f"{diff.mismatched} of {diff.elements} elements changed (first at "
                                   f"{diff.first_index}: sent {diff.expected_bits}, got {diff.got_bits})")
        return evidence, problem, t_in, t_out


# --- fill / zero ----------------------------------------------------------------------------

class FillZeroParams(BaseModel):
    """How large a tensor to fill."""

    model_config = ConfigDict(extra="forbid")

    max_mib: float = Field(default=256, ge=1, le=1 << 20, description="Upper bound of the tensor size in MiB.")
    fraction_of_free: float = Field(default=0.05, gt=0, le=0.8,
                                    description="Share of free device memory to use, when free memory is known.")


FILL_COLS = 512
"""Row width (int64 elements, 4 KiB): the address pattern writes the row index into every row."""
PATTERNS = (0x5A5A5A5A5A5A5A5A, ~0x5A5A5A5A5A5A5A5A)
"""Two complementary bit patterns (0x5A… and 0xA5… as int64): every bit is seen as 0 and as 1.
int64 words halve the elements every device reduction has to visit compared with int32."""
SAMPLE_ROWS = 64


class FillZeroCheck(SmokeCheck):
    """Fill a large device tensor with patterns and zeros; every element verified."""

    kind = "smoke.fill_zero"
    description = "A large device tensor holds written patterns and zeros in every element."
    params_model = FillZeroParams

    def run(self, ctx: CheckContext, params: FillZeroParams) -> Outcome:
        import torch

        free = ctx.backend.free_memory_bytes(ctx.device_index)
        want = params.max_mib * MIB
        sized_by = "max_mib"
        if free is not None and params.fraction_of_free * free < want:
            want, sized_by = params.fraction_of_free * free, "fraction_of_free"
        elif free is None:
            sized_by = "max_mib (free memory unknown)"
        rows = int(want) // (8 * FILL_COLS)
        if rows < 2:
            return Outcome.skipped(f"too little free device memory for a fill test ({want / MIB:.2f} MiB)")
        t = torch.empty((rows, FILL_COLS), dtype=torch.int64, device=ctx.device)
        nbytes = t.numel() * 8
        phases, control, fill_s = self._exercise(ctx, t)
        del t  # released before empty_cache so the memory really goes back
        ctx.backend.empty_cache()
        evidence = FillZeroEvidence(sized_by=sized_by, free_bytes=free, phases={**phases, "positive_control": control})
        seen = control.counted
        fills = evidence.fill_phases
        metrics = {"size_mib": nbytes / MIB, "elements": nbytes // 8,
                   "fill_gb_s": 3 * nbytes / max(fill_s, 1e-9) / 1e9,
                   "mismatches": sum(p.device_mismatches + p.host_sample_mismatches for p in fills.values())}
        details = evidence.dump()
        problems = [f"{k}: {p.device_mismatches} elements wrong on device, {p.host_sample_mismatches} in the "
                    "host read-back" for k, p in fills.items() if p.device_mismatches or p.host_sample_mismatches]
        if seen != 3:
            problems.append(f"positive control: 3 planted mismatches were counted as {seen} "
                            "(the device reduction cannot be trusted)")
        if problems:
            return Outcome.failed("; ".join(problems), metrics=metrics, details=details)
        return Outcome.passed(f"{nbytes / MIB:.0f} MiB filled with 3 patterns and zeroed, every element verified",
                              metrics=metrics, details=details)

    def _exercise(self, ctx: CheckContext, t: torch.Tensor) -> tuple[dict[str, FillPhase], PositiveControl, float]:
        """Fill ``t`` with each pattern, verify, zero, verify, then run the positive control.
        Returns the per-phase evidence, the control's and the seconds spent in fill/zero."""
        import torch

        rows = t.shape[0]
        sample = torch.unique(torch.linspace(0, rows - 1, min(rows, SAMPLE_ROWS)).round().long())
        sample_d = sample.to(ctx.device)
        phases: dict[str, FillPhase] = {}
        fill_s = 0.0
        for value in PATTERNS:
            _, s = timed(ctx.backend, ctx.device_index, partial(self.ops.fill_, t, value))
            fill_s += s
            phases[f"pattern_{value & 0xFFFFFFFFFFFFFFFF:016x}"] = self._verify(
                t, sample_d, value, torch.full((sample.numel(), FILL_COLS), value, dtype=torch.int64))
        row_ids = torch.arange(rows, dtype=torch.int64, device=ctx.device).unsqueeze(1)
        self.ops.copy_(t, row_ids.expand(rows, FILL_COLS))
        phases["row_index"] = self._verify(t, sample_d, row_ids, sample.unsqueeze(1).expand(-1, FILL_COLS))
        del row_ids
        _, s = timed(ctx.backend, ctx.device_index, lambda: self.ops.zero_(t))
        fill_s += s
        phases["zero"] = self._verify(t, sample_d, 0, torch.zeros((sample.numel(), FILL_COLS), dtype=torch.int64))

        # Positive control: a mismatch count that cannot see errors would pass any fill.
        flat = t.view(-1)
        planted = torch.tensor([0, flat.numel() // 2, flat.numel() - 1], device=ctx.device)
        flat.index_fill_(0, planted, 7)
        seen = self.ops.count_ne(t, 0)
        flat.index_fill_(0, planted, 0)
        return phases, PositiveControl(planted=3, counted=seen), fill_s

    def _verify(self, t: torch.Tensor, sample_rows: torch.Tensor, expected: torch.Tensor | int,
                expected_host: torch.Tensor) -> FillPhase:
        """Mismatches over every element (counted on the device) and over a host read-back of
        sample rows (so the verdict never rests on the device reduction alone)."""
        wrong = self.ops.count_ne(t, expected)
        back = self.ops.to_host(t.index_select(0, sample_rows))
        host_wrong = int((back != expected_host).sum().item())
        return FillPhase(device_mismatches=wrong, host_sample_mismatches=host_wrong, host_sample_elements=back.numel())
