"""The device operations the smoke checks judge, behind one substitutable seam
(:class:`DeviceOps`), and a synchronized timer.

Why the seam exists: docs/smoke.md (The device-operations seam).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeVar

from adaptcheck.ladder.check import Check

if TYPE_CHECKING:
    import torch

    from adaptcheck.backends.base import Backend

T = TypeVar("T")


class DeviceOps:
    """Plain torch implementation of the operations the smoke checks exercise.

    Methods are deliberately small so a test subclass can replace exactly one of them.
    """

    def to_device(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Host → device copy. ``copy=True`` so that on a host-memory device (CPU) this is a
        real copy and not the source tensor itself (a round trip of an alias proves nothing)."""
        return t.to(device, copy=True)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """Device → host copy (always a new tensor, even when the device is the host)."""
        import torch

        return t.to(torch.device("cpu"), copy=True)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The device matmul under test."""
        import torch

        return torch.matmul(a, b)

    def fill_(self, t: torch.Tensor, value: float) -> torch.Tensor:
        """Fill in place on the device."""
        return t.fill_(value)

    def zero_(self, t: torch.Tensor) -> torch.Tensor:
        """Zero in place on the device."""
        return t.zero_()

    def copy_(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Device-side copy (with broadcasting), used to write address-dependent patterns."""
        return dst.copy_(src)

    COUNT_CHUNK_ELEMENTS = 1 << 25
    """Elements compared per step of :meth:`count_ne`: bounds its temporary mask (32 MiB of
    bool) whatever the size of the tensor, which may already fill a large share of memory."""

    def count_ne(self, t: torch.Tensor, expected: torch.Tensor | float) -> int:
        """Number of elements of ``t`` that differ from ``expected`` (a scalar, or a tensor
        broadcastable to ``t`` whose first dimension is 1 or ``t``'s), reduced on the device
        so that only one number crosses to the host however large ``t`` is. NaN counts as
        a mismatch; floats compare by value (bit-exactness is the round trip's concern)."""
        import torch

        if t.dim() == 0:
            t = t.reshape(1)
        rows = t.shape[0]
        row_elems = max(1, t.numel() // max(rows, 1))
        step = max(1, self.COUNT_CHUNK_ELEMENTS // row_elems)
        per_row: torch.Tensor | None = None  # an expected tensor with one row per row of t is sliced with it
        if isinstance(expected, torch.Tensor) and expected.dim() == t.dim() and expected.shape[0] == rows > 1:
            per_row = expected
        # One mask buffer reused by every chunk: a fresh temporary per chunk costs page
        # faults on host memory and allocator churn on devices (measured 2.5× slower on CPU).
        mask = torch.empty(min(rows, step) * row_elems, dtype=torch.bool, device=t.device)
        total = torch.zeros((), dtype=torch.int64, device=t.device)
        for start in range(0, rows, step):
            part = t[start:start + step]
            want = per_row[start:start + step] if per_row is not None else expected
            out = mask[:part.numel()].view(part.shape)
            total += torch.count_nonzero(torch.ne(part, want, out=out))
        return int(total.item())


def timed(backend: Backend, device_index: int, fn: Callable[[], T]) -> tuple[T, float]:
    """Run ``fn`` and return (its result, seconds), synchronizing the device before and
    after: on asynchronous devices a launch returns long before the work is done."""
    backend.synchronize(device_index)
    start = time.perf_counter()
    out = fn()
    backend.synchronize(device_index)
    return out, time.perf_counter() - start


class SmokeCheck(Check):
    """Base of the step-2 checks: step 2, and the :class:`DeviceOps` seam.

    The worker builds checks with no arguments (plain torch); tests pass a wrong ``ops``.
    """

    step: ClassVar[int] = 2

    def __init__(self, ops: DeviceOps | None = None) -> None:
        self.ops = ops if ops is not None else DeviceOps()
