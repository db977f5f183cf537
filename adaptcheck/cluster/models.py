"""``collectives-multinode.json``: what a multi-node collectives run found, rank by rank, written
by rank 0 after gathering every rank's outcome (or, when the group never formed or a peer was
lost, with what it had: ``missing_ranks`` names who never reported); every field is described.
Usage: docs/cluster.md.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.schemas.micro_evidence import CaseStatus

REPORT_NAME = "collectives-multinode.json"
"""File name rank 0 writes under ``--out``."""
KIND: Literal["adaptcheck.cluster.rank"] = "adaptcheck.cluster.rank"
"""The ``kind`` of the file (tools that collect many JSON files tell them apart by it)."""


class RankInfo(BaseModel):
    """One process of the job, as it reported itself."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(description="Global rank (RANK).")
    local_rank: int = Field(description="Rank on its node (LOCAL_RANK); also the device index it drove.")
    node_rank: int | None = Field(description="Its node's rank (GROUP_RANK); null when the launcher did not set it.")
    hostname: str = Field(description="socket.gethostname() on its node.")
    device: str = Field(description="torch device it drove, e.g. 'cuda:3' or 'cpu'.")
    pid: int = Field(description="Process id on its node (to find it in the node's logs).")
    init_s: float | None = Field(default=None, description="Seconds it waited for the process group to form.")


class NodeInfo(BaseModel):
    """One machine of the job and the ranks it ran."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(description="The node's key: 'node <GROUP_RANK>', else its hostname.")
    node_rank: int | None = Field(description="GROUP_RANK of the node; null when the launcher did not set it.")
    hostname: str = Field(description="Hostname its ranks reported.")
    ranks: list[int] = Field(description="Global ranks that ran there, ascending.")
    devices: list[str] = Field(description="Devices those ranks drove, in the same order.")


class RankEvidence(BaseModel):
    """What one rank saw when a collective went wrong for it."""

    model_config = ConfigDict(extra="forbid")

    mismatches: int | None = Field(default=None, description="Elements that differ from the exact expectation.")
    first_index: int | None = Field(default=None, description="Index of the first wrong element.")
    got: float | int | str | None = Field(default=None, description="Value found there (or the wrong shape/dtype).")
    expected: float | int | str | None = Field(default=None, description="Value that must be there.")
    error: str | None = Field(default=None, description="The exception the collective raised, if it raised.")




class CaseResult(BaseModel):
    """One (op, dtype, size), checked exactly on every rank."""

    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="Collective: all_reduce, all_gather, reduce_scatter, all_to_all or broadcast.")
    dtype: str = Field(description="Element dtype (values are integers small enough for exact sums).")
    elements: int = Field(description="Per-rank chunk size in elements.")
    bytes_per_rank: int = Field(description="elements × dtype size.")
    status: CaseStatus = Field(
        description="ok: every rank matched exactly; mismatch: some rank got a wrong element (conclusive); "
                    "incomplete: some rank never reported it; raised; unsupported (the library said so).")
    time_s: float | None = Field(default=None, description="Slowest rank's time for the call (one call, not a benchmark).")
    ranks: dict[int, RankEvidence] = Field(default_factory=dict, description="Evidence of each rank that was not ok.")
    missing_ranks: list[int] = Field(default_factory=list, description="Ranks whose outcome never reached rank 0.")


BenchStatus = Literal["ok", "unsupported", "raised", "incomplete", "skipped"]


class BenchResult(BaseModel):
    """One timed (op, dtype, size): nccl-tests' algbw and busbw across all nodes."""

    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="Collective timed.")
    dtype: str = Field(description="Element dtype.")
    elements_per_rank: int = Field(description="Per-rank chunk size in elements.")
    bytes: int = Field(description="nccl-tests' S: the full tensor (gathered output, scattered input, whole buffer).")
    status: BenchStatus = Field(description="ok, or why there is no figure (skipped: dtype not declared by the backend).")
    error: str | None = Field(default=None, description="Why there is no figure, when status is not ok.")
    time_s: float | None = Field(default=None, description="t: the slowest rank's median seconds per call.")
    algbw_gbps: float | None = Field(default=None, description="S / t, in GB/s (1e9 bytes).")
    busbw_gbps: float | None = Field(default=None, description="algbw × busbw_factor, in GB/s: comparable with link speed.")
    busbw_factor: float = Field(description="2(n-1)/n for all_reduce, (n-1)/n for gather/scatter/all-to-all, 1 broadcast.")
    slowest_rank: int | None = Field(default=None, description="Rank whose median was t.")
    rank_median_s: dict[int, float] = Field(default_factory=dict, description="Each rank's median seconds per call.")


class SlowestRank(BaseModel):
    """The rank that took longest over all timed collectives, and by how much."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(description="Global rank.")
    node: str = Field(description="Its node's key (see NodeInfo.node).")
    hostname: str = Field(description="Its node's hostname.")
    total_s: float = Field(description="Sum of its times over the cases in 'basis'.")
    fastest_total_s: float = Field(description="The same sum for the fastest rank.")
    ratio: float = Field(description="total_s / fastest_total_s (1.0: all ranks alike).")
    basis: Literal["bench", "check"] = Field(
        description="bench: medians of the timed cases; check: the single calls of the exactness check (rough).")


class Settings(BaseModel):
    """What the run was asked to do (the same on every rank)."""

    model_config = ConfigDict(extra="forbid")

    ops: list[str] = Field(description="Collectives checked exactly.")
    dtypes: list[str] = Field(description="Dtypes checked exactly (after dropping those listed in skipped_dtypes).")
    elements: list[int] = Field(description="Per-rank chunk sizes checked.")
    bench: bool = Field(description="Whether algbw/busbw were timed.")
    bench_ops: list[str] = Field(default_factory=list, description="Collectives timed.")
    bench_dtypes: list[str] = Field(default_factory=list, description="Dtypes timed.")
    bench_sizes_mib: list[float] = Field(default_factory=list, description="Full-tensor sizes S timed, MiB.")
    timeout_s: float = Field(description="Longest any one collective (or the final gather) may take on a rank.")
    join_timeout_s: float = Field(description="Longest a rank waits for every peer to join the process group.")
    impl: str | None = Field(default=None, description="'module:object' replacing torch.distributed (tests, vendors).")


ReportStatus = Literal["pass", "fail", "skip", "error"]


class MultinodeCollectives(BaseModel):
    """The report of one ``adaptcheck cluster collectives`` job (written by rank 0)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["adaptcheck.cluster.rank"] = Field(default=KIND, description="What this file is.")
    status: ReportStatus = Field(
        description="pass: every case exact on every rank; fail: a wrong or raising collective; skip: nothing "
                    "could be checked; error: the group never formed or a peer was lost (see exit_code).")
    exit_code: int = Field(description="What every surviving rank exited with (docs/cluster.md, exit codes).")
    message: str = Field(description="One-line verdict naming the op, dtype, size, rank and host of a failure.")
    started_at: datetime = Field(description="When rank 0 started (UTC).")
    wall_s: float = Field(description="Seconds from rank 0's start to this report.")
    adaptcheck_version: str = Field(description="adaptcheck version on rank 0.")
    torch_version: str | None = Field(default=None, description="torch version on rank 0.")
    backend: str = Field(description="adaptcheck backend on rank 0 (every rank selects its own; see ranks[].device).")
    dist_backend: str = Field(description="torch.distributed backend: nccl, gloo, hccl …")
    library: str = Field(description="Collective library behind it.")
    world_size: int = Field(description="Ranks in the job (WORLD_SIZE).")
    nnodes: int = Field(description="Distinct nodes among the ranks that reported.")
    master: str = Field(description="MASTER_ADDR:MASTER_PORT the group met at.")
    run_id: str | None = Field(default=None, description="torchrun's rendezvous id (TORCHELASTIC_RUN_ID).")
    nodes: list[NodeInfo] = Field(description="Machines and the ranks each ran.")
    ranks: list[RankInfo] = Field(description="Every rank that reported, by global rank.")
    missing_ranks: list[int] = Field(default_factory=list, description="Ranks whose outcome never reached rank 0.")
    on_unsupported: Literal["fail", "report"] = Field(
        description="What an op the library reports as unsupported costs (fail on accelerators, report on CPU).")
    skipped_dtypes: dict[str, str] = Field(default_factory=dict, description="Dtypes left out, with why.")
    cases: list[CaseResult] = Field(default_factory=list, description="Exactness results, op × dtype × size.")
    bench: list[BenchResult] = Field(default_factory=list, description="algbw/busbw, when --bench was given.")
    slowest_rank: SlowestRank | None = Field(default=None, description="The rank that held the others back, if any timing.")
    settings: Settings = Field(description="What the run was asked to do.")

    def save(self, out_dir: Path) -> Path:
        """Write ``out_dir/collectives-multinode.json`` (folder created); returns the path."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / REPORT_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)  # a reader (or a CI collector) never sees half a file
        return path
