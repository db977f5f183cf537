"""What a collectives run checks and what its ranks' records mean: :class:`CollectivesParams`
(shared by ``framework.collectives``, ``perf.collectives`` and ``cluster collectives``),
:func:`make_plan` (the dtypes checkable exactly on a backend), :func:`merge_rows` (one row per
op × dtype × size from every rank's records) and :func:`summarize` (the verdict). Status
policy: docs/cluster.md ("How collectives are checked and timed", Status policy).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adaptcheck.base.dtypes import ITEMSIZE, CollectiveDtype
from adaptcheck.base.schemas.micro_evidence import CaseStatus, RankRecord
from adaptcheck.collectives.exact import (
    DEFAULT_DTYPES,
    OPS,
    broadcast_source,
    buffer_sizes,
    value_scale,
)
from adaptcheck.collectives.launch import LaunchResult
from adaptcheck.ladder.check import Outcome

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend

# --- params -------------------------------------------------------------------------------

class CollectivesParams(BaseModel):
    """Which collectives to check, with how many ranks, sizes and dtypes."""

    model_config = ConfigDict(extra="forbid")

    ops: list[str] = Field(
        default_factory=lambda: list(OPS),
        description=f"Collectives to check, in this order; any of {', '.join(OPS)}.")
    world_size: int | None = Field(
        default=None, ge=2, le=1024,
        description="Ranks (one process per device). None: the backend's device count on an accelerator "
                    "(one device → not applicable), 2 on a non-accelerator backend (CPU: 2 gloo ranks on loopback).")
    elements: list[int] = Field(
        default_factory=lambda: [1, 1031, 1_048_583],
        description="Per-rank chunk sizes in elements, each run for every op and dtype: size 1, an odd small "
                    "size and an odd ~1M size, since libraries switch algorithms/protocols by message size. "
                    "all_gather/reduce_scatter/all_to_all move world_size × this.")
    dtypes: list[CollectiveDtype] = Field(
        default_factory=lambda: list(DEFAULT_DTYPES),
        description="Dtypes, each with integer values small enough for exact sums (fp32 < 2^24, bf16 < 2^8 …). "
                    "bf16/fp16 run only where the backend declares them; an integer dtype the library lacks "
                    "is reported as unsupported.")
    on_unsupported: Literal["fail", "report"] | None = Field(
        default=None,
        description="What an op/dtype the library reports as unsupported costs: 'fail', or 'report' (listed, "
                    "check passes on the rest). None: 'fail' on accelerator backends, 'report' otherwise.")
    timeout_s: float = Field(
        default=90, gt=0, le=24 * 3600,
        description="Deadline for the whole multi-process run (start-up, rendezvous, every op); ranks still "
                    "running then are killed and the check is an error naming the rank and op (the process "
                    "group's own timeout is set 60 s later, as a backstop). Keep it below the ladder's time "
                    "limit for the check (default 120 s), or the runner kills the check first, with less evidence.")
    crash_grace_s: float = Field(
        default=5, ge=0, le=600,
        description="After one rank dies, how long the others get to finish or fail on their own before "
                    "they are killed (a peer's death usually leaves them blocked in a collective).")
    impl: str | None = Field(
        default=None, pattern=r"^[\w.]+:[\w.]+$",
        description="For tests and vendor overrides only: 'module:object' replacing the torch.distributed "
                    "implementation of the ops (a subclass of TorchCollectives, or a factory returning one).")

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, value: list[str]) -> list[str]:
        unknown = [op for op in value if op not in OPS]
        if unknown:
            raise ValueError(f"unknown collective(s) {', '.join(map(repr, unknown))}; valid: {', '.join(OPS)}")
        if not value:
            raise ValueError(f"at least one collective is needed; valid: {', '.join(OPS)}")
        if len(set(value)) != len(value):
            raise ValueError("each collective may appear once")
        return value

    @field_validator("elements")
    @classmethod
    def _sizes(cls, value: list[int]) -> list[int]:
        if not value or any(n < 1 or n > 1 << 28 for n in value):
            raise ValueError("elements: one or more sizes between 1 and 2^28")
        return value

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, value: list[str]) -> list[str]:
        if not value or len(set(value)) != len(value):
            raise ValueError("dtypes: one or more distinct dtype names")
        return value


# --- verdict ------------------------------------------------------------------------------

class RankFacts(TypedDict, total=False):
    """What a rank that was not ok recorded for one table row (only the facts it had)."""

    mismatches: int
    first_index: int
    got: int | float | str
    expected: int | float | str
    error: str


class _CaseRowCore(TypedDict):
    op: str
    dtype: str
    elements: int
    bytes_per_rank: int
    status: CaseStatus
    time_s: float | None


class CaseRow(_CaseRowCore, total=False):
    """One op × dtype × size of the table (``details.table[]`` of ``framework.collectives``)."""

    ranks: dict[int, RankFacts]
    missing_ranks: list[int]


def rank_facts(rec: RankRecord) -> RankFacts:
    """The facts of a rank's record that a table row keeps, in the order the row shows them."""
    facts: RankFacts = {}
    if rec.mismatches is not None:
        facts["mismatches"] = rec.mismatches
    if rec.first_index is not None:
        facts["first_index"] = rec.first_index
    if rec.got is not None:
        facts["got"] = rec.got
    if rec.expected is not None:
        facts["expected"] = rec.expected
    if rec.error is not None:
        facts["error"] = rec.error
    return facts


def case_status(statuses: list[str | None], complete: bool) -> CaseStatus:
    """A row's status from its ranks' (see :func:`merge_rows`)."""
    if "mismatch" in statuses:
        return "mismatch"
    if not complete:
        return "incomplete"
    if "raised" in statuses:
        return "raised"
    if "unsupported" in statuses:
        return "unsupported"
    if all(s == "ok" for s in statuses):
        return "ok"
    return "incomplete"  # a status this version does not know: never count it as a pass

def _signal_text(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _where(records: list[RankRecord]) -> str:
    """What a rank was doing when it stopped: the op begun but not finished, or its phase."""
    begun = None
    for rec in records:
        if rec.event == "begin":
            begun = rec
        elif rec.event == "op" and begun is not None and rec.key == begun.key:
            begun = None
    if begun is not None:
        return f"in {begun.op} ({begun.dtype}, {begun.elements} elements)"
    events = [r.event for r in records]
    if "done" in events:
        return "after finishing"
    if "ready" in events:
        return "between ops"
    if "start" in events:
        return "during rendezvous"
    return "before start-up finished"


@dataclass
class Plan:
    """What the check asked the ranks to run (and what it left out, with why)."""

    ops: list[str]
    dtypes: list[str]
    elements: list[int]
    world_size: int
    library: str
    dist_backend: str
    on_unsupported: str
    skipped_dtypes: dict[str, str] = field(default_factory=dict)


def merge_rows(plan: Plan, records: dict[int, list[RankRecord]]) -> list[CaseRow]:
    """One row per (op, dtype, elements) with each rank's result folded in.

    Row status: ``mismatch`` (some rank got a wrong element: conclusive whatever else
    happened) > ``incomplete`` (some rank never reported it — it died or hung there, and what
    its peers raised, e.g. "connection closed by peer", is a consequence, kept as evidence) >
    ``raised`` > ``unsupported`` > ``ok`` (every rank matched).
    """
    by_key: dict[str | None, dict[int, RankRecord]] = {}
    for rank, recs in records.items():
        for rec in recs:
            if rec.event == "op":
                by_key.setdefault(rec.key, {})[rank] = rec
    rows: list[CaseRow] = []
    for op in plan.ops:
        for dtype in plan.dtypes:
            for n in plan.elements:
                key = f"{op}/{dtype}/{n}"
                got = by_key.get(key, {})
                times = [rec.time_s for rec in got.values() if rec.time_s is not None]
                row: CaseRow = {"op": op, "dtype": dtype, "elements": n, "bytes_per_rank": n * ITEMSIZE[dtype],
                                "status": case_status([rec.status for rec in got.values()],
                                                      len(got) >= plan.world_size),
                                # a collective is as slow as its slowest rank
                                "time_s": max(times) if times else None}
                bad = {r: rank_facts(rec) for r, rec in sorted(got.items()) if rec.status != "ok"}
                if bad:
                    row["ranks"] = bad
                missing = [r for r in range(plan.world_size) if r not in got]
                if missing and row["status"] != "ok":
                    row["missing_ranks"] = missing
                rows.append(row)
    return rows


def summarize(plan: Plan, launched: LaunchResult) -> Outcome:
    """The verdict (see the module docstring's status policy)."""
    rows = merge_rows(plan, launched.records)
    ws = plan.world_size
    metrics: dict[str, float | str] = {"world_size": ws, "library": plan.library, "wall_s": round(launched.wall_s, 3)}
    for op in plan.ops:
        times = [r["time_s"] for r in rows if r["op"] == op and r["time_s"] is not None]
        if times:
            metrics[f"{op}_s"] = round(sum(times), 6)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("ok", "mismatch", "raised", "unsupported",
                                                                      "incomplete")}
    metrics.update({f"rows_{k}": v for k, v in counts.items()})
    inits = [r.init_s for rs in launched.records.values() for r in rs if r.event == "ready" and r.init_s is not None]
    if inits:
        metrics["rendezvous_s"] = round(max(inits), 3)
    ranks = []
    for e in launched.exits:
        recs = launched.records.get(e.rank, [])
        start = next((r for r in recs if r.event == "start"), RankRecord(event="start"))
        ranks.append({"rank": e.rank, "device": start.device, "pid": start.pid,
                      "exit": _signal_text(e.returncode), "killed": e.killed, "last_line": e.last_line,
                      "stuck_at": e.stuck_at or None, "ended_s": e.ended_s, "log": e.log})
    apis = next((r.apis for rs in launched.records.values() for r in rs if r.event == "ready"), None)
    details: dict[str, Any] = {
        "table": rows, "ranks": ranks, "dist_backend": plan.dist_backend, "library": plan.library,
        "on_unsupported": plan.on_unsupported, "broadcast_src": broadcast_source(ws),
        "torch_apis": apis, "logs_dir": launched.logs_dir,
        "values": "rank r holds r*K + (i mod K) + 1, K chosen per dtype so sums stay exactly representable; "
                  "outputs start as -1; comparison is exact",
    }
    if plan.skipped_dtypes:
        details["skipped_dtypes"] = plan.skipped_dtypes
    if launched.notes:
        details["notes"] = launched.notes

    def label(r: CaseRow) -> str:
        return f"{r['op']} ({r['dtype']}, {r['elements']} elements)"

    mismatched = [r for r in rows if r["status"] == "mismatch"]
    raised = [r for r in rows if r["status"] == "raised"]
    unsupported = [r for r in rows if r["status"] == "unsupported"]
    troubled = [e for e in launched.exits if e.returncode != 0 or e.killed]
    problems: list[str] = []
    for r in mismatched[:3]:
        bad = {k: v for k, v in r.get("ranks", {}).items() if v.get("mismatches")}
        rank, info = next(iter(bad.items()))
        problems.append(f"{label(r)} wrong on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}: "
                        f"{info['mismatches']} of {buffer_sizes(r['op'], ws, r['elements'])[1]} elements differ, "
                        f"first at [{info['first_index']}] = {info['got']} (expected {info['expected']}) "
                        f"on rank {rank}")
    for r in raised[:3]:
        rank, info = next(iter(r.get("ranks", {}).items()))
        problems.append(f"{label(r)} raised on rank {rank}: {info.get('error', '?')}")
    unsupported_ops = sorted({f"{r['op']}/{r['dtype']}" for r in unsupported})
    if unsupported and plan.on_unsupported == "fail":
        problems.append(f"not supported by {plan.library}: {', '.join(unsupported_ops)}")
    note_unsupported = (f"; not supported by {plan.library} (reported, not failed): {', '.join(unsupported_ops)}"
                        if unsupported and plan.on_unsupported == "report" else "")

    crash = ""
    if troubled:
        # The rank that died first by itself is the cause; the ones killed afterwards (or that
        # died of losing a peer) were waiting on it — so they come later in the message.
        troubled.sort(key=lambda e: (e.killed is not None, e.ended_s if e.ended_s is not None else 1e18, e.rank))
        parts = []
        for e in troubled[:3]:
            where = _where(launched.records.get(e.rank, []))
            if e.killed == "timeout":
                limit = launched.timeout_s if launched.timeout_s is not None else launched.wall_s
                what = f"rank {e.rank} hung {where}: killed at the {limit:g} s deadline"
            elif e.killed:
                what = f"rank {e.rank} killed {where} ({e.killed})"
            else:
                what = f"rank {e.rank} {_signal_text(e.returncode)} {where}"
            if e.stuck_at:
                what += f", stuck at {e.stuck_at}"
            parts.append(what + (f"; last line: {e.last_line}" if e.last_line and not e.stuck_at else ""))
        crash = "; ".join(parts)

    if problems:
        return Outcome.failed("; ".join(problems) + (f"; also {crash}" if crash else ""), metrics=metrics,
                              details=details)
    if crash:
        return Outcome.errored(crash, metrics=metrics, details=details)
    ran = [r for r in rows if r["status"] == "ok"]
    incomplete = [r for r in rows if r["status"] == "incomplete"]
    if incomplete:  # every rank exited 0 but some row has no record: the worker is broken
        return Outcome.errored(f"{len(incomplete)} op runs were never reported, first {label(incomplete[0])}",
                               metrics=metrics, details=details)
    if not ran:
        return Outcome.skipped(f"no collective ran: every op was unsupported by {plan.library}"
                               f" ({', '.join(unsupported_ops)})", metrics=metrics, details=details)
    ops_ok = [op for op in plan.ops if any(r["op"] == op for r in ran)]
    skipped = f"; dtypes not checked: {', '.join(f'{d} ({why})' for d, why in plan.skipped_dtypes.items())}" \
        if plan.skipped_dtypes else ""
    return Outcome.passed(
        f"{', '.join(ops_ok)} exact on {ws} {plan.library} ranks ({len(ran)} op runs: "
        f"{', '.join(plan.dtypes)} × {len(plan.elements)} sizes){note_unsupported}{skipped}",
        metrics=metrics, details=details)


# --- planning -----------------------------------------------------------------------------

def resolve_world_size(backend: Backend, device_count: int, requested: int | None) -> tuple[int | None, str]:
    """(world size, reason if none). One device on an accelerator → None (not applicable)."""
    if not backend.is_accelerator:
        return (requested or 2), ""
    if requested is None:
        if device_count < 2:
            return None, (f"collectives need more than one device; {device_count} {backend.display_name} "
                          "device visible")
        return device_count, ""
    if requested > device_count:
        return None, f"world_size {requested} asks for more devices than the {device_count} visible"
    return requested, ""


def make_plan(backend: Backend, params: CollectivesParams, world_size: int) -> Plan:
    """What to run: the dtypes that can be checked exactly here, and why others are left out."""
    dtypes: list[str] = []
    skipped: dict[str, str] = {}
    for d in params.dtypes:
        if d in ("fp16", "bf16", "int8") and d not in backend.dtypes:
            # The backend's own declaration (held to it by step 2) decides; int32/int64 are
            # not in that vocabulary and are left to the library to accept or refuse.
            skipped[d] = f"{backend.name} does not declare {d}"
        elif value_scale(d, world_size) < 1:
            skipped[d] = f"cannot hold an exact {world_size}-rank sum"
        else:
            dtypes.append(d)
    return Plan(ops=list(params.ops), dtypes=dtypes, elements=list(params.elements), world_size=world_size,
                library=backend.collective_library, dist_backend=backend.dist_backend,
                on_unsupported=params.on_unsupported or ("fail" if backend.is_accelerator else "report"),
                skipped_dtypes=skipped)
