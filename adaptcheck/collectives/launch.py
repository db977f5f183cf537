"""The collectives launcher: one process per rank on this machine (a :class:`WorkerConfig` each),
loopback rendezvous, a deadline, every rank killed when one hangs or dies, and what each left
— its validated :class:`~adaptcheck.base.schemas.micro_evidence.RankRecord` lines, how it
ended, its log's tail — as a :class:`LaunchResult`. Details: docs/cluster.md ("How collectives
are checked and timed", The launcher).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adaptcheck.base.procs import child_environ, free_port, kill_group
from adaptcheck.base.schemas.micro_evidence import RankRecord

# --- launcher -----------------------------------------------------------------------------

WORKER_MODULE = "adaptcheck.collectives.worker"


class BenchSettings(BaseModel):
    """How bench mode times each case (:func:`~adaptcheck.collectives.worker.run_bench_case`)."""

    model_config = ConfigDict(extra="forbid")

    warmup: int = Field(default=2, ge=1, description="Warm-up calls (the fastest is the per-call estimate).")
    min_reps: int = Field(default=5, ge=1, description="Fewest timed repetitions.")
    max_reps: int = Field(default=50, ge=1, description="Most timed repetitions.")
    budget_s: float = Field(default=0.5, ge=0, description="Timed wall time aimed at once min_reps are done.")
    min_sample_s: float = Field(default=1e-3, gt=0, description="Shortest repetition: calls are batched to last this.")


class WorkerConfig(BaseModel):
    """What every rank is told (its one command-line argument, as JSON); the rank adds RANK from
    the environment and the launcher the rank's own ``results`` file."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(description="adaptcheck backend name (used when backend_class cannot be imported).")
    backend_class: str | None = Field(default=None, description="'module:Class' of the very backend the check used.")
    mode: str | None = Field(default=None, description="'bench': time the cases (step 5); else check exactly (step 4).")
    ops: list[str] = Field(default_factory=list, description="Collectives checked exactly, in order.")
    dtypes: list[str] = Field(default_factory=list, description="Dtypes checked exactly.")
    elements: list[int] = Field(default_factory=list, description="Per-rank chunk sizes checked exactly.")
    cases: list[tuple[str, str, int]] = Field(default_factory=list, description="Bench mode: (op, dtype, elements) "
                                              "timed, in order.")
    impl: str | None = Field(default=None, description="'module:object' replacing the torch.distributed ops.")
    timeout_s: float = Field(gt=0, description="The launcher's deadline (the process group's own is 60 s later).")
    bench: BenchSettings = Field(default_factory=BenchSettings, description="Bench mode's timing settings.")
    results: str | None = Field(default=None, description="JSON-lines file this rank appends its records to.")


@dataclass
class RankExit:
    """How one rank process ended."""

    rank: int
    returncode: int | None
    """Exit code, -signal when killed by a signal, None if it could not be started."""
    killed: str | None = None
    """Why the launcher killed it ('timeout', 'peer died'), None if it ended by itself."""
    last_line: str = ""
    """What its log says last: the error line of a traceback or fatal signal, else the last
    non-empty line."""
    stuck_at: str = ""
    """For a rank killed while hung: its innermost Python frame from the stack dump."""
    ended_s: float | None = None
    """When the launcher saw it end (seconds after launch): the first to die is the cause."""
    log: str = ""


@dataclass
class LaunchResult:
    """Everything the ranks left behind."""

    records: dict[int, list[RankRecord]]
    exits: list[RankExit]
    wall_s: float
    logs_dir: str
    timeout_s: float | None = None
    attempts: int = 1
    notes: list[str] = field(default_factory=list)


def loopback_interface() -> str | None:
    """Name of the loopback interface ('lo' on Linux, 'lo0' on macOS), None if unknown."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    for name in names:
        if name in ("lo", "lo0"):
            return name
    return next((n for n in names if n.startswith("lo")), None)


_ERROR_LINE_RE = re.compile(r"^(Fatal Python error: .*|[\w.]*(Error|Exception|Interrupt|Exit)\b.*)$")


def _log_lines(path: Path | str, tail_bytes: int = 32768) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail_bytes))
            return [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return []


def last_line(lines: list[str]) -> str:
    """What a dead rank said last. A Python traceback or faulthandler report ends in stack
    frames or the exception; the exception / "Fatal Python error" line is the reason."""
    for line in reversed(lines):
        if _ERROR_LINE_RE.match(line):
            return line[:500]
    return lines[-1][:500] if lines else ""


def stuck_frame(lines: list[str]) -> str:
    """Innermost frame of the main thread in the last faulthandler dump (SIGUSR1 before the
    kill): where a hung rank was waiting. Empty when there is no dump."""
    headers = [i for i, ln in enumerate(lines) if ln.endswith("(most recent call first):")]
    for start in headers:
        block: list[str] = []
        for ln in lines[start + 1:]:
            if not ln.startswith("File "):
                break
            block.append(ln)
        if any(ln.endswith(" in main") for ln in block):  # the thread running the worker's main()
            return block[0][:500]
    return ""


def read_records(path: Path) -> list[RankRecord]:
    """A rank's JSON-lines records, validated; a torn last line (rank killed mid-write) is dropped,
    and so is a line that is not a record (nothing a rank writes: it cannot be read as evidence)."""
    out: list[RankRecord] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(RankRecord.model_validate_json(line))
        except ValidationError:
            continue
    return out


def _dump_stacks(procs: list[subprocess.Popen[bytes]], wait_s: float = 0.5) -> None:
    """Ask hung ranks for their Python stacks (faulthandler on SIGUSR1) before killing them,
    so the log shows where they were stuck. The dump is written from the signal handler
    even while the rank is blocked in native code; the rank keeps running afterwards."""
    sent = False
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGUSR1)
                sent = True
            except ProcessLookupError:
                pass
    if sent:
        time.sleep(wait_s)


def launch(config: WorkerConfig | Mapping[str, object], world_size: int, *, timeout_s: float, crash_grace_s: float,
           logs_dir: Path, extra_pythonpath: list[str] | None = None, attempts: int = 2) -> LaunchResult:
    """Run ``world_size`` ranks of the collectives worker and collect their records.

    ``config`` is passed to every rank as JSON (the rank adds its RANK from the
    environment); a mapping is validated as a :class:`WorkerConfig` first. Ranks rendezvous through ``env://`` on 127.0.0.1 and a free port. The
    launcher never leaves a rank running: on the deadline, after a peer's death plus
    ``crash_grace_s``, or if the launcher itself is interrupted, every rank's process group
    is SIGKILLed; ranks also ask the kernel to kill them if the launcher dies
    (PR_SET_PDEATHSIG), which covers the launcher being SIGKILLed by the ladder runner.
    PR_SET_PDEATHSIG follows the *thread* that started the rank: call this from a thread that
    outlives the run (the worker's main thread does).
    """
    if not isinstance(config, WorkerConfig):
        config = WorkerConfig.model_validate(dict(config))
    start = time.monotonic()
    notes: list[str] = []
    result: LaunchResult | None = None
    for attempt in range(1, attempts + 1):
        remaining = timeout_s - (time.monotonic() - start)
        attempt_dir = logs_dir if attempt == 1 else logs_dir / f"attempt{attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        result = _launch_once(config, world_size, timeout_s=remaining, crash_grace_s=crash_grace_s,
                              logs_dir=attempt_dir, extra_pythonpath=extra_pythonpath or [])
        result.attempts, result.notes = attempt, notes
        # A port taken between free_port() and rank 0's bind is the one failure worth
        # retrying: nothing about the machine was learnt.
        lost_port = any("address already in use" in " ".join(_log_lines(e.log)).lower() for e in result.exits)
        if not lost_port or any(r.event == "op" for rs in result.records.values() for r in rs):
            break
        notes.append(f"attempt {attempt}: rendezvous port was taken by another process, retried")
    assert result is not None
    result.wall_s, result.timeout_s = time.monotonic() - start, timeout_s
    return result


def _launch_once(config: WorkerConfig, world_size: int, *, timeout_s: float, crash_grace_s: float,
                 logs_dir: Path, extra_pythonpath: list[str]) -> LaunchResult:
    port = free_port()
    env = child_environ()  # not what an in-process engine (step 4's vLLM) set for itself
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
               PYTHONUNBUFFERED="1", ADAPTCHECK_COLLECTIVES_PARENT=str(os.getpid()))
    lo = loopback_interface()
    if lo and "GLOO_SOCKET_IFNAME" not in env:
        # Keep gloo on loopback: a container hostname resolving to an unroutable address
        # otherwise makes the ranks connect nowhere and hang.
        env["GLOO_SOCKET_IFNAME"] = lo
    paths = [p for p in [*extra_pythonpath, env.get("PYTHONPATH", "")] if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    began = time.monotonic()
    killed: dict[int, str] = {}
    ended: dict[int, float] = {}
    try:
        for rank in range(world_size):
            log_path = logs_dir / f"rank{rank}.log"
            logs.append(log_path)
            rank_config = config.model_copy(update={"results": str(logs_dir / f"rank{rank}.jsonl")})
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", WORKER_MODULE, rank_config.model_dump_json()],
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: killpg reaches whatever it forked
                ))
        deadline = began + timeout_s
        first_death: float | None = None
        while True:
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            for i, c in enumerate(codes):
                if c is not None and i not in ended:
                    ended[i] = now - began
            if all(c is not None for c in codes):
                break
            if first_death is None and any(c not in (None, 0) for c in codes):
                first_death = now
            if now >= deadline or (first_death is not None and now >= first_death + crash_grace_s):
                reason = "timeout" if now >= deadline else "peer died"
                _dump_stacks(procs)
                for i, p in enumerate(procs):
                    if p.poll() is None:
                        killed[i] = reason
                        kill_group(p)
                break
            time.sleep(0.02)
    finally:
        # Whatever happened above (KeyboardInterrupt included), no rank outlives the launcher.
        for i, p in enumerate(procs):
            if p.poll() is None:
                killed.setdefault(i, "launcher interrupted")
                kill_group(p)
    exits = []
    for i, p in enumerate(procs):
        lines = _log_lines(logs[i])
        exits.append(RankExit(rank=i, returncode=p.returncode, killed=killed.get(i), last_line=last_line(lines),
                              stuck_at=stuck_frame(lines) if i in killed else "",
                              ended_s=ended.get(i), log=str(logs[i])))
    records = {i: read_records(logs_dir / f"rank{i}.jsonl") for i in range(world_size)}
    return LaunchResult(records=records, exits=exits, wall_s=time.monotonic() - began, logs_dir=str(logs_dir))
