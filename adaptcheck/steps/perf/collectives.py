"""``perf.collectives``: algbw and busbw of the collectives vLLM uses, timed by rank processes
through step 4's launcher in bench mode, as micro-benchmark rows (bound ``network``, efficiency
busbw over the interconnect). Definitions and status: docs/cluster.md ("How collectives are
checked and timed") and docs/perf.md ("Micro-benchmark outcome").
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from adaptcheck.base.dtypes import ITEMSIZE, FloatDtype
from adaptcheck.base.plugins import class_ref, import_root
from adaptcheck.base.schemas.micro_evidence import MicroEvidence, MicroRow, RankRecord
from adaptcheck.collectives.bandwidth import collective_row, elements_for_bytes
from adaptcheck.collectives.launch import BenchSettings, LaunchResult, WorkerConfig, launch
from adaptcheck.collectives.plan import resolve_world_size
from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.perf.micro import MIB, Params, not_run_row
from adaptcheck.perf.peaks import Peak
from adaptcheck.perf.timing import SYNC, summarize
from adaptcheck.steps.perf.common import Metrics, TimedParams, headline, resolve_peak, verdict

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]


def _default_ops() -> list[CollectiveOp]:
    return ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def _default_dtypes() -> list[FloatDtype]:
    return ["bf16"]


class CollectivesBenchParams(TimedParams):
    """Which collectives to time, at which sizes, on how many ranks."""

    ops: list[CollectiveOp] = Field(
        default_factory=_default_ops, min_length=1,
        description="Collectives to time (the four tensor/expert parallelism uses).")
    dtypes: list[FloatDtype] = Field(
        default_factory=_default_dtypes, min_length=1,
        description="Dtypes (bf16: what vLLM reduces activations in); undeclared ones are not_run rows.")
    sizes_mib: list[float] | None = Field(
        default=None, description="Full-tensor sizes S (MiB, as nccl-tests' -b/-e). None: [1, 32] on a host CPU, "
                                  "[1, 256] on accelerators (busbw reaches its plateau only for large messages).")
    world_size: int | None = Field(
        default=None, ge=2, le=1024,
        description="Ranks. None: every device on an accelerator (one device → not applicable), 2 on a host CPU.")
    budget_s: float = Field(default=0.5, ge=0, le=600, description="Timed wall time per (op, dtype, size) once "
                                                                   "min_reps are done; 0: exactly min_reps.")
    max_reps: int = Field(default=50, ge=1, le=100_000, description="Most timed repetitions per case.")
    timeout_s: float = Field(default=120, gt=0, le=24 * 3600,
                             description="Deadline for the whole multi-process run; ranks still running are killed "
                                         "and the check is an error naming them. Keep it below the ladder's limit.")

    @field_validator("sizes_mib")
    @classmethod
    def _sizes(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or any(not 0 < v <= 1 << 16 for v in value)):
            raise ValueError("sizes_mib: one or more sizes > 0 and at most 65536 MiB")
        return value


def rank_failures(launched: LaunchResult) -> str:
    """'' when every rank ended cleanly, else which rank died or hung and its last words."""
    bad = [e for e in launched.exits if e.returncode != 0 or e.killed]
    if not bad:
        return ""
    parts = []
    for e in bad[:3]:
        how = f"killed ({e.killed})" if e.killed else f"exited with {e.returncode}"
        parts.append(f"rank {e.rank} {how}" + (f": {e.stuck_at or e.last_line}" if (e.stuck_at or e.last_line) else ""))
    return "; ".join(parts)


def bench_rows(cases: list[tuple[str, str, int]], launched: LaunchResult, world_size: int,
               peak: Peak | None) -> list[MicroRow]:
    """One row per case from every rank's ``bench`` record (the slowest rank's median)."""
    by_key: dict[str | None, dict[int, RankRecord]] = {}
    for rank, recs in launched.records.items():
        for rec in recs:
            if rec.event == "bench":
                by_key.setdefault(rec.key, {})[rank] = rec
    rows = []
    for op, dtype, n in cases:
        got = by_key.get(f"{op}/{dtype}/{n}", {})
        params: Params = {"op": op, "world_size": world_size, "elements_per_rank": n}
        name = f"{op} {dtype} {n} elements/rank"
        errors = [r for r in got.values() if r.status != "ok"]
        if errors:
            raised = any(r.status == "raised" for r in errors)
            rows.append(not_run_row(name, dtype, params, ("" if raised else "not supported: ")
                                    + (errors[0].error or "?"), raised=raised))
        elif len(got) < world_size:
            rows.append(not_run_row(name, dtype, params, f"ranks {sorted(set(range(world_size)) - set(got))} "
                                                         "never reported it (died or hung there)", raised=True))
        else:
            timings = {rank: summarize(rec.samples or [], inner=rec.inner or 1, warmup=rec.warmup or 0, timer=SYNC)
                       for rank, rec in got.items()}
            slowest = max(timings.values(), key=lambda t: t.median)
            rows.append(collective_row(op, dtype, world_size, n, ITEMSIZE[dtype], slowest, peak,
                                       rank_medians=[timings[r].median for r in sorted(timings)]))
    return rows


class CollectivesBenchCheck(Check):
    """algbw and busbw of the collectives (nccl-tests definitions) against the interconnect."""

    kind = "perf.collectives"
    step = 5
    description = ("Collectives' algbw and busbw (nccl-tests definitions), one process per device (2 gloo ranks on "
                   "a CPU), with efficiency against the interconnect.")
    params_model = CollectivesBenchParams

    def run(self, ctx: CheckContext, params: CollectivesBenchParams) -> Outcome:
        backend = ctx.backend
        ws, why = resolve_world_size(backend, ctx.device_count, params.world_size)
        if ws is None:
            return Outcome.skipped(why, applicable=params.world_size is not None,
                                   details=MicroEvidence(benchmark="collectives", device_count=ctx.device_count).dump())
        peak = resolve_peak(ctx, params.peaks_file)
        sizes = params.sizes_mib or ([1, 256] if backend.is_accelerator else [1, 32])
        rows: list[MicroRow] = []
        cases: list[tuple[str, str, int]] = []
        for op in params.ops:
            for dtype in params.dtypes:
                for size in sizes:
                    n = elements_for_bytes(op, ws, int(size * MIB), ITEMSIZE[dtype])
                    if dtype in ("bf16", "fp16") and dtype not in backend.dtypes:
                        rows.append(not_run_row(f"{op} {size:g} MiB", dtype, {"op": op},
                                                f"{backend.name} does not declare {dtype}"))
                    else:
                        cases.append((op, dtype, n))
        launched = None
        if cases:
            ref = class_ref(type(backend))
            root = import_root(ref.partition(":")[0])
            config = WorkerConfig(mode="bench", backend=backend.name, backend_class=ref, ops=list(params.ops),
                                  dtypes=list(params.dtypes), elements=[], cases=cases, impl=None,
                                  timeout_s=params.timeout_s,
                                  bench=BenchSettings(warmup=params.warmup, min_reps=params.min_reps,
                                                      max_reps=params.max_reps, budget_s=params.budget_s))
            ctx.run_dir.mkdir(parents=True, exist_ok=True)
            logs = Path(tempfile.mkdtemp(prefix="perf-collectives-", dir=ctx.run_dir))
            launched = launch(config, ws, timeout_s=params.timeout_s, crash_grace_s=5, logs_dir=logs,
                              extra_pythonpath=[root] if root else [])
            rows = bench_rows(cases, launched, ws, peak) + rows
        metrics: Metrics = {"world_size": ws, "library": backend.collective_library}
        largest: dict[tuple[str | None, str | None], MicroRow] = {}
        for row in rows:
            if row.status == "ok":
                key = (row.extra.op, row.dtype)
                if key not in largest or (row.bytes or 0) > (largest[key].bytes or 0):
                    largest[key] = row
        for (op_name, dtype_name), row in largest.items():
            headline(metrics, f"{op_name}_{dtype_name}", row)
            if row.extra.busbw is not None:  # None: the timing was unusable (the verdict fails the row)
                metrics[f"{op_name}_{dtype_name}_busbw_gbps"] = row.extra.busbw / 1e9
        notes = [(f"{ws} {backend.collective_library} ranks; algbw = S/t, busbw = algbw × 2(n-1)/n (all_reduce) "
                  "or (n-1)/n (all_gather, reduce_scatter, all_to_all); t = the slowest rank's median")]
        if launched is not None:
            metrics["wall_s"] = round(launched.wall_s, 3)
            crash = rank_failures(launched)
            if crash:
                out = verdict(ctx, "collectives", rows, peak, metrics, notes, timer=SYNC)
                return Outcome.errored(crash, metrics=metrics, details={**out.details, "logs_dir": launched.logs_dir})
        return verdict(ctx, "collectives", rows, peak, metrics, notes, timer=SYNC)
