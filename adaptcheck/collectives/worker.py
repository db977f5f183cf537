"""The rank side of a collectives run (one process = one rank = one device): joins the process
group, runs every case through :class:`TorchCollectives` (or the ``impl`` override), checks it
exactly (:func:`run_case`) or, in bench mode, times it (:func:`run_bench_case`), and appends
one :class:`~adaptcheck.base.schemas.micro_evidence.RankRecord` line per event to its results
file, flushed at once. Details: docs/cluster.md ("How collectives are checked and timed").
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import IO, TYPE_CHECKING

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.base.plugins import load_ref
from adaptcheck.base.procs import set_parent_death_signal
from adaptcheck.base.schemas.micro_evidence import RankRecord
from adaptcheck.collectives.exact import (
    broadcast_source,
    buffer_sizes,
    build_input,
    classify_exception,
    compare,
    expected_output,
    output_buffer,
)
from adaptcheck.collectives.launch import BenchSettings, WorkerConfig

if TYPE_CHECKING:
    import torch

    from adaptcheck.backends.base import Backend


class TorchCollectives:
    """The ops as vLLM calls them: ``torch.distributed`` on the default process group.

    Tests substitute a deliberately wrong subclass (through the check's ``impl`` param) to
    prove the check catches it; a vendor may substitute its own communicator the same way.
    Every method leaves its result in ``output`` (in place for all_reduce/broadcast).
    """

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        # torch 2.13 renamed the flat-tensor all-gather / reduce-scatter (the ones vLLM
        # uses) to *_single and deprecated the old names; older torch only has the old ones.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def apis(self) -> dict[str, str]:
        """The torch.distributed function behind each op (evidence in the details)."""
        return {"all_reduce": "all_reduce", "all_gather": self._all_gather.__name__,
                "reduce_scatter": self._reduce_scatter.__name__, "all_to_all": "all_to_all_single",
                "broadcast": "broadcast"}

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._all_gather(output, input)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._reduce_scatter(output, input, op=self.dist.ReduceOp.SUM)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self.dist.all_to_all_single(output, input)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.dist.broadcast(tensor, src=src)


def load_impl(ref: str | None) -> TorchCollectives:
    """The default implementation, or ``'module:object'`` (a class or factory) instantiated."""
    if not ref:
        return TorchCollectives()
    obj = load_ref(ref)
    impl = obj() if isinstance(obj, type) or not hasattr(obj, "all_reduce") else obj
    return impl


def execute(impl: TorchCollectives, op: str, inp: torch.Tensor, out: torch.Tensor, world_size: int) -> torch.Tensor:
    """Run one op; returns the tensor holding the result (``inp`` itself for in-place ops)."""
    if op == "all_reduce":
        impl.all_reduce(inp)
        return inp
    if op == "broadcast":
        impl.broadcast(inp, broadcast_source(world_size))
        return inp
    if op == "all_gather":
        impl.all_gather(out, inp)
    elif op == "reduce_scatter":
        impl.reduce_scatter(out, inp)
    elif op == "all_to_all":
        impl.all_to_all(out, inp)
    else:
        raise ValueError(f"unknown collective {op!r}")
    return out


def run_case(impl: TorchCollectives, backend: Backend, rank: int, world_size: int, op: str, dtype: str,
             elements: int, *, device_index: int | None = None) -> RankRecord:
    """Run one (op, dtype, size) on this rank and check it exactly; one JSON-able record.

    ``status`` is ``ok``, ``mismatch`` (with count, first index and values), ``unsupported``
    or ``raised`` (with the error). Inputs and the expectation are built on the CPU from
    the pure functions, so the device under test computes nothing the check relies on.
    ``device_index`` is the device this rank drives: its rank on one machine (the default),
    its local rank when ranks span several (:mod:`adaptcheck.cluster.rank`).
    """
    index = rank if device_index is None else device_index
    device = backend.torch_device(index)
    rec = RankRecord(event="op", key=f"{op}/{dtype}/{elements}", op=op, dtype=dtype, elements=elements)
    inp = build_input(op, world_size, rank, elements, dtype).to(device)
    out = output_buffer(op, world_size, elements, dtype, device=device)
    backend.synchronize(index)
    start = time.perf_counter()
    try:
        result = execute(impl, op, inp, out, world_size)
        backend.synchronize(index)  # the op is done only when the device says so
    except Exception as exc:  # noqa: BLE001 - a failing collective is the finding, not a crash
        rec.status, rec.error = classify_exception(exc), f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        return rec
    rec.time_s = time.perf_counter() - start
    cmp = compare(result, expected_output(op, world_size, rank, elements, dtype))
    rec.mismatches, rec.first_index, rec.got, rec.expected = (cmp["mismatches"], cmp["first_index"], cmp["got"],
                                                              cmp["expected"])
    rec.status = "ok" if rec.mismatches == 0 else "mismatch"
    return rec


# --- step 5: timing (bench mode) ----------------------------------------------------------

def run_bench_case(impl: TorchCollectives, backend: Backend, rank: int, world_size: int, op: str, dtype: str,
                   elements: int, bench: BenchSettings, *, device_index: int | None = None) -> RankRecord:
    """Time one (op, dtype, size) on this rank; one JSON-able record with per-call samples.

    As nccl-tests do: warm-up calls, then repetitions of ``inner`` back-to-back calls timed
    by the host around a device synchronize, the time per call being the repetition's time
    ÷ ``inner``. Each repetition starts after a barrier, so a rank's samples measure the
    collective and not a peer's late start. The repetition and inner counts must be the
    same on every rank (a rank that called once more would hang its peers), so they are
    derived from the *largest* warm-up estimate, agreed on with an all-reduce (MAX).
    Buffers hold zeros: repeated in-place reductions stay finite whatever the count.
    ``device_index`` as for :func:`run_case`.
    """
    import math

    import torch

    dist = impl.dist
    index = rank if device_index is None else device_index
    device = backend.torch_device(index)
    rec = RankRecord(event="bench", key=f"{op}/{dtype}/{elements}", op=op, dtype=dtype, elements=elements)
    numel_in, numel_out = buffer_sizes(op, world_size, elements)
    inp = torch.zeros(numel_in, dtype=torch_dtype(dtype), device=device)
    out = torch.zeros(numel_out, dtype=torch_dtype(dtype), device=device)
    warm: list[float] = []
    try:
        for _ in range(max(1, bench.warmup)):
            backend.synchronize(index)
            t0 = time.perf_counter()
            execute(impl, op, inp, out, world_size)
            backend.synchronize(index)
            warm.append(time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - an unsupported op/dtype is a finding, not a crash
        rec.status, rec.error = classify_exception(exc), f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        return rec
    agreed = torch.tensor([min(warm)], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    estimate = max(float(agreed.item()), 1e-9)
    inner = max(1, min(1 << 12, math.ceil(bench.min_sample_s / estimate)))
    reps = max(bench.min_reps, min(bench.max_reps, math.ceil(bench.budget_s / (estimate * inner))))
    samples: list[float] = []
    for _ in range(reps):
        dist.barrier()
        backend.synchronize(index)
        t0 = time.perf_counter()
        for _ in range(inner):
            execute(impl, op, inp, out, world_size)
        backend.synchronize(index)
        samples.append((time.perf_counter() - t0) / inner)
    rec.status, rec.samples, rec.inner, rec.warmup, rec.estimate_s = "ok", samples, inner, len(warm), estimate
    return rec


def _bench_loop(fh: IO[str], config: WorkerConfig, impl: TorchCollectives, backend: Backend, rank: int,
                world_size: int) -> None:
    """Bench mode: every case ``[op, dtype, elements]`` of ``config["cases"]`` timed, one
    ``bench`` record each (the launcher chose ``elements`` per op and dtype for a byte size)."""
    import torch.distributed as dist

    for op, dtype, n in config.cases:
        dist.barrier()
        _emit(fh, RankRecord(event="begin", key=f"{op}/{dtype}/{n}", op=op, dtype=dtype, elements=n))
        _emit(fh, run_bench_case(impl, backend, rank, world_size, op, dtype, n, config.bench))


# --- process plumbing ---------------------------------------------------------------------

def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when the launcher dies (even by SIGKILL), then make sure
    it has not died already in the window before the request (our parent would be init)."""
    parent = int(os.environ.get("ADAPTCHECK_COLLECTIVES_PARENT", "0") or 0)
    # Best effort: where the kernel cannot do it, the launcher's deadline and kill_group
    # still end the rank, only not when the launcher itself is SIGKILLed.
    with contextlib.suppress(OSError):
        set_parent_death_signal(signal.SIGKILL)
    if parent and os.getppid() != parent:
        os._exit(3)


def bind_device(backend: Backend, index: int, ranks_on_host: int) -> None:
    """Prepare this process to drive device ``index`` before the process group forms.

    On an accelerator the collective library binds each rank's communicator to "the current
    device", so it is set first; on a CPU the ranks of one host share its cores, and without
    a split each would start one thread per core.
    """
    import torch

    if backend.is_accelerator:
        set_device = getattr(backend.torch_api(), "set_device", None)
        if set_device is not None:
            set_device(index)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, ranks_on_host)))


def _emit(fh: IO[str], rec: RankRecord) -> None:
    if rec.t is None:
        rec.t = time.time()  # wall clock: lines up the ranks' logs and shows where time went
    fh.write(json.dumps(rec.dump(), default=str) + "\n")
    fh.flush()


def _load_backend(config: WorkerConfig) -> Backend:
    """The very backend class the check used (tests use unregistered ones), else by name."""
    ref = config.backend_class
    if ref:
        try:
            return load_ref(ref)()
        except (ImportError, AttributeError):
            pass
    from adaptcheck.backends.registry import get_backend

    return get_backend(config.backend)


def main(argv: list[str]) -> int:
    _die_with_parent()
    faulthandler.enable()  # a segfault in a collective library leaves a Python stack in the log
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher's "where are you stuck?"
    config = WorkerConfig.model_validate_json(argv[0])
    if config.results is None:
        raise SystemExit("the launcher gave this rank no results file")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(config.results, "a", encoding="utf-8") as fh:
        backend = _load_backend(config)
        device = backend.torch_device(rank)
        _emit(fh, RankRecord(event="start", rank=rank, pid=os.getpid(), device=str(device)))
        import torch
        import torch.distributed as dist

        bind_device(backend, rank, world_size)  # every rank of this launcher is on this host
        impl = load_impl(config.impl)
        t0 = time.perf_counter()
        # The launcher's deadline must be what ends a hang (it reports which rank and op, and
        # kills every rank); the process group's own timeout is only a backstop behind it, so
        # a peer does not turn the hang into a "raised" timeout error first.
        dist.init_process_group(backend.dist_backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=config.timeout_s + 60))
        dist.barrier()  # every rank is connected before anything is timed
        apis = impl.apis() if hasattr(impl, "apis") else {}
        _emit(fh, RankRecord(event="ready", init_s=time.perf_counter() - t0, apis=apis, torch=str(torch.__version__)))
        if config.mode == "bench":  # step 5's timing; the exactness path below is step 4's
            _bench_loop(fh, config, impl, backend, rank, world_size)
        else:
            for op in config.ops:
                for dtype in config.dtypes:
                    for n in config.elements:
                        dist.barrier()  # start together, so time_s is the op, not a peer's lag
                        _emit(fh, RankRecord(event="begin", key=f"{op}/{dtype}/{n}", op=op, dtype=dtype, elements=n))
                        _emit(fh, run_case(impl, backend, rank, world_size, op, dtype, n))
        dist.barrier()
        dist.destroy_process_group()
        _emit(fh, RankRecord(event="done"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
