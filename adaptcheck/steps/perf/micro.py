"""Step-5 micro-benchmark check kinds: ``perf.gemm``, ``perf.memory_bandwidth``, ``perf.host_device``
and ``perf.attention`` (``perf.collectives`` is re-exported from
:mod:`adaptcheck.steps.perf.collectives`, as its entry point names this module): each measures
its rows with :mod:`adaptcheck.perf`, holds them to the device's peak and returns one Outcome
whose details are a :class:`~adaptcheck.base.schemas.micro_evidence.MicroEvidence`. Shapes,
sizing, defaults and the status policy: docs/perf.md ("Micro-benchmark outcome").
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adaptcheck.base.dtypes import FloatDtype, GemmDtype
from adaptcheck.base.schemas.micro_evidence import MicroEvidence, MicroRow
from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.perf.attention import bench_decode, bench_prefill
from adaptcheck.perf.caches import residency
from adaptcheck.perf.micro import (
    GEMM_DTYPES,
    MIB,
    Params,
    bench_copy,
    bench_gemm,
    bench_host_device,
    dram_copy_bytes,
    error_text,
    is_unsupported,
    not_run_row,
    probe_gemm_rate,
)
from adaptcheck.perf.peaks import Peak
from adaptcheck.steps.perf.collectives import (
    CollectivesBenchCheck,
    CollectivesBenchParams,
)
from adaptcheck.steps.perf.common import (
    Metrics,
    MicroParams,
    headline,
    hold_to_memory,
    last_level_cache,
    raise_reference,
    recheck_clock,
    resolve_peak,
    verdict,
)

__all__ = [
    "AttentionBenchCheck",
    "AttentionParams",
    "CollectivesBenchCheck",
    "CollectivesBenchParams",
    "GemmBenchCheck",
    "GemmParams",
    "HostDeviceCheck",
    "HostDeviceParams",
    "MemoryBandwidthCheck",
    "MemoryParams",
]

Direction = Literal["h2d", "d2h"]


def _both_directions() -> list[Direction]:
    return ["h2d", "d2h"]


def _bf16_only() -> list[FloatDtype]:
    return ["bf16"]


PRIVATE_OP_DTYPES = ("fp8_e4m3", "int8")
"""GEMM dtypes timed through torch's private ops (``_scaled_mm``, ``_int_mm``), whose shape
and hardware constraints (m > 16, dims divisible by 16, compute capability …) surface as
plain RuntimeErrors: for these, any refusal is "not supported here", not a crash."""


def _failed_row(name: str, dtype: str | None, params: Params, exc: BaseException) -> MicroRow:
    """A row whose measurement raised: 'unsupported' is a reason, anything else an error."""
    if is_unsupported(exc) or (dtype in PRIVATE_OP_DTYPES and isinstance(exc, (RuntimeError, TypeError))):
        return not_run_row(name, dtype, params, f"not supported on this device at this shape: {error_text(exc)}")
    return not_run_row(name, dtype, params, error_text(exc), raised=True)


def _held_verdict(ctx: CheckContext, benchmark: str, rows: list[MicroRow], heads: dict[int, str], peak: Peak | None,
                  peaks_file: str | None, notes: list[str] | None = None) -> Outcome:
    """The verdict of rows that may be compute-bound: each held to the memory peak or labelled
    cache-resident, the CPU clock re-measured where one ran above the peak, then the headline
    metrics (``heads``: row index → metric prefix) against the final peak."""
    held = [hold_to_memory(ctx, row) for row in rows]
    peak = recheck_clock(ctx, peak, held, peaks_file)
    metrics: Metrics = {}
    for i, prefix in heads.items():
        if held[i].status == "ok":
            headline(metrics, prefix, held[i])
    return verdict(ctx, benchmark, held, peak, metrics, notes)


# --- GEMM ------------------------------------------------------------------------------------

class GemmShape(BaseModel):
    """One LLM-shaped GEMM: ``m`` tokens × ``k`` hidden → ``n`` outputs."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(pattern=r"^[a-z0-9_]+$", description="Row label and metric name part (prefill, decode …).")
    m: int = Field(ge=1, le=1 << 20, description="Rows of A: tokens in the batch (prefill: thousands; decode: 1-16).")
    n: int = Field(ge=1, le=1 << 20, description="Columns of B: output features.")
    k: int = Field(ge=1, le=1 << 20, description="Reduction dimension: input features.")


class GemmParams(MicroParams):
    """Which dtypes and shapes to time."""

    dtypes: list[GemmDtype] | None = Field(
        default=None, description="Dtypes to time. None: every dtype the backend declares that the device's peak "
                                  "has a figure for (on a CPU: fp32, bf16, fp16, and int8 where VNNI/AMX exist).")
    shapes: list[GemmShape] = Field(
        default_factory=lambda: [GemmShape(label="prefill", m=2048, n=4096, k=4096),
                                 GemmShape(label="decode", m=8, n=4096, k=4096)],
        min_length=1,
        description="Problems (upper bounds: shrunk where one call would exceed max_call_s). Defaults: a 7-8B "
                    "model's 4096×4096 projection at 2048 prefill tokens and at a decode batch of 8.")


def auto_gemm_dtypes(declared: tuple[str, ...], peak: Peak | None) -> list[GemmDtype]:
    """Declared dtypes the peak knows (all declared ones when no peak is known at all)."""
    out = []
    for d in GEMM_DTYPES:
        if d not in declared:
            continue
        if peak is None or d in peak.flops or (d == "fp32" and "tf32" in peak.flops):
            out.append(d)
    return out


class GemmBenchCheck(Check):
    """GEMM TFLOP/s per dtype on prefill- and decode-shaped problems, against the dtype's peak."""

    kind = "perf.gemm"
    step = 5
    description = "GEMM TFLOP/s per dtype on LLM-shaped problems, with efficiency against the device peak."
    params_model = GemmParams

    def run(self, ctx: CheckContext, params: GemmParams) -> Outcome:
        backend, idx = ctx.backend, ctx.device_index
        peak = resolve_peak(ctx, params.peaks_file)
        dtypes = list(params.dtypes) if params.dtypes else auto_gemm_dtypes(backend.dtypes, peak)
        opts = params.timing()
        # The probe never needs a cube larger than the largest problem asked for.
        largest = max(s.m * s.n * s.k for s in params.shapes)
        probe_cap = min(2048, max(128, 1 << math.ceil(math.log2(largest) / 3)))
        rows: list[MicroRow] = []
        heads: dict[int, str] = {}  # row index → headline metric prefix
        for dtype in dtypes:
            shape_rows: list[tuple[GemmShape, str, Params]] = [
                (s, f"{s.label} m={s.m} n={s.n} k={s.k}", {"m": s.m, "n": s.n, "k": s.k}) for s in params.shapes]
            if dtype not in backend.dtypes:
                rows += [not_run_row(name, dtype, p, f"{backend.name} does not declare {dtype}")
                         for _, name, p in shape_rows]
                continue
            try:
                rate, _ = probe_gemm_rate(dtype, backend, idx, limit_s=opts.call_limit, max_size=probe_cap)
            except Exception as exc:  # noqa: BLE001 - the probe is where an unsupported dtype shows
                rows += [_failed_row(name, dtype, p, exc) for _, name, p in shape_rows]
                continue
            for shape, name, p in shape_rows:
                try:
                    row = bench_gemm(dtype, shape.label, shape.m, shape.n, shape.k, backend, idx, peak, opts, rate)
                except Exception as exc:  # noqa: BLE001 - e.g. int8 at m ≤ 16 on some devices
                    row = _failed_row(name, dtype, p, exc)
                rows.append(row)
                heads[len(rows) - 1] = f"gemm_{dtype}_{shape.label}"
                backend.empty_cache()
        return _held_verdict(ctx, "gemm", rows, heads, peak, params.peaks_file)


# --- memory copy -----------------------------------------------------------------------------

class MemoryParams(MicroParams):
    """Copy sizes."""

    sizes_mib: list[float] = Field(
        default_factory=lambda: [16.0, 256.0], min_length=1,
        description="Bytes copied per call (MiB; 2× that is moved: read + write). A size whose footprint (2 × "
                    "size) is under 4 × the last-level cache is labelled cache-resident and not held to the memory "
                    "peak. Capped at a quarter of free memory.")
    dram_row: bool = Field(
        default=True, description="Add a copy sized well beyond the last-level cache (footprint ≥ 4 × LLC, at least "
                                  "128 MiB per buffer) when no listed size is that large, so the headline figure "
                                  "is always DRAM's whatever this machine's cache.")

    @field_validator("sizes_mib")
    @classmethod
    def _positive(cls, value: list[float]) -> list[float]:
        if any(not 0 < v <= 1 << 20 for v in value):
            raise ValueError("sizes_mib: each size must be > 0 and at most 2^20 MiB")
        return value


class MemoryBandwidthCheck(Check):
    """Device memory copy bandwidth against the memory peak."""

    kind = "perf.memory_bandwidth"
    step = 5
    description = "Device memory copy bandwidth (read + write), with efficiency against the memory peak."
    params_model = MemoryParams

    def run(self, ctx: CheckContext, params: MemoryParams) -> Outcome:
        peak = resolve_peak(ctx, params.peaks_file)
        llc = last_level_cache(ctx)
        sizes = [int(size * MIB) for size in params.sizes_mib]
        notes = ["bytes = 2 × size per copy (read + write), as STREAM counts them"]
        if llc is not None:
            notes.append(f"last-level cache: {llc.describe()}; rows with a footprint under 4 × that are "
                         "cache-resident and not held to the memory peak")
            if params.dram_row and all(residency(2.0 * s, llc) for s in sizes):
                sizes.append(dram_copy_bytes(llc))
                notes.append(f"copy {sizes[-1] / MIB:g} MiB added: no listed size is well beyond the cache")
        measured: list[MicroRow] = []
        for size in sizes:
            try:
                measured.append(bench_copy(size, ctx.backend, ctx.device_index, peak, params.timing()))
            except Exception as exc:  # noqa: BLE001
                measured.append(_failed_row(f"copy {size / MIB:g} MiB", None, {"bytes": size}, exc))
            ctx.backend.empty_cache()
        rows = [hold_to_memory(ctx, row) for row in measured]
        peak = raise_reference(ctx, peak, rows)
        metrics: Metrics = {}
        ok = [row for row in rows if row.status == "ok"]
        if ok:
            # The headline is DRAM's: the largest copy held to the memory peak, else the largest
            # (the bound class is the one hold_to_memory gave the row).
            dram = [row for row in ok if row.bound != "cache"] or ok
            headline(metrics, "memory_copy", max(dram, key=lambda row: float(row.params["bytes"])))
        return verdict(ctx, "memory_bandwidth", rows, peak, metrics, notes)


# --- host <-> device -------------------------------------------------------------------------

class HostDeviceParams(MicroParams):
    """Sizes and directions of the host↔device copies."""

    sizes_mib: list[float] = Field(default_factory=lambda: [256.0], min_length=1,
                                   description="Bytes per copy (MiB), each size in every direction.")
    directions: list[Direction] = Field(default_factory=_both_directions, min_length=1,
                                                    description="h2d: host → device; d2h: device → host.")
    pinned: bool = Field(default=True, description="Page-locked host buffer (how inference servers copy); False "
                                                   "times pageable memory, which goes through a staging copy.")


class HostDeviceCheck(Check):
    """Host↔device copy bandwidth against the host link (not applicable on the host itself)."""

    kind = "perf.host_device"
    step = 5
    description = "Host-to-device and device-to-host copy bandwidth, with efficiency against the host link."
    params_model = HostDeviceParams

    def run(self, ctx: CheckContext, params: HostDeviceParams) -> Outcome:
        backend = ctx.backend
        if not backend.is_accelerator:
            return Outcome.skipped(f"{backend.display_name} is the host: there is no host↔device link to measure",
                                   applicable=False, details=MicroEvidence(benchmark="host_device").dump())
        peak = resolve_peak(ctx, params.peaks_file)
        rows: list[MicroRow] = []
        metrics: Metrics = {}
        for size in params.sizes_mib:
            for direction in params.directions:
                try:
                    row = bench_host_device(int(size * MIB), direction, backend, ctx.device_index, peak,
                                            params.timing(), pinned=params.pinned)
                except Exception as exc:  # noqa: BLE001
                    row = _failed_row(f"{direction} {size:g} MiB", None, {"direction": direction}, exc)
                rows.append(row)
                if row.status == "ok":
                    headline(metrics, direction, row)
                backend.empty_cache()
        return verdict(ctx, "host_device", rows, peak, metrics)


# --- attention -------------------------------------------------------------------------------

class PrefillShape(BaseModel):
    """Causal prefill problem."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(default=1, ge=1, le=4096, description="Sequences.")
    seq_len: int = Field(default=1024, ge=1, le=1 << 20, description="Tokens per sequence (upper bound).")
    q_heads: int = Field(default=32, ge=1, le=1024, description="Query heads.")
    kv_heads: int = Field(default=8, ge=1, le=1024, description="Key/value heads (GQA: q_heads a multiple).")
    head_dim: int = Field(default=128, ge=1, le=1024, description="Head dimension.")


class DecodeShape(BaseModel):
    """Decode problem: one new token per sequence over its KV cache."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(default=8, ge=1, le=4096, description="Sequences decoded together.")
    kv_len: int = Field(default=4096, ge=1, le=1 << 22, description="Cached tokens per sequence (upper bound).")
    q_heads: int = Field(default=32, ge=1, le=1024, description="Query heads.")
    kv_heads: int = Field(default=8, ge=1, le=1024, description="Key/value heads.")
    head_dim: int = Field(default=128, ge=1, le=1024, description="Head dimension.")


class AttentionParams(MicroParams):
    """Attention problems (defaults: a Llama-3-8B layer: 32 query heads, 8 KV heads, dim 128)."""

    dtypes: list[FloatDtype] = Field(
        default_factory=_bf16_only, min_length=1,
        description="Dtypes; one the backend does not declare becomes a not_run row.")
    prefill: PrefillShape | None = Field(default_factory=PrefillShape, description="Prefill problem (None: skip).")
    decode: DecodeShape | None = Field(default_factory=DecodeShape, description="Decode problem (None: skip).")


class AttentionBenchCheck(Check):
    """Causal GQA prefill and KV-cache decode attention throughput against the peak."""

    kind = "perf.attention"
    step = 5
    description = "Attention prefill (causal, GQA) and decode throughput via SDPA, with efficiency and bound."
    params_model = AttentionParams

    def run(self, ctx: CheckContext, params: AttentionParams) -> Outcome:
        backend, idx = ctx.backend, ctx.device_index
        peak = resolve_peak(ctx, params.peaks_file)
        opts = params.timing()
        rows: list[MicroRow] = []
        heads: dict[int, str] = {}  # row index → headline metric prefix
        for dtype in params.dtypes:
            for kind in ("prefill", "decode"):
                shape = getattr(params, kind)
                if shape is None:
                    continue
                problem: Params = shape.model_dump()
                name = f"{kind} " + " ".join(f"{k}={v}" for k, v in problem.items())
                if dtype not in backend.dtypes:
                    rows.append(not_run_row(name, dtype, problem, f"{backend.name} does not declare {dtype}"))
                    continue
                try:
                    if kind == "prefill":
                        row = bench_prefill(dtype, shape.batch, shape.seq_len, shape.q_heads, shape.kv_heads,
                                            shape.head_dim, backend, idx, peak, opts)
                    else:
                        row = bench_decode(dtype, shape.batch, shape.kv_len, shape.q_heads, shape.kv_heads,
                                           shape.head_dim, backend, idx, peak, opts)
                except Exception as exc:  # noqa: BLE001
                    row = _failed_row(name, dtype, problem, exc)
                rows.append(row)
                heads[len(rows) - 1] = f"attention_{dtype}_{kind}"
                backend.empty_cache()
        notes = [("FLOPs count QKᵀ and P·V (2 per multiply-add; causal prefill halves them), not softmax; bytes "
                  "are the minimum traffic (Q, K, V read once, O written once)")]
        return _held_verdict(ctx, "attention", rows, heads, peak, params.peaks_file, notes)
