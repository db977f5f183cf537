"""Shared helpers of the step-2 tests: contexts, test backends and deliberately wrong device ops.

No conftest.py (tests/ is shared): tests import these directly.
"""

from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any

import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.smoke.ops import DeviceOps


def make_ctx(tmp_path: Path, backend: Any = None, seed: int = 1234) -> CheckContext:
    """A CheckContext on the CPU backend (or the given test backend)."""
    return CheckContext(backend=backend or CpuBackend(), device_index=0, seed=seed, run_dir=tmp_path,
                        model=ModelSpec())


def by_subid(outcomes: Outcome | list[Outcome]) -> dict[str | None, Outcome]:
    items = outcomes if isinstance(outcomes, list) else [outcomes]
    return {o.subid: o for o in items}


PASS, FAIL, SKIP = Status.PASS, Status.FAIL, Status.SKIP


# --- test backends ------------------------------------------------------------------------

class Fp32OnlyBackend(CpuBackend):
    """A CPU that declares only fp32: every other dtype must be a non-applicable skip."""

    name = "fp32only"
    dtypes = ("fp32",)  # type: ignore[assignment]  # CpuBackend's unannotated tuple is inferred as 4 strings


class NoFp8Backend(CpuBackend):
    """A CPU that does not claim fp8 (as a device without fp8 would not): fp8 becomes informational."""

    name = "nofp8"
    dtypes = ("fp32", "fp16", "bf16", "int8")


class EveryDtypeBackend(CpuBackend):
    """A CPU that declares every dtype (so fp8 becomes judged, not informational)."""

    name = "everydtype"
    dtypes = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")  # type: ignore[assignment]  # as above


class MisplacedBackend(CpuBackend):
    """Declares device type 'xpu' but hands out CPU tensors: tensors do not live on 'its' device."""

    name = "misplaced"
    device_type = "xpu"


class UnavailableBackend(CpuBackend):
    name = "unavailable"

    def _probe(self) -> Any:
        from adaptcheck.backends.base import ProbeResult

        return ProbeResult.no("driver not loaded")


class AllocatorStatsBackend(CpuBackend):
    """A CPU whose 'allocator' counts the bytes of tensors that :class:`CountingOps` saw filled
    and that are still alive — the shape of CUDA-like ``memory_allocated`` statistics."""

    name = "allocstats"

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def memory_stats(self, index: int = 0) -> dict[str, float]:
        return {"memory_allocated": float(self.live), "max_memory_allocated": float(self.peak),
                "free": 8.0 * 2**30, "total": 16.0 * 2**30}


class SmallFreeMemoryBackend(CpuBackend):
    """Reports 64 MiB free, so fraction_of_free sizing is visible."""

    name = "smallfree"

    def memory_stats(self, index: int = 0) -> dict[str, float]:
        return {"free": 64.0 * 2**20, "total": 128.0 * 2**20}


class _FakeEvent:
    def __init__(self, enable_timing: bool = False, zero_time: bool = False) -> None:
        self.t: float | None = None
        self.zero_time = zero_time

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.t is not None

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _FakeEvent) -> float:
        if self.zero_time:
            return 0.0
        assert self.t is not None and other.t is not None
        return (other.t - self.t) * 1e3


class _FakeStream:
    def __init__(self, device: Any = None) -> None:
        self.waited: list[Any] = []

    def wait_stream(self, other: _FakeStream) -> None:
        self.waited.append(other)

    def wait_event(self, event: _FakeEvent) -> None:
        self.waited.append(event)


class FakeStreamsApi:
    """A torch-device-module look-alike with streams and events, executing synchronously on
    the CPU, so the streams/events check's code path runs without an accelerator."""

    def __init__(self, zero_time: bool = False) -> None:
        self.zero_time = zero_time
        self._current = _FakeStream()

    def current_stream(self, device: Any = None) -> _FakeStream:
        return self._current

    def Stream(self, device: Any = None) -> _FakeStream:  # mirrors torch.cuda.Stream
        return _FakeStream(device)

    def Event(self, enable_timing: bool = False) -> _FakeEvent:  # mirrors torch.cuda.Event
        return _FakeEvent(enable_timing, self.zero_time)

    def stream(self, s: _FakeStream) -> Any:
        import contextlib

        return contextlib.nullcontext(s)

    def synchronize(self, index: int = 0) -> None:
        pass


class FakeStreamsBackend(CpuBackend):
    name = "fakestreams"
    has_streams = True
    zero_time = False

    def torch_api(self) -> Any:
        return FakeStreamsApi(self.zero_time)


class ZeroTimerStreamsBackend(FakeStreamsBackend):
    name = "zerotimer"
    zero_time = True


# --- wrong device ops -----------------------------------------------------------------------

def _chunked_low_precision(a: torch.Tensor, b: torch.Tensor, acc_dtype: torch.dtype, chunk: int) -> torch.Tensor:
    """a @ b with partial sums over K-chunks of ``chunk`` computed exactly, but the running
    total kept in ``acc_dtype`` — the low-precision accumulator of a broken kernel."""
    m, k = a.shape
    n = b.shape[1]
    c = chunk if k % chunk == 0 else 1
    parts = torch.einsum("mkc,kcn->kmn", a.float().reshape(m, k // c, c), b.float().reshape(k // c, c, n))
    acc = torch.zeros((m, n), dtype=acc_dtype)
    for p in parts:
        acc = (acc.float() + p).to(acc_dtype)
    return acc.to(a.dtype)


class LowPrecisionAccumulationOps(DeviceOps):
    """Accumulates every float matmul in ``acc_dtype`` (bf16 or fp16) over K-chunks."""

    def __init__(self, acc_dtype: torch.dtype = torch.bfloat16, chunk: int = 16) -> None:
        self.acc_dtype = acc_dtype
        self.chunk = chunk

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not a.is_floating_point():
            return super().matmul(a, b)
        return _chunked_low_precision(a, b, self.acc_dtype, self.chunk)


class Tf32Ops(DeviceOps):
    """fp32 matmul whose inputs are rounded to TF32 (10 mantissa bits) — TF32 silently on."""

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.dtype != torch.float32:
            return super().matmul(a, b)

        def tf32(x: torch.Tensor) -> torch.Tensor:
            bits = x.contiguous().view(torch.int32)
            rounded = (bits + 0x1000) & ~0x1FFF  # round to nearest, drop the low 13 mantissa bits
            return rounded.view(torch.float32)

        return torch.matmul(tf32(a), tf32(b))


class PerturbedOps(DeviceOps):
    """Correct matmul, then one element moved by ``rel`` × max|result|."""

    def __init__(self, rel: float) -> None:
        self.rel = rel

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = super().matmul(a, b)
        i, j = c.shape[0] // 3, c.shape[1] // 2
        c[i, j] = (c[i, j].float() + self.rel * c.float().abs().max()).to(c.dtype)
        return c


class NanOps(DeviceOps):
    """Correct matmul with one NaN in the result."""

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = super().matmul(a, b)
        if c.is_floating_point():
            c[0, -1] = float("nan")
        return c


class UpcastOutputOps(DeviceOps):
    """Returns the result in fp32 whatever the input dtype (right numbers, wrong dtype)."""

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a.float(), b.float())


class BlockedReverseOps(DeviceOps):
    """A correct implementation with another summation order: K in blocks of 96 (not a power
    of two), summed last block first, fp32 accumulation, one rounding to the output dtype."""

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not a.is_floating_point():
            return super().matmul(a, b)
        k = a.shape[1]
        acc = torch.zeros((a.shape[0], b.shape[1]), dtype=torch.float32)
        starts = list(range(0, k, 96))
        for s in reversed(starts):
            acc += a[:, s:s + 96].float() @ b[s:s + 96].float()
        return acc.to(a.dtype)


class SlowDtypeOps(DeviceOps):
    """Makes one dtype's matmul as slow as a device doing ``gflops`` GFLOP/s (by sleeping)."""

    def __init__(self, dtype: torch.dtype, gflops: float) -> None:
        self.dtype = dtype
        self.gflops = gflops

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = super().matmul(a, b)
        if a.dtype == self.dtype:
            time.sleep(2.0 * a.shape[0] * a.shape[1] * b.shape[1] / (self.gflops * 1e9))
        return c


class PrecisionSpyOps(DeviceOps):
    """Records the global fp32 matmul precision in force while the matmul runs."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.seen.add(torch.get_float32_matmul_precision())
        return super().matmul(a, b)


class FlipBitOps(DeviceOps):
    """Flips one bit of one element on the way back from the device, for the given dtypes
    (all when None)."""

    def __init__(self, element: int = 12345, bit: int = 0, only: tuple[torch.dtype, ...] | None = None) -> None:
        self.element, self.bit, self.only = element, bit, only

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        out = super().to_host(t)
        if self.only is not None and out.dtype not in self.only:
            return out
        raw = out.view(-1).view(torch.uint8)
        byte = (self.element * out.element_size()) % raw.numel()
        raw[byte] ^= 1 << self.bit
        return out


class NanCanonicalisingOps(DeviceOps):
    """A copy that replaces every NaN by the canonical NaN (payloads and signalling bits
    lost): equal under ``torch.equal(..., equal_nan)``-style float compares, not bit-exact."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        out = super().to_host(t)
        if out.dtype in (torch.float32, torch.float16, torch.bfloat16):
            out = torch.where(torch.isnan(out), torch.tensor(float("nan"), dtype=out.dtype), out)
        return out


class SignedZeroLosingOps(DeviceOps):
    """A 'copy' implemented as x + 0.0, which turns -0.0 into +0.0."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        out = super().to_host(t)
        if out.dtype in (torch.float32, torch.float16, torch.bfloat16):
            out = torch.where(torch.isnan(out), out, out + 0.0)
        return out


class MissOneFillOps(DeviceOps):
    """fill_ that leaves one element (near the end) with its old value."""

    def fill_(self, t: torch.Tensor, value: float) -> torch.Tensor:
        flat = t.view(-1)
        keep = flat[-7].clone()
        t.fill_(value)
        flat[-7] = keep if keep.item() != value else keep + 1
        return t


class MissLastZeroOps(DeviceOps):
    """zero_ that stops one element short."""

    def zero_(self, t: torch.Tensor) -> torch.Tensor:
        t.view(-1)[:-1].zero_()
        return t


class BlindCountOps(DeviceOps):
    """A device reduction that never sees a mismatch."""

    def count_ne(self, t: torch.Tensor, expected: Any) -> int:
        return 0


class CountingOps(DeviceOps):
    """Tells :class:`AllocatorStatsBackend` about each filled tensor while it is alive
    (``leak=True`` keeps a reference, like a cache that never frees)."""

    def __init__(self, backend: AllocatorStatsBackend, leak: bool = False) -> None:
        self.backend = backend
        self.leak = leak
        self.kept: list[torch.Tensor] = []

    def fill_(self, t: torch.Tensor, value: float) -> torch.Tensor:
        size = t.numel() * t.element_size()
        self.backend.live += size
        self.backend.peak = max(self.backend.peak, self.backend.live)

        def release(backend: AllocatorStatsBackend = self.backend, size: int = size) -> None:
            backend.live -= size

        weakref.finalize(t, release)
        if self.leak:
            self.kept.append(t)
        return t.fill_(value)


class LeakingOps(DeviceOps):
    """Keeps every filled tensor alive: the memory is never released."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    def fill_(self, t: torch.Tensor, value: float) -> torch.Tensor:
        self.kept.append(t)
        return t.fill_(value)
