"""Gathered per-rank outcomes → :class:`~.models.MultinodeCollectives` (pure, no
torch.distributed): the payloads validated as
:class:`~adaptcheck.base.schemas.micro_evidence.RankPayload`, the exactness verdict step 4's own
(:func:`~adaptcheck.collectives.plan.summarize`, so one machine and many never disagree on the
same records), bandwidths as nccl-tests define them. Details: docs/cluster.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, cast

from adaptcheck.base.dtypes import ITEMSIZE
from adaptcheck.base.schemas.micro_evidence import RankPayload, RankRecord
from adaptcheck.cluster.env import EXIT_OK, EXIT_WRONG
from adaptcheck.cluster.models import (
    BenchResult,
    BenchStatus,
    CaseResult,
    MultinodeCollectives,
    NodeInfo,
    RankEvidence,
    RankInfo,
    ReportStatus,
    Settings,
    SlowestRank,
)
from adaptcheck.collectives.bandwidth import busbw_factor, full_tensor_bytes
from adaptcheck.collectives.launch import LaunchResult, RankExit
from adaptcheck.collectives.plan import Plan, merge_rows, summarize
from adaptcheck.perf.timing import summarize as timing_of

STATUS_EXIT = {"pass": EXIT_OK, "fail": EXIT_WRONG, "skip": EXIT_WRONG}
"""Exit code of each verdict when every rank reported (skip: nothing was verified, never a 0)."""


@dataclass(frozen=True)
class RunInfo:
    """What rank 0 knows about the job besides the payloads."""

    started_at: datetime
    wall_s: float
    adaptcheck_version: str
    torch_version: str | None
    backend: str
    world_size: int
    master: str
    run_id: str | None


def node_key(node_rank: int | None, hostname: str) -> str:
    """How a node is named: by torchrun's node rank, else (another launcher) by its hostname."""
    return f"node {node_rank}" if node_rank is not None else hostname


def rank_infos(payloads: list[RankPayload]) -> list[RankInfo]:
    return sorted((RankInfo(rank=p.rank, local_rank=p.local_rank, node_rank=p.node_rank, hostname=p.hostname,
                            device=p.device, pid=p.pid, init_s=p.init_s)
                   for p in payloads), key=lambda r: r.rank)


def nodes_of(ranks: list[RankInfo]) -> list[NodeInfo]:
    """Ranks grouped by node, nodes ordered by node rank (then hostname)."""
    groups: dict[str, list[RankInfo]] = {}
    for r in ranks:
        groups.setdefault(node_key(r.node_rank, r.hostname), []).append(r)
    nodes = [NodeInfo(node=key, node_rank=rs[0].node_rank, hostname=rs[0].hostname, ranks=[r.rank for r in rs],
                      devices=[r.device for r in rs]) for key, rs in groups.items()]
    return sorted(nodes, key=lambda n: (n.node_rank if n.node_rank is not None else 1 << 30, n.hostname))


def bench_results(cases: list[tuple[str, str, int]], skipped: list[tuple[str, str, int, str]],
                  payloads: list[RankPayload], world_size: int) -> list[BenchResult]:
    """One row per timed case: t = the slowest rank's median, algbw = S / t, busbw = algbw × factor."""
    by_key: dict[str | None, dict[int, RankRecord]] = {}
    for p in payloads:
        for rec in p.bench:
            by_key.setdefault(rec.key, {})[p.rank] = rec
    rows: list[BenchResult] = []
    for op, dtype, n in cases:
        factor, size = busbw_factor(op, world_size), full_tensor_bytes(op, world_size, n, ITEMSIZE[dtype])
        base = BenchResult(op=op, dtype=dtype, elements_per_rank=n, busbw_factor=factor, bytes=size, status="ok")
        got = by_key.get(f"{op}/{dtype}/{n}", {})
        bad = [rec for rec in got.values() if rec.status != "ok"]
        if bad:
            status: BenchStatus = "raised" if any(rec.status == "raised" for rec in bad) else "unsupported"
            rows.append(base.model_copy(update={"status": status, "error": bad[0].error or "?"}))
        elif len(got) < world_size:
            missing = sorted(set(range(world_size)) - set(got))
            rows.append(base.model_copy(update={"status": "incomplete", "error": f"ranks {missing} never reported it"}))
        else:
            medians = {rank: timing_of(rec.samples or []).median for rank, rec in sorted(got.items())}
            slowest = max(medians, key=lambda r: medians[r])
            t = medians[slowest]
            algbw = size / t if t > 0 else None
            rows.append(base.model_copy(update={
                "time_s": t, "slowest_rank": slowest, "rank_median_s": medians,
                "algbw_gbps": algbw / 1e9 if algbw else None, "busbw_gbps": algbw * factor / 1e9 if algbw else None}))
    for op, dtype, n, why in skipped:
        rows.append(BenchResult(op=op, dtype=dtype, elements_per_rank=n, busbw_factor=busbw_factor(op, world_size),
                                bytes=full_tensor_bytes(op, world_size, n, ITEMSIZE[dtype]), status="skipped",
                                error=why))
    return rows


def slowest_rank(bench: list[BenchResult], payloads: list[RankPayload], ranks: list[RankInfo]) -> SlowestRank | None:
    """The rank with the largest total time: over the timed cases every rank completed, else
    over the exactness check's single calls. None with fewer than two ranks timed."""
    totals: dict[int, float] = {}
    basis: Literal["bench", "check"] = "bench"
    complete = [b for b in bench if b.status == "ok"]
    for b in complete:
        for rank, t in b.rank_median_s.items():
            totals[rank] = totals.get(rank, 0.0) + t
    if not complete:
        basis = "check"
        for p in payloads:
            times = [r.time_s for r in p.records if r.time_s is not None]
            if times:
                totals[p.rank] = sum(times)
    if len(totals) < 2:
        return None
    worst, best = max(totals, key=lambda r: totals[r]), min(totals.values())
    info = next(r for r in ranks if r.rank == worst)
    return SlowestRank(rank=worst, node=node_key(info.node_rank, info.hostname), hostname=info.hostname,
                       total_s=totals[worst], fastest_total_s=best, ratio=totals[worst] / best if best > 0 else 1.0,
                       basis=basis)


def _where(ranks: list[RankInfo], rank: int) -> str:
    info = next((r for r in ranks if r.rank == rank), None)
    return f"rank {rank} ({node_key(info.node_rank, info.hostname)}, {info.hostname})" if info else f"rank {rank}"


def build_report(info: RunInfo, plan: Plan, settings: Settings, gathered: Sequence[Mapping[str, object]],
                 bench_cases: list[tuple[str, str, int]], bench_skipped: list[tuple[str, str, int, str]],
                 *, failure: tuple[int, str] | None = None) -> MultinodeCollectives:
    """The report from whatever reached rank 0.

    ``failure`` (exit code, one-line reason) is set when the run could not finish (group never
    formed, peer lost): the report is then an ``error`` with that code — unless a wrong result
    was already seen, which is conclusive by itself and exits 1 (step 4's policy).
    ``gathered``: each rank's :class:`RankPayload` as ``all_gather_object`` brought it (validated here).
    """
    payloads = [RankPayload.parse(p, where=f"payload {i} gathered from the ranks") for i, p in enumerate(gathered)]
    ranks = rank_infos(payloads)
    records = {p.rank: list(p.records) for p in payloads}
    reported = {p.rank for p in payloads}
    exits = [RankExit(rank=r, returncode=0) for r in sorted(reported)]
    outcome = summarize(plan, LaunchResult(records=records, exits=exits, wall_s=info.wall_s, logs_dir=""))
    rows = merge_rows(plan, records)
    if failure is not None:  # keep what ran; the cases nobody reached are not findings
        rows = [row for row in rows if row["status"] != "incomplete" or len(row.get("missing_ranks", [])) < plan.world_size]
    cases = [CaseResult(op=row["op"], dtype=row["dtype"], elements=row["elements"],
                        bytes_per_rank=row["bytes_per_rank"], status=row["status"], time_s=row["time_s"],
                        ranks={r: RankEvidence(**facts) for r, facts in row.get("ranks", {}).items()},
                        missing_ranks=row.get("missing_ranks", [])) for row in rows]
    bench = bench_results(bench_cases, bench_skipped, payloads, plan.world_size)
    nodes = nodes_of(ranks)
    status: ReportStatus = outcome.status.value
    message = outcome.message
    wrong = any(c.status == "mismatch" for c in cases)
    if failure is not None and not wrong:
        status, code, message = "error", failure[0], failure[1]
    elif failure is not None:
        code, message = EXIT_WRONG, f"{message}; then {failure[1]}"
    elif status == "error":  # every rank reported, yet a case is missing: a defect of this command
        code = 70
    else:
        code = STATUS_EXIT[status]
    if status in ("pass", "fail") and failure is None:
        message = f"{message} across {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    # Name the node and host of each rank that went wrong: that is where to look.
    message = re.sub(r"\bon rank (\d+)\b", lambda m: f"on {_where(ranks, int(m.group(1)))}", message)
    return MultinodeCollectives(
        status=status, exit_code=code, message=message, started_at=info.started_at,
        wall_s=round(info.wall_s, 3), adaptcheck_version=info.adaptcheck_version, torch_version=info.torch_version,
        backend=info.backend, dist_backend=plan.dist_backend, library=plan.library, world_size=plan.world_size,
        nnodes=len(nodes), master=info.master, run_id=info.run_id, nodes=nodes, ranks=ranks,
        missing_ranks=[r for r in range(plan.world_size) if r not in reported],
        on_unsupported=cast(Literal["fail", "report"], plan.on_unsupported), skipped_dtypes=plan.skipped_dtypes,
        cases=cases, bench=bench, slowest_rank=slowest_rank(bench, payloads, ranks), settings=settings)
