"""Typed evidence of the step-5 micro-benchmarks and the records collective ranks exchange.

The ``details`` of ``perf.gemm``, ``perf.memory_bandwidth``, ``perf.host_device``,
``perf.attention`` and ``perf.collectives`` (:class:`MicroEvidence`, one row model for every
benchmark: :class:`MicroRow`), and the JSON-lines records a collectives rank writes and the
launcher or rank 0 reads back (:class:`RankRecord`). The shapes, units and meaning of every
field are in ``docs/perf.md`` ("Micro-benchmark outcome"); ``perf.regression``'s details are
the comparison model of :mod:`adaptcheck.compare.model`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from adaptcheck.base.schemas.evidence import Evidence

ParamValue = int | float | str | bool
"""One value of a row's problem definition (a size, a direction, a flag)."""


class TimeStats(Evidence):
    """A row's ``time_s``: seconds per call over the timed repetitions (docs/perf.md, "timing").

    Results written before schema 1.2 have the first seven figures only; the CI fields are
    then absent (left unset, so they stay absent when re-written).
    """

    median: float | None = Field(default=None, description="Median seconds per call: the row's figure.")
    min: float | None = Field(default=None, description="Fastest repetition (seconds per call).")
    p10: float | None = Field(default=None, description="10th percentile of the repetitions.")
    p90: float | None = Field(default=None, description="90th percentile of the repetitions.")
    mean: float | None = Field(default=None, description="Mean of the repetitions.")
    spread: float | None = Field(default=None, description="(p90 - p10) / median; inf when the median is not positive.")
    n: int | None = Field(default=None, description="Timed repetitions.")
    median_ci: tuple[float, float] | None = Field(default=None, description="[low, high] of the median's "
                                                  "distribution-free (order-statistic) confidence interval.")
    ci_level: float | None = Field(default=None, description="Exact coverage of median_ci (≥ 0.95 from 6 samples).")
    ci_rel_width: float | None = Field(default=None, description="(high - low) / median of median_ci.")
    ci_target: float | None = Field(default=None, description="Relative CI width sampling aimed at; null: no target.")
    settled: bool | None = Field(default=None, description="median_ci reached ci_target at full confidence.")


class Achieved(Evidence):
    """The rates a row reached (either null where it does not apply or the timing is unusable)."""

    flops_per_s: float | None = Field(default=None, description="FLOP/s (OP/s for integer math); null for copies.")
    bytes_per_s: float | None = Field(default=None, description="Bytes/s of the minimum traffic; a collective's algbw.")


class RowExtra(Evidence):
    """A row's benchmark-specific facts (``extra``); each present only where it applies.

    Declared in the order the benchmarks write them, so a re-written row keeps its key order
    (the report lists them in that order). Keys this version does not know are kept as extras.
    """

    probe_flops_per_s: float | None = Field(default=None, description="Rate the sizing probe measured (GEMM, "
                                            "attention prefill).")
    probe_s_per_kv_token: float | None = Field(default=None, description="Decode probe: seconds per cached token.")
    requested: dict[str, ParamValue] | None = Field(default=None, description="The problem asked for, when it was "
                                                    "shrunk to fit max_call_s.")
    shrunk: str | None = Field(default=None, description="Why the problem was shrunk, in words.")
    requested_bytes: int | None = Field(default=None, description="Copy size asked for, when free memory capped it.")
    pinned: bool | None = Field(default=None, description="Host↔device: the host buffer was page-locked.")
    note: str | None = Field(default=None, description="Host↔device: why the buffer is pageable after all.")
    inner_calls: int | None = Field(default=None, description="Back-to-back calls per timed repetition.")
    peak_dtype: str | None = Field(default=None, description="The dtype whose peak the row is held to, when not its "
                                   "own (fp32 with TF32 on: tf32).")
    timing_notes: list[str] | None = Field(default=None, description="Caveats of the timing (budget spent before "
                                           "the CI settled …).")
    algbw: float | None = Field(default=None, description="Collectives: S / t (bytes/s).")
    busbw: float | None = Field(default=None, description="Collectives: algbw × busbw_factor (bytes/s).")
    world_size: int | None = Field(default=None, description="Collectives: ranks.")
    op: str | None = Field(default=None, description="Collectives: the collective timed.")
    busbw_factor: float | None = Field(default=None, description="Collectives: nccl-tests' bus-bandwidth factor.")
    rank_median_s: list[float] | None = Field(default=None, description="Collectives: each rank's median seconds "
                                              "per call, by rank.")
    raised: bool | None = Field(default=None, description="A not_run row whose measurement raised an unexpected "
                                "error (the check errors).")
    cache: str | None = Field(default=None, description="Why a memory-bound row is labelled bound 'cache' (its "
                              "footprint is under 4 × the last-level cache).")
    above_peak: str | None = Field(default=None, description="The row ran above 100 % of the peak (the peak "
                                   "understates the device).")


class MicroRow(Evidence):
    """One problem of one micro-benchmark (every key is always written)."""

    name: str = Field(default="", description="The problem in words, e.g. 'prefill m=2048 n=4096 k=4096'.")
    dtype: str | None = Field(default=None, description="Element dtype; null where it does not apply (copies).")
    params: dict[str, ParamValue] = Field(default_factory=dict, description="What defines the problem (m/n/k, "
                                          "bytes, direction, heads …), in the order the name spells them.")
    flops: float | None = Field(default=None, description="Work per repetition; null for pure copies.")
    bytes: float | None = Field(default=None, description="Minimum bytes moved per repetition.")
    time_s: TimeStats | None = Field(default=None, description="Timing statistics; null for a row not run.")
    achieved: Achieved = Field(default_factory=Achieved, description="Rates reached.")
    efficiency: float | None = Field(default=None, description="Measured / peak of the bounding resource; null "
                                     "without a peak (or for bound 'cache').")
    arithmetic_intensity: float | None = Field(default=None, description="flops / bytes; null for copies.")
    ridge_point: float | None = Field(default=None, description="Peak FLOP/s / peak memory bandwidth for the dtype.")
    bound: str | None = Field(default=None, description="compute | memory | link | network | cache; null without "
                              "a peak.")
    status: str = Field(default="", description="ok | not_run (anything else, or none, never reads as a pass).")
    reason: str = Field(default="", description="Why not_run.")
    extra: RowExtra = Field(default_factory=RowExtra, description="Benchmark-specific facts.")

    @property
    def label(self) -> str:
        """'prefill m=2048 n=4096 k=4096 bf16': the name and dtype, how messages and comparisons key a row."""
        return f"{self.name}{' ' + self.dtype if self.dtype else ''}"


class PeakRecord(Evidence):
    """The peak the efficiencies are computed against (``details.peak``)."""

    device: str | None = Field(default=None, description="The device name that was matched.")
    entry: str | None = Field(default=None, description="matrices/peaks.yaml entry id, or 'derived:cpu'.")
    source: str | None = Field(default=None, description="Where the figures come from.")
    verified: bool | None = Field(default=None, description="False: marked unverified in peaks.yaml.")
    flops: dict[str, float] = Field(default_factory=dict, description="Dense FLOP/s by dtype.")
    memory_bw: float | None = Field(default=None, description="Memory bandwidth, bytes/s.")
    host_link_bw: float | None = Field(default=None, description="Host link, bytes/s per direction.")
    interconnect_bw: float | None = Field(default=None, description="Device-to-device bytes/s (collectives' busbw "
                                          "is held to it).")
    derivation: list[str] = Field(default_factory=list, description="CPU: how the peak was derived, line by line.")
    memory_bw_basis: str | None = Field(default=None, description="spec (datasheet) | measured (best-of copy "
                                        "measured here) | unknown.")
    notes: str | None = Field(default=None, description="Caveats from peaks.yaml.")

    def flops_for(self, dtype: str | None) -> float | None:
        """The dense FLOP/s figure of ``dtype``; None without one (or without a dtype)."""
        return self.flops.get(dtype) if dtype is not None else None


class MicroEvidence(Evidence):
    """``details`` of a micro-benchmark check (docs/perf.md, "Micro-benchmark outcome")."""

    benchmark: str | None = Field(default=None, description="gemm | memory_bandwidth | host_device | attention | "
                                  "collectives.")
    timer: str | None = Field(default=None, description="How each repetition was timed ('device events', "
                              "'synchronize + perf_counter').")
    peak: PeakRecord | None = Field(default=None, description="The peak held to; null: none known.")
    rows: list[MicroRow] = Field(default_factory=list, description="One row per problem.")
    notes: list[str] = Field(default_factory=list, description="Caveats for the whole check.")
    above_peak: list[str] = Field(default_factory=list, description="Rows whose efficiency exceeds 100 %.")
    device_count: int | None = Field(default=None, description="Collectives not applicable: devices visible.")
    logs_dir: str | None = Field(default=None, description="Collectives: the ranks' logs, when a rank crashed.")


# --- collectives ranks ---------------------------------------------------------------------

CaseStatus = Literal["ok", "mismatch", "raised", "unsupported", "incomplete"]
"""An exactness case over every rank: ok (all matched), mismatch (some rank got a wrong element:
conclusive), incomplete (some rank never reported it), raised, unsupported (the library said so)."""

class RankRecord(Evidence):
    """One JSON line a collectives rank writes (``event`` says which of the fields apply).

    ``start`` (rank, pid, device), ``ready`` (init_s, apis, torch), ``begin`` (key, op, dtype,
    elements), ``op`` (an exactness result: status, time_s, mismatches, first_index, got,
    expected or error), ``bench`` (a timing: status, samples, inner, warmup, estimate_s or
    error), ``done``. Read back by the launcher (one machine) or gathered by rank 0 (a cluster).
    """

    event: str = Field(description="start | ready | begin | op | bench | done.")
    t: float | None = Field(default=None, description="Wall clock when written (lines the ranks' logs up).")
    rank: int | None = Field(default=None, description="start: the rank.")
    pid: int | None = Field(default=None, description="start: its process id.")
    device: str | None = Field(default=None, description="start: the torch device it drives.")
    init_s: float | None = Field(default=None, description="ready: seconds the process group took to form.")
    apis: dict[str, str] | None = Field(default=None, description="ready: torch.distributed function behind each op.")
    torch: str | None = Field(default=None, description="ready: torch version.")
    key: str | None = Field(default=None, description="'op/dtype/elements' of the case.")
    op: str | None = Field(default=None, description="The collective.")
    dtype: str | None = Field(default=None, description="Element dtype.")
    elements: int | None = Field(default=None, description="Per-rank chunk size in elements.")
    status: str | None = Field(default=None, description="op: ok | mismatch | unsupported | raised; bench: ok | "
                               "unsupported | raised.")
    time_s: float | None = Field(default=None, description="op: seconds the one checked call took.")
    mismatches: int | None = Field(default=None, description="op: elements that differ from the expectation.")
    first_index: int | None = Field(default=None, description="op: first wrong element.")
    got: int | float | str | None = Field(default=None, description="op: the value found there (or shape/dtype).")
    expected: int | float | str | None = Field(default=None, description="op: the value that must be there.")
    error: str | None = Field(default=None, description="What the collective raised.")
    samples: list[float] | None = Field(default=None, description="bench: seconds per call, one per repetition.")
    inner: int | None = Field(default=None, description="bench: calls per repetition.")
    warmup: int | None = Field(default=None, description="bench: warm-up calls.")
    estimate_s: float | None = Field(default=None, description="bench: the agreed per-call estimate (slowest rank).")


class RankPayload(Evidence):
    """What one rank of ``adaptcheck cluster collectives`` sends rank 0 (``all_gather_object``)."""

    rank: int = Field(description="Global rank (RANK).")
    local_rank: int = Field(description="Rank on its node; also the device index it drove.")
    node_rank: int | None = Field(default=None, description="Its node's rank (GROUP_RANK); null when not set.")
    hostname: str = Field(description="socket.gethostname() on its node.")
    device: str = Field(description="torch device it drove.")
    pid: int = Field(description="Process id on its node.")
    init_s: float | None = Field(default=None, description="Seconds the process group took to form.")
    records: list[RankRecord] = Field(default_factory=list, description="Its exactness records (event 'op').")
    bench: list[RankRecord] = Field(default_factory=list, description="Its timing records (event 'bench').")
