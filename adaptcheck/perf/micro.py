"""The step-5 micro-benchmarks sized to the device — GEMM per dtype over LLM-shaped problems,
device memory copy, host↔device copies — and the :class:`~adaptcheck.base.schemas.micro_evidence.MicroRow`
they and the attention and collectives rows share; device-generic torch, timed by
:func:`adaptcheck.perf.timing.time_callable`. Work, traffic and sizing rules: docs/perf.md
("Work, traffic and sizing").
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adaptcheck.base.dtypes import ITEMSIZE, GemmDtype, is_fnuz, torch_dtype
from adaptcheck.base.errors import exception_line
from adaptcheck.base.schemas.micro_evidence import Achieved, MicroRow, ParamValue, RowExtra
from adaptcheck.perf.caches import DRAM_FACTOR, LastLevelCache, device_llc, residency
from adaptcheck.perf.peaks import Bound, Peak, efficiency, fmt_rate, roofline
from adaptcheck.perf.timing import CI_TARGET, Timing, time_callable

if TYPE_CHECKING:
    import torch

    from adaptcheck.backends.base import Backend

GEMM_DTYPES: tuple[GemmDtype, ...] = ("fp32", "bf16", "fp16", "fp8_e4m3", "int8")
"""The order auto-selected GEMM rows run in (every ``GemmDtype``; a test holds the two equal)."""
MIB = 1 << 20


def peak_dtype(dtype: str, peak: Peak | None) -> str:
    """The peak an fp32 GEMM is held to: tf32 when torch lets fp32 matmuls use TensorFloat-32."""
    import torch

    if dtype == "fp32" and peak is not None and "tf32" in peak.flops and (
            torch.get_float32_matmul_precision() != "highest" or bool(torch.backends.cuda.matmul.allow_tf32)):
        return "tf32"
    return dtype


@dataclass(frozen=True)
class TimingOptions:
    """How each row is timed (passed through to :func:`time_callable`)."""

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 100
    budget_s: float = 1.0
    max_call_s: float | None = None
    """Longest single call a row may have; None: budget_s / min_reps (so min_reps fit in the
    budget), at least 10 ms (a zero budget still measures something)."""
    ci_target: float | None = CI_TARGET
    """Stop sampling once the median's 95 % CI is narrower than this fraction of it."""

    @property
    def call_limit(self) -> float:
        return self.max_call_s if self.max_call_s is not None else max(self.budget_s / self.min_reps, 0.01)

    def time(self, fn: Callable[[], object], backend: Backend, index: int) -> Timing:
        return time_callable(fn, backend, index, warmup=self.warmup, min_reps=self.min_reps, max_reps=self.max_reps,
                             budget_s=self.budget_s, ci_target=self.ci_target)


# --- rows ------------------------------------------------------------------------------------

Params = dict[str, ParamValue]
"""What defines a row's problem (``MicroRow.params``)."""


def make_row(name: str, dtype: str | None, params: Params, flops: float | None, bytes_moved: float | None,
             timing: Timing, peak: Peak | None, *, peak_key: str | None = None, bound: Bound | None = None,
             extra: RowExtra | None = None) -> MicroRow:
    """One contract row from a measurement. ``bound`` forces the class (link, network) where
    the roofline does not apply; ``peak_key`` is the dtype whose peak applies (tf32 …)."""
    key = peak_key or dtype
    ai, ridge, roof_bound = roofline(flops, bytes_moved, peak, key)
    bound = bound or roof_bound
    med = timing.median
    ok = timing.valid and med > 0
    fps = flops / med if flops is not None and ok else None
    bps = bytes_moved / med if bytes_moved is not None and ok else None
    extra = extra.model_copy() if extra is not None else RowExtra()
    if "inner_calls" not in extra.model_fields_set:
        extra.inner_calls = timing.inner
    if key != dtype:
        extra.peak_dtype = key
    if timing.notes:
        extra.timing_notes = list(timing.notes)
    return MicroRow(name=name, dtype=dtype, params=params, flops=flops, bytes=bytes_moved, time_s=timing.stats(),
                    achieved=Achieved(flops_per_s=fps, bytes_per_s=bps),
                    efficiency=efficiency(bound, peak, key, fps, bps), arithmetic_intensity=ai, ridge_point=ridge,
                    bound=bound if peak is not None else None, status="ok", reason="", extra=extra)


def not_run_row(name: str, dtype: str | None, params: Params, reason: str, *, raised: bool = False,
                extra: RowExtra | None = None) -> MicroRow:
    """A row that was not measured, with why. ``raised``: an unexpected error (the check errors)."""
    extra = extra.model_copy() if extra is not None else RowExtra()
    if raised:
        extra.raised = True
    return MicroRow(name=name, dtype=dtype, params=params, flops=None, bytes=None, time_s=None,
                    achieved=Achieved(flops_per_s=None, bytes_per_s=None), efficiency=None,
                    arithmetic_intensity=None, ridge_point=None, bound=None, status="not_run", reason=reason,
                    extra=extra)


_UNSUPPORTED_RE = re.compile(r"not (yet )?(supported|implemented)|does not support|doesn't support|unsupported",
                             re.IGNORECASE)
"""The words libraries use to refuse an op or dtype (the rule step 4's collectives use too)."""


def is_unsupported(exc: BaseException) -> bool:
    """The library says it lacks the op/dtype (as opposed to crashing): NotImplementedError or
    a "not supported / not implemented" message, or a torch without the op at all."""
    if isinstance(exc, NotImplementedError) or _UNSUPPORTED_RE.search(str(exc)):
        return True
    return isinstance(exc, AttributeError) and "module 'torch" in str(exc)


def error_text(exc: BaseException) -> str:
    return f"{exception_line(exc)}"


# --- GEMM ------------------------------------------------------------------------------------

def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def gemm_bytes(m: int, n: int, k: int, dtype: str) -> float:
    out = {"int8": 4, "fp8_e4m3": 2}.get(dtype, ITEMSIZE[dtype])
    return float((m * k + k * n) * ITEMSIZE[dtype] + m * n * out)


def gemm_callable(dtype: str, m: int, n: int, k: int, device: torch.device,
                  backend: Backend | None = None) -> Callable[[], object]:
    """A zero-argument callable doing one ``m×k · k×n`` GEMM in ``dtype`` on ``device``.

    fp32/bf16/fp16: ``torch.matmul`` into a preallocated output (no allocation timed);
    int8: ``torch._int_mm`` (int32 result); fp8: ``torch._scaled_mm`` with unit scales, B
    column-major as it requires, bf16 result. Random data, as real weights are.
    """
    import torch

    # fp8 in the backend's flavour through the same flag the dtype smoke probe uses: step 5
    # must time the dtype step 2 proved works (float8_e4m3fnuz on MI300, not the OCP one).
    fnuz = backend is not None and is_fnuz(backend.fp8_flavour)
    gen = torch.Generator(device="cpu").manual_seed(m * 131 + n * 17 + k)
    if dtype == "int8":
        a = torch.randint(-8, 8, (m, k), dtype=torch.int8, generator=gen).to(device)
        b = torch.randint(-8, 8, (k, n), dtype=torch.int8, generator=gen).to(device)
        c = torch.empty((m, n), dtype=torch.int32, device=device)
        return lambda: torch._int_mm(a, b, out=c)
    if dtype == "fp8_e4m3":
        fp8 = torch_dtype(dtype, fnuz=fnuz)
        a = torch.randn((m, k), generator=gen).to(device=device, dtype=fp8)
        b = torch.randn((n, k), generator=gen).to(device=device, dtype=fp8).t()  # column-major k×n
        one = torch.ones((), dtype=torch.float32, device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    td = torch_dtype(dtype, fnuz=fnuz)
    a = torch.randn((m, k), generator=gen).to(device=device, dtype=td)
    b = torch.randn((k, n), generator=gen).to(device=device, dtype=td)
    c = torch.empty((m, n), dtype=td, device=device)
    return lambda: torch.matmul(a, b, out=c)


def probe_gemm_rate(dtype: str, backend: Backend, index: int, *, limit_s: float = 0.2,
                    max_size: int = 2048) -> tuple[float, int]:
    """(FLOP/s, size) of square GEMMs grown from 128 (×2 per side, 8× the work) until a call
    lasts a quarter of ``limit_s``, the next would exceed ``limit_s``, or ``max_size``.

    Small calls say little about the rate (launch overhead on accelerators; on a busy CPU a
    parallel region can wait a whole scheduler time slice), so the probe grows the problem
    until it is a fair fraction of the real ones. Each size is called once to warm up and
    twice timed; the faster counts. Raises what the GEMM raises (an unsupported dtype shows
    here, cheaply)."""
    device = backend.torch_device(index)
    size = 128
    while True:
        fn = gemm_callable(dtype, size, size, size, device, backend)
        fn()  # first call: kernel selection, lazy init
        took = math.inf
        for _ in range(2):
            backend.synchronize(index)
            t0 = time.perf_counter()
            fn()
            backend.synchronize(index)
            took = min(took, max(time.perf_counter() - t0, 1e-9))
        rate = gemm_flops(size, size, size) / took
        if took >= limit_s / 4 or took * 8 > limit_s or size >= max_size:
            return rate, size
        size *= 2


def fit_gemm_shape(m: int, n: int, k: int, rate: float, limit_s: float, *, min_m: int = 64,
                   min_nk: int = 256) -> tuple[int, int, int] | None:
    """The largest shape, shrunk by halving, whose call is estimated to take ≤ ``limit_s`` at
    ``rate``: ``m`` first (fewer tokens, same weights) down to ``min_m``, then the larger of
    ``n``/``k`` down to ``min_nk``. None when even the floor is too slow."""
    def fits(mm: int, nn: int, kk: int) -> bool:
        return gemm_flops(mm, nn, kk) / rate <= limit_s

    while not fits(m, n, k):
        if m > min_m:
            m = max(min_m, m // 2)
        elif max(n, k) > min_nk:
            if n >= k:
                n = max(min_nk, n // 2)
            else:
                k = max(min_nk, k // 2)
        else:
            return None
    return m, n, k


def bench_gemm(dtype: str, label: str, m: int, n: int, k: int, backend: Backend, index: int, peak: Peak | None,
               opts: TimingOptions, rate: float) -> MicroRow:
    """One GEMM row at the requested shape or, if the probe says it is too slow, a smaller one."""
    requested: Params = {"m": m, "n": n, "k": k}
    fitted = fit_gemm_shape(m, n, k, rate, opts.call_limit, min_m=min(m, 64))
    name = f"{label} m={m} n={n} k={k}"
    if fitted is None:
        est = gemm_flops(min(m, 64), min(n, 256), min(k, 256)) / rate
        return not_run_row(name, dtype, requested,
                           f"too slow at this size on this device: measured {fmt_rate(rate)} on a probe; even the "
                           f"smallest shape would take ~{est:.3g} s per call (limit {opts.call_limit:.3g} s)")
    extra = RowExtra(probe_flops_per_s=rate)
    if fitted != (m, n, k):
        extra.requested = requested
        extra.shrunk = (f"a {m}×{n}×{k} call would take ~{gemm_flops(m, n, k) / rate:.3g} s at the probed "
                           f"{fmt_rate(rate)} (limit {opts.call_limit:.3g} s)")
        m, n, k = fitted
        name = f"{label} m={m} n={n} k={k}"
    fn = gemm_callable(dtype, m, n, k, backend.torch_device(index), backend)
    timing = opts.time(fn, backend, index)
    return make_row(name, dtype, {"m": m, "n": n, "k": k}, gemm_flops(m, n, k), gemm_bytes(m, n, k, dtype),
                    timing, peak, peak_key=peak_dtype(dtype, peak), extra=extra)


# --- memory ----------------------------------------------------------------------------------

def fit_bytes(size: int, backend: Backend, index: int, buffers: int) -> int:
    """``size`` capped so that ``buffers`` of it use at most half the free device memory."""
    free = backend.free_memory_bytes(index)
    if free is None:
        return size
    return min(size, max(MIB, free // (2 * buffers)))


def bench_copy(size: int, backend: Backend, index: int, peak: Peak | None, opts: TimingOptions) -> MicroRow:
    """Device-to-device copy of ``size`` bytes: ``dst.copy_(src)``; 2·size bytes moved."""
    import torch

    actual = fit_bytes(size, backend, index, 2)
    device = backend.torch_device(index)
    numel = actual // 4
    # Both buffers are written before timing: a first touch would time page faults.
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.zeros(numel, dtype=torch.float32, device=device)
    timing = opts.time(lambda: dst.copy_(src), backend, index)
    extra = RowExtra(requested_bytes=size) if actual != size else RowExtra()
    return make_row(f"copy {actual / MIB:g} MiB", None, {"bytes": numel * 4}, None, 2.0 * numel * 4, timing, peak,
                    extra=extra)


REFERENCE_MIN_BYTES = 256 * MIB
"""Smallest buffer of the memory reference copy (two buffers: 512 MiB touched)."""
REFERENCE_LLC_FACTOR = 4
"""The reference's buffers are each at least this × the LLC (footprint 8 × LLC, twice the
:data:`~adaptcheck.perf.caches.DRAM_FACTOR` rows need), so it measures DRAM even on CPUs
with hundreds of MiB of L3 (a Genoa-X has 1152 MiB)."""


def dram_copy_bytes(llc: LastLevelCache | None, floor: int = 128 * MIB) -> int:
    """Buffer size of a copy whose footprint (2 buffers) is ≥ DRAM_FACTOR × the LLC, at least
    ``floor``, rounded up to a MiB."""
    need = DRAM_FACTOR * llc.total_bytes // 2 if llc is not None else 0
    return max(floor, -(-need // MIB) * MIB)


def memory_reference(backend: Backend, index: int, *, size: int | None = None,
                     budget_s: float = 0.5) -> tuple[float, str]:
    """Achievable copy bandwidth (bytes/s) and how it was measured: the reference for a
    device whose memory bandwidth is not known from a datasheet (the CPU).

    The buffers are sized well beyond the last-level cache (``size`` None: the larger of
    256 MiB and 4 × the LLC each), so the figure is DRAM's. As STREAM reports it, the *best*
    repetition counts (the fastest copy is the one least disturbed by everything else
    running), so a later median measured against it lands at or below 100 % unless the
    machine got quieter in between (then the step lifts the reference to that faster copy). The whole budget
    is spent (no early stop: a best-of wants many samples)."""
    llc = device_llc(backend, index)
    if size is None:
        size = max(REFERENCE_MIN_BYTES, REFERENCE_LLC_FACTOR * llc.total_bytes if llc else 0)
    opts = TimingOptions(warmup=1, min_reps=5, max_reps=100, budget_s=budget_s, ci_target=None)
    row = bench_copy(size, backend, index, None, opts)
    best = row.time_s.min if row.time_s is not None else None
    if best is None or row.bytes is None or not finite_positive(best):
        raise RuntimeError("the memory reference copy gave no usable timing")
    n = row.time_s.n if row.time_s is not None else None
    bw = row.bytes / best
    where = (f"footprint {row.bytes / MIB:g} MiB = {row.bytes / llc.total_bytes:.3g} × the {llc.describe()}"
             if llc else "last-level cache size not reported")
    if llc and residency(row.bytes, llc):
        where += " (capped by free memory: partly cache-resident, this reference may be high)"
    return bw, (f"measured achievable copy bandwidth ({row.name}, 2 × size bytes per copy, best of "
                f"{n} as STREAM reports; {where}); memory efficiencies are relative to what "
                "this machine achieved, not to a datasheet. A peaks_file cpu entry with memory_gbps replaces it")


def bench_host_device(size: int, direction: str, backend: Backend, index: int, peak: Peak | None,
                      opts: TimingOptions, pinned: bool = True) -> MicroRow:
    """Host→device (``h2d``) or device→host (``d2h``) copy of ``size`` bytes, from/to pinned
    host memory where the backend supports it (pageable copies go through a staging buffer)."""
    import torch

    actual = fit_bytes(size, backend, index, 1)
    device = backend.torch_device(index)
    host = torch.ones(actual, dtype=torch.uint8)
    pin_note = ""
    if pinned:
        try:
            host = host.pin_memory()
        except Exception as exc:  # noqa: BLE001 - no pinned memory: measure pageable, say so
            pin_note = f"pinned memory unavailable ({error_text(exc)}): pageable host buffer"
    dev = torch.zeros(actual, dtype=torch.uint8, device=device)
    src, dst = (host, dev) if direction == "h2d" else (dev, host)

    def fn() -> object:
        return dst.copy_(src, non_blocking=True)

    timing = opts.time(fn, backend, index)
    is_pinned = bool(host.is_pinned()) if pinned else False
    extra = RowExtra(pinned=is_pinned)
    if pin_note:
        extra.note = pin_note
    return make_row(f"{direction} {actual / MIB:g} MiB{' pinned' if is_pinned else ''}", None,
                    {"direction": direction, "bytes": actual, "pinned": is_pinned}, None, float(actual), timing, peak,
                    bound="link", extra=extra)


def finite_positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0
