"""Device-level smoke checks: visibility (``smoke.device_visible``), ``smoke.synchronize`` and
``smoke.streams_events``, all through ``ctx.backend`` / ``ctx.device``.

What each proves: docs/smoke.md (Device checks).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.schemas.smoke_evidence import DeviceVisibleEvidence, ProbeFacts, SynchronizeEvidence
from adaptcheck.ladder.check import CheckContext, NoParams, Outcome
from adaptcheck.steps.smoke.ops import SmokeCheck

if TYPE_CHECKING:
    import torch


def _placement_problem(t: torch.Tensor, ctx: CheckContext) -> str:
    """Why ``t`` is not on the selected device, or '' when it is."""
    want = ctx.device
    if t.device.type != ctx.backend.device_type:
        return f"tensor is on {t.device}, the backend's device type is {ctx.backend.device_type!r}"
    if want.index is not None and t.device.index != want.index:
        return f"tensor is on {t.device}, expected index {want.index}"
    return ""


class DeviceVisibleCheck(SmokeCheck):
    """The device is visible to PyTorch, with its count and name."""

    kind = "smoke.device_visible"
    description = "The device is visible to PyTorch, with its count and name, and tensors live and compute on it."
    params_model = NoParams

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        import torch

        backend = ctx.backend
        probe = backend.probe()
        evidence = DeviceVisibleEvidence(
            probe=ProbeFacts(available=probe.available, reason=probe.reason, device_count=probe.device_count),
            device_type=backend.device_type, torch_device=str(ctx.device))
        metrics = {"device_count": probe.device_count}
        if not probe.available:
            return Outcome.failed(f"{backend.display_name} not available: {probe.reason}", metrics=metrics,
                                  details=evidence.dump())
        if not 0 <= ctx.device_index < probe.device_count:
            return Outcome.failed(f"device index {ctx.device_index} does not exist ({probe.device_count} visible)",
                                  metrics=metrics, details=evidence.dump())
        name = backend.device_name(ctx.device_index)
        evidence.device_name = name
        if not name.strip():
            return Outcome.failed("the device reports an empty name", metrics=metrics, details=evidence.dump())
        made = torch.arange(16, dtype=torch.float32, device=ctx.device)
        copied = self.ops.to_device(torch.arange(16, dtype=torch.float32), ctx.device)
        total = made + copied
        problems = [f"{label}: {p}" for label, p in (("factory", _placement_problem(made, ctx)),
                                                      ("copy", _placement_problem(copied, ctx)),
                                                      ("result", _placement_problem(total, ctx))) if p]
        got = float(total.sum().item())
        evidence.sum_of_2x_arange16 = got
        if got != 240.0:  # 2 × (0 + … + 15), exact in fp32
            problems.append(f"a 16-element add and sum on the device gave {got}, expected 240")
        if problems:
            return Outcome.failed("; ".join(problems), metrics=metrics, details=evidence.dump())
        return Outcome.passed(f"{name} ({ctx.device}, {probe.device_count} visible)", metrics=metrics,
                              details=evidence.dump())


class SynchronizeParams(BaseModel):
    """Size of the queued work."""

    model_config = ConfigDict(extra="forbid")

    elements: int = Field(default=1 << 20, ge=1, le=1 << 30, description="fp32 elements updated by each queued op.")
    iterations: int = Field(default=64, ge=1, le=1 << 16, description="Queued in-place adds (≤2^16 keeps sums exact).")


class SynchronizeCheck(SmokeCheck):
    """Queued work is complete when synchronize returns."""

    kind = "smoke.synchronize"
    description = "backend.synchronize waits for queued device work; the results are complete and timed."
    params_model = SynchronizeParams

    def run(self, ctx: CheckContext, params: SynchronizeParams) -> Outcome:
        import torch

        backend, idx, n = ctx.backend, ctx.device_index, params.elements
        x = torch.zeros(n, dtype=torch.float32, device=ctx.device)
        host = torch.full((n,), -1.0, dtype=torch.float32)
        pinned: bool | str = False
        if backend.is_accelerator:
            try:  # a non-blocking copy is only asynchronous into page-locked memory
                host = host.pin_memory()
                pinned = True
            except Exception as exc:  # noqa: BLE001 - no pinned memory: the copy is synchronous, still valid
                pinned = f"not available: {type(exc).__name__}: {exc}"
        backend.synchronize(idx)
        t0 = time.perf_counter()
        for _ in range(params.iterations):
            x.add_(1.0)
        # Issued after the work on the same queue: if synchronize returned early, the host
        # buffer would still hold the -1 sentinel (or a partial sum).
        host.copy_(x, non_blocking=True)
        t1 = time.perf_counter()
        backend.synchronize(idx)
        t2 = time.perf_counter()
        host_wrong = int((host != float(params.iterations)).sum().item())
        dev_wrong = self.ops.count_ne(x, float(params.iterations))
        t3 = time.perf_counter()
        backend.synchronize(idx)
        idle_s = time.perf_counter() - t3
        metrics: dict[str, float] = {"enqueue_s": t1 - t0, "synchronize_s": t2 - t1, "total_s": t2 - t0,
                                     "idle_synchronize_s": idle_s, "elements": n, "iterations": params.iterations}
        evidence = SynchronizeEvidence(pinned_host_buffer=pinned, host_mismatches=host_wrong,
                                       device_mismatches=dev_wrong)
        if not backend.is_accelerator:
            evidence.note = "host device: work is synchronous, synchronize has nothing to wait for"
        details = evidence.dump()
        problems: list[str] = []
        if host_wrong:
            problems.append(f"{host_wrong} of {n} elements copied to the host after synchronize were not final")
        if dev_wrong:
            problems.append(f"{dev_wrong} of {n} elements on the device are wrong")
        if not t2 - t0 > 0:
            problems.append("the queued work took no measurable time (timer broken)")
        if problems:
            return Outcome.failed("; ".join(problems), metrics=metrics, details=details)
        return Outcome.passed(f"{params.iterations} queued ops complete after synchronize "
                              f"(queue {1e3 * (t1 - t0):.2f} ms, wait {1e3 * (t2 - t1):.2f} ms)",
                              metrics=metrics, details=details)


class StreamsEventsParams(BaseModel):
    """Size of the work on the side stream."""

    model_config = ConfigDict(extra="forbid")

    elements: int = Field(default=1 << 20, ge=1, le=1 << 30, description="fp32 elements updated on the side stream.")
    iterations: int = Field(default=32, ge=1, le=1 << 16, description="In-place adds queued on the side stream.")


class StreamsEventsCheck(SmokeCheck):
    """Side stream, events, cross-stream wait and event timing."""

    kind = "smoke.streams_events"
    description = "Work on a side stream, ordered by an event the main stream waits on; event timing works."
    params_model = StreamsEventsParams

    def run(self, ctx: CheckContext, params: StreamsEventsParams) -> Outcome:
        import torch

        backend = ctx.backend
        if not backend.has_streams:
            return Outcome.skipped(f"{backend.display_name} has no streams or events", applicable=False)
        api = backend.torch_api()
        dev = ctx.device
        main = api.current_stream(dev)
        side = api.Stream(device=dev)
        start = api.Event(enable_timing=True)
        end = api.Event(enable_timing=True)
        # Allocated and zeroed on the main stream, and kept alive until after synchronize, so
        # the caching allocator cannot hand its memory out while the side stream uses it.
        x = torch.zeros(params.elements, dtype=torch.float32, device=dev)
        side.wait_stream(main)  # the side stream must see the zeros
        with api.stream(side):
            start.record(side)
            for _ in range(params.iterations):
                x.add_(1.0)
            end.record(side)
        main.wait_event(end)
        y = x * 2.0  # on the main stream: correct only if it really waited for the side stream
        backend.synchronize(ctx.device_index)
        done = bool(end.query())
        elapsed_ms = float(start.elapsed_time(end))
        wrong = self.ops.count_ne(y, 2.0 * params.iterations)
        metrics: dict[str, float] = {"elapsed_ms": elapsed_ms, "elements": params.elements,
                                     "iterations": params.iterations, "mismatches": wrong}
        problems: list[str] = []
        if wrong:
            problems.append(f"{wrong} of {params.elements} elements wrong after the cross-stream wait")
        if not done:
            problems.append("the end event is not complete after synchronize")
        if not elapsed_ms > 0:
            problems.append(f"elapsed_time between the events is {elapsed_ms} ms (must be > 0)")
        if problems:
            return Outcome.failed("; ".join(problems), metrics=metrics)
        return Outcome.passed(f"side-stream work ordered by an event, {elapsed_ms:.3f} ms between events",
                              metrics=metrics)
