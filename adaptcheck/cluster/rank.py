"""One rank of ``adaptcheck cluster collectives``: reads its place from the launcher, drives device
``LOCAL_RANK``, joins the process group, runs step 4's exact cases (and, with ``--bench``, times
them) through the collectives worker code, shares its
:class:`~adaptcheck.base.schemas.micro_evidence.RankPayload` with every rank so all reach the
same verdict and exit code, and has rank 0 write the report; a watchdog ends any wait past
``join_timeout_s`` (exit 6) or ``timeout_s`` (exit 7). Details: docs/cluster.md.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import adaptcheck
from adaptcheck.base.dtypes import ITEMSIZE, CollectiveDtype, FloatDtype
from adaptcheck.base.errors import DeviceError, UsageError, exception_line
from adaptcheck.base.schemas.micro_evidence import RankPayload
from adaptcheck.base.schemas.results import utcnow
from adaptcheck.base.terminal import error_line
from adaptcheck.cluster.env import EXIT_PEER_LOST, EXIT_RENDEZVOUS, RankEnv
from adaptcheck.cluster.models import MultinodeCollectives, Settings
from adaptcheck.cluster.verdict import RunInfo, build_report
from adaptcheck.collectives.bandwidth import elements_for_bytes
from adaptcheck.collectives.exact import DEFAULT_DTYPES, OPS
from adaptcheck.collectives.launch import BenchSettings
from adaptcheck.collectives.plan import CollectivesParams, Plan, make_plan
from adaptcheck.perf.micro import MIB

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend

LEAVE_S = 20.0
"""After a failure, how long teardown may take before the rank exits without it."""

BenchOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]


def _default_bench_ops() -> list[BenchOp]:
    return ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]  # the four TP/EP uses, as perf.collectives


def _default_bench_dtypes() -> list[FloatDtype]:
    return ["bf16"]


class ClusterCollectivesOptions(BaseModel):
    """What ``adaptcheck cluster collectives`` checks (the same on every rank)."""

    model_config = ConfigDict(extra="forbid")

    device: str | None = Field(default=None, description="Backend name; None: as 'adaptcheck run' chooses.")
    out: Path = Field(description="Folder rank 0 writes collectives-multinode.json into.")
    ops: list[str] = Field(default_factory=lambda: list(OPS), description="Collectives checked exactly.")
    dtypes: list[CollectiveDtype] = Field(default_factory=lambda: list(DEFAULT_DTYPES), description="Dtypes checked.")
    elements: list[int] = Field(default_factory=lambda: [1, 1031, 1_048_583],
                                description="Per-rank chunk sizes (elements), as step 4: tiny, odd small, odd ~1M.")
    on_unsupported: Literal["fail", "report"] | None = Field(
        default=None, description="Cost of an op the library lacks; None: fail on accelerators, report on CPU.")
    bench: bool = Field(default=False, description="Also time algbw/busbw.")
    bench_ops: list[BenchOp] = Field(default_factory=_default_bench_ops, description="Collectives timed.")
    bench_dtypes: list[FloatDtype] = Field(default_factory=_default_bench_dtypes, description="Dtypes timed.")
    bench_sizes_mib: list[float] | None = Field(
        default=None, description="Full-tensor sizes S in MiB; None: [1, 256] on accelerators, [1, 32] on CPU.")
    bench_budget_s: float = Field(default=0.5, ge=0, le=600, description="Timed seconds per bench case.")
    timeout_s: float = Field(default=120, gt=0, le=24 * 3600,
                             description="Longest one collective or the final gather may take before the rank "
                                         "gives up on its peers (exit 7).")
    join_timeout_s: float = Field(default=300, gt=0, le=24 * 3600,
                                  description="Longest a rank waits for every peer to join the group (exit 6).")
    impl: str | None = Field(default=None, pattern=r"^[\w.]+:[\w.]+$",
                             description="'module:object' replacing torch.distributed (tests, vendor overrides).")


class Watchdog:
    """Ends this process when the current phase outlives its limit.

    The main thread may be blocked inside a collective library (a peer that hangs, a
    network that drops packets) where neither signals nor Python timeouts reach it; this
    daemon thread still runs, reports through ``on_expire`` and never returns.
    """

    def __init__(self, on_expire: Callable[[str, int], None], poll_s: float = 0.1,
                 exit: Callable[[int], None] = os._exit) -> None:
        self._on_expire, self._exit = on_expire, exit
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._phase, self._limit_s, self._code, self._deadline = "", 0.0, 0, float("inf")
        self._report = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="adaptcheck-watchdog", daemon=True)
        self._thread.start()

    def enter(self, phase: str, limit_s: float, code: int, *, report: bool = True) -> None:
        """Start a phase: ``phase`` must end within ``limit_s`` or the process exits ``code``
        (after ``on_expire`` unless ``report`` is False: the verdict is already out)."""
        with self._lock:
            self._phase, self._limit_s, self._code, self._report = phase, limit_s, code, report
            self._deadline = time.monotonic() + limit_s

    @property
    def phase(self) -> str:
        return self._phase

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._lock:
                late = time.monotonic() > self._deadline
                phase, limit_s, code, report = self._phase, self._limit_s, self._code, self._report
            if late:
                if report:
                    self._on_expire(f"{phase} took longer than {limit_s:g} s", code)
                self._exit(code)  # on_expire should have exited; make sure
                return


class _Rank:
    """The state of this rank's run: what it did so far, for the report and the watchdog."""

    def __init__(self, env: RankEnv, backend: Backend, options: ClusterCollectivesOptions, plan: Plan,
                 settings: Settings, bench_cases: list[tuple[str, str, int]],
                 bench_skipped: list[tuple[str, str, int, str]]) -> None:
        import torch

        self.env, self.backend, self.options, self.plan, self.settings = env, backend, options, plan, settings
        self.bench_cases, self.bench_skipped = bench_cases, bench_skipped
        self.started_at, self.t0 = utcnow(), time.monotonic()
        self.watchdog: Watchdog | None = None
        self.torch_version = str(torch.__version__)
        self.payload = RankPayload(
            rank=env.rank, local_rank=env.local_rank, node_rank=env.node_rank, hostname=socket.gethostname(),
            device=str(backend.torch_device(env.local_rank)), pid=os.getpid(), init_s=None, records=[], bench=[])

    def report(self, payloads: list[dict[str, object]], failure: tuple[int, str] | None = None) -> MultinodeCollectives:
        info = RunInfo(started_at=self.started_at, wall_s=time.monotonic() - self.t0,
                       adaptcheck_version=adaptcheck.__version__, torch_version=self.torch_version,
                       backend=self.backend.name, world_size=self.env.world_size, master=self.env.master,
                       run_id=self.env.run_id)
        return build_report(info, self.plan, self.settings, payloads, self.bench_cases, self.bench_skipped,
                            failure=failure)

    def give_up(self, reason: str, code: int) -> MultinodeCollectives:
        """The report of a run that could not finish, from this rank's own records (written by rank 0)."""
        if self.watchdog is not None:
            # Leaving with a broken process group can block in its teardown (a library waiting
            # on the dead peer); the verdict is out, so then just go.
            self.watchdog.enter("leaving after a failure", LEAVE_S, code, report=False)
        where = f"rank {self.env.rank} ({self.payload.hostname})"
        report = self.report([self.payload.dump()], failure=(code, f"{where}: {reason}"))
        if self.env.rank == 0:
            report.save(self.options.out)
        return report


def plan_bench(backend: Backend, options: ClusterCollectivesOptions,
               world_size: int) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int, str]], list[float]]:
    """(cases to time, cases left out with why, sizes in MiB), as ``perf.collectives`` plans them."""
    if not options.bench:
        return [], [], []
    sizes = options.bench_sizes_mib or ([1.0, 256.0] if backend.is_accelerator else [1.0, 32.0])
    cases: list[tuple[str, str, int]] = []
    skipped: list[tuple[str, str, int, str]] = []
    for op in options.bench_ops:
        for dtype in options.bench_dtypes:
            for size in sizes:
                n = elements_for_bytes(op, world_size, int(size * MIB), ITEMSIZE[dtype])
                if dtype in ("bf16", "fp16") and dtype not in backend.dtypes:
                    skipped.append((op, dtype, n, f"{backend.name} does not declare {dtype}"))
                else:
                    cases.append((op, dtype, n))
    return cases, skipped, sizes


def _prepare(options: ClusterCollectivesOptions, environ: dict[str, str]) -> tuple[_Rank, Any]:
    """Everything that can be wrong before touching the network: usage (2), device (4)."""
    from adaptcheck.backends.registry import select_backend
    from adaptcheck.collectives.worker import load_impl

    env = RankEnv.from_environ(environ)
    backend, probe = select_backend(options.device)
    if backend.is_accelerator and env.local_rank >= probe.device_count:
        raise DeviceError(f"LOCAL_RANK {env.local_rank} needs device {env.local_rank}, but {probe.device_count} "
                          f"{backend.display_name} device(s) are visible on {socket.gethostname()}",
                          hint="use --nproc-per-node at most the device count of each node")
    try:
        params = CollectivesParams(ops=options.ops, dtypes=options.dtypes, elements=options.elements,
                                   on_unsupported=options.on_unsupported, impl=options.impl)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    plan = make_plan(backend, params, env.world_size)
    if not plan.dtypes:
        raise UsageError("no dtype can be checked exactly here: " + "; ".join(
            f"{d}: {why}" for d, why in plan.skipped_dtypes.items()), hint="choose others with --dtypes")
    try:
        impl = load_impl(options.impl)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load --impl {options.impl}: {type(exc).__name__}: {exc}") from None
    bench_cases, bench_skipped, sizes = plan_bench(backend, options, env.world_size)
    settings = Settings(ops=plan.ops, dtypes=plan.dtypes, elements=plan.elements, bench=options.bench,
                        bench_ops=list(options.bench_ops) if options.bench else [],
                        bench_dtypes=list(options.bench_dtypes) if options.bench else [], bench_sizes_mib=sizes,
                        timeout_s=options.timeout_s, join_timeout_s=options.join_timeout_s, impl=options.impl)
    return _Rank(env, backend, options, plan, settings, bench_cases, bench_skipped), impl


def run_cluster_collectives(options: ClusterCollectivesOptions,
                            environ: dict[str, str] | None = None) -> MultinodeCollectives:
    """Run this rank; returns the job's report (every rank gets the same verdict).

    Raises :class:`~adaptcheck.base.errors.UsageError` / :class:`~adaptcheck.base.errors.DeviceError`
    before joining the group. Once joined, failures are reports with ``status: error`` and
    exit code 6 or 7 — or, from the watchdog, a one-line message and an immediate exit.
    """
    import torch.distributed as dist

    from adaptcheck.collectives.worker import (
        bind_device,
        run_bench_case,
        run_case,
    )

    me, impl = _prepare(options, dict(os.environ if environ is None else environ))
    env, backend = me.env, me.backend

    def expire(reason: str, code: int) -> None:
        why = (": a node never started, a wrong MASTER_ADDR/endpoint, or a firewall between nodes (--join-timeout)"
               if code == EXIT_RENDEZVOUS else ": a peer hung, died or became unreachable (--timeout)")
        try:
            report = me.give_up(reason + why, code)
            error_line(report.message)
        finally:
            sys.stdout.flush()
            os._exit(code)

    watchdog = me.watchdog = Watchdog(expire)
    finished = False
    try:
        bind_device(backend, env.local_rank, env.local_world_size)
        watchdog.enter(f"joining the process group at {env.master} ({env.world_size} ranks)",
                       options.join_timeout_s, EXIT_RENDEZVOUS)
        t0 = time.perf_counter()
        backstop = timedelta(seconds=max(options.timeout_s, options.join_timeout_s) + 60)
        try:
            dist.init_process_group(backend.dist_backend, init_method="env://", rank=env.rank,
                                    world_size=env.world_size, timeout=backstop)
            # Plain-object gathering rides on gloo whatever the device library is.
            control = None if backend.dist_backend == "gloo" else dist.new_group(backend="gloo", timeout=backstop)
            dist.barrier()
        except Exception as exc:  # noqa: BLE001 - any failure to form the group is the finding
            return me.give_up(f"the process group did not form at {env.master}: {exception_line(exc)}",
                              EXIT_RENDEZVOUS)
        me.payload.init_s = round(time.perf_counter() - t0, 3)
        try:
            for op in me.plan.ops:
                for dtype in me.plan.dtypes:
                    for n in me.plan.elements:
                        watchdog.enter(f"{op} ({dtype}, {n} elements)", options.timeout_s, EXIT_PEER_LOST)
                        dist.barrier()
                        me.payload.records.append(run_case(impl, backend, env.rank, env.world_size, op, dtype, n,
                                                           device_index=env.local_rank))
            bench = BenchSettings(warmup=2, min_reps=5, max_reps=50, budget_s=options.bench_budget_s)
            for op, dtype, n in me.bench_cases:
                watchdog.enter(f"timing {op} ({dtype}, {n} elements)", options.timeout_s, EXIT_PEER_LOST)
                dist.barrier()
                me.payload.bench.append(run_bench_case(impl, backend, env.rank, env.world_size, op, dtype, n, bench,
                                                       device_index=env.local_rank))
            watchdog.enter("gathering the ranks' results", options.timeout_s, EXIT_PEER_LOST)
            gathered: list[Any] = [None] * env.world_size
            dist.all_gather_object(gathered, me.payload.dump(), group=control)  # plain JSON data on the wire
            report = me.report([p for p in gathered if isinstance(p, dict)])
            if env.rank == 0:
                report.save(options.out)
            dist.barrier(group=control)  # nobody exits (and makes torchrun stop the node) before the file exists
        except Exception as exc:  # noqa: BLE001 - a peer that vanished surfaces as any error here
            return me.give_up(_lost_peer(me.payload, watchdog.phase, exc), EXIT_PEER_LOST)
        dist.destroy_process_group()
        finished = True
        return report
    finally:
        if finished:
            watchdog.stop()  # else it stays on guard over the teardown (give_up set its limit)


def _lost_peer(payload: RankPayload, phase: str, exc: BaseException) -> str:
    """Where the peer was lost: the collective that raised first (its own call saw the peer go,
    e.g. "connection closed"), else the phase whose barrier or gather failed."""
    done = payload.bench or payload.records
    last = done[-1] if done else None
    if last is not None and last.status == "raised":
        return f"lost a peer in {last.op} ({last.dtype}, {last.elements} elements): {last.error or ''}"
    return f"lost a peer during {phase}: {exception_line(exc)}"
