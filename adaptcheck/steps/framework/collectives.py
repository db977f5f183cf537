"""Step 4: multi-device collectives, checked exactly (``framework.collectives``).

This module owns three things, kept apart so that later work reuses them (multi-node runs,
step 5's algbw/busbw timing of the same ops):

1. **Pure per-op arithmetic** — :func:`buffer_sizes`, :func:`build_input`,
   :func:`expected_output`, :func:`compare`: what rank *r* of *n* puts in, and exactly what
   it must get back, for all-reduce, all-gather, reduce-scatter, all-to-all and broadcast.
   Inputs are integer-valued and positive, sized per dtype so that every partial sum is an
   exactly representable integer (float32 below 2^24, bf16 below 2^8 …); so the comparison
   is ``==``, whatever order the library reduces in, and there is no tolerance to hide a
   defect. Every value encodes the source rank and the element index, so a dropped or
   doubled contribution, two swapped chunks, a shifted chunk, the wrong broadcast source or
   an output the library never wrote (buffers start as -1) all change some element.
2. **The launcher** — :func:`launch` starts one process per rank
   (``python -m adaptcheck.steps.framework.collectives_worker``), rendezvous over
   ``127.0.0.1`` on a free port, waits with a deadline, and kills every rank when one hangs
   or dies (a hung collective is the classic failure; no rank is ever left behind).
3. **The verdict** — :func:`summarize` turns the ranks' JSON-lines records and how each
   process ended into an :class:`~adaptcheck.ladder.check.Outcome`.

The rank side (running one op through ``torch.distributed``) lives in
:mod:`.collectives_worker`.

Status policy
-------------
* ``error`` — the run could not finish: a rank crashed, hung past ``timeout_s`` or could not
  rendezvous (the message names the rank, the op in flight and the last line of its log).
* ``fail`` — some op returned a wrong element on some rank (named: op, dtype, size, rank,
  first wrong index), or raised an error other than "not supported". A wrong result seen
  before a crash still makes it ``fail``: the wrong answer is conclusive by itself.
* An op the library reports as *not supported* (``NotImplementedError`` or a "not supported"
  message) is recorded as ``unsupported``, never as wrong. ``on_unsupported`` decides what
  it costs: ``fail`` by default on accelerator backends (vLLM's tensor/expert parallelism
  calls all five ops through the device library, so a missing one blocks serving there);
  ``report`` by default on non-accelerator backends (CPU/gloo is a CI stand-in: the gap is
  listed in the message and details, and the check passes on the ops that did run, if any).
* ``skip`` — nothing to run: one device on an accelerator backend (``applicable=False``),
  more ranks asked for than devices, or no dtype left that can be checked exactly.
* ``pass`` — every op that ran matched exactly on every rank.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adaptcheck.ladder.check import Check, CheckContext, Outcome

if TYPE_CHECKING:
    import torch

    from adaptcheck.backends.base import Backend

# --- pure per-op arithmetic ---------------------------------------------------------------

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
"""The collectives checked, in the order they run (vLLM uses all five for TP/EP/PP)."""

DtypeName = Literal["fp32", "bf16", "fp16", "int8", "int32", "int64"]

EXACT_LIMIT: dict[str, int] = {
    # Largest L such that every integer in [0, L] is exactly representable: 2^(mantissa+1)
    # for floats, the positive maximum for signed integers.
    "fp32": 2**24,
    "bf16": 2**8,
    "fp16": 2**11,
    "int8": 2**7 - 1,
    "int32": 2**31 - 1,
    "int64": 2**63 - 1,
}

DEFAULT_DTYPES: tuple[DtypeName, ...] = ("fp32", "bf16", "int32")
"""fp32 (integer-valued, exact below 2^24), bf16 (what vLLM all-reduces activations in), int32
(an integer path: libraries implement integer reductions with separate kernels)."""

ITEMSIZE: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "int32": 4, "int64": 8}
"""Bytes per element (kept here so the launching process never needs to import torch)."""

SENTINEL = -1
"""Initial value of every output buffer: inputs are >= 1, so an unwritten element shows."""


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype of a dtype name used in params."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8,
            "int32": torch.int32, "int64": torch.int64}[name]


def value_scale(dtype: str, world_size: int) -> int:
    """Distinct values per rank (K) such that the sum over all ranks stays exactly representable.

    Rank r holds ``r*K + (i mod K) + 1``; the largest possible sum over ranks is
    ``K * n(n+1)/2``, so ``K = floor(limit / (n(n+1)/2))``. 0 means the dtype cannot hold an
    exact n-rank sum of rank-distinct values (e.g. bf16 with 23+ ranks).
    """
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    return EXACT_LIMIT[dtype] // (world_size * (world_size + 1) // 2)


def broadcast_source(world_size: int) -> int:
    """The broadcast root: the last rank, so an implementation that ignores ``src`` (and
    sends rank 0's data) is caught — with root 0 that bug would pass."""
    return world_size - 1


def buffer_sizes(op: str, world_size: int, elements: int) -> tuple[int, int]:
    """(input numel, output numel) per rank. ``elements`` is the per-rank chunk size.

    all_reduce/broadcast work in place on ``elements``; all_gather turns ``elements`` into
    ``world_size*elements``; reduce_scatter the reverse; all_to_all sends one chunk of
    ``elements`` to each rank.
    """
    n = world_size * elements
    sizes = {"all_reduce": (elements, elements), "broadcast": (elements, elements),
             "all_gather": (elements, n), "reduce_scatter": (n, elements), "all_to_all": (n, n)}
    if op not in sizes:
        raise ValueError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
    return sizes[op]


def _pattern(rank: int, start: int, count: int, scale: int) -> torch.Tensor:
    """Elements ``[start, start+count)`` of rank ``rank``'s input, int64 on the CPU:
    ``rank*K + (i mod K) + 1`` (all >= 1, distinct per rank)."""
    import torch

    return rank * scale + torch.arange(start, start + count, dtype=torch.int64) % scale + 1


def _scale_or_raise(dtype: str, world_size: int) -> int:
    scale = value_scale(dtype, world_size)
    if scale < 1:
        raise ValueError(f"{dtype} cannot hold an exact {world_size}-rank sum of rank-distinct integers")
    return scale


def build_input(op: str, world_size: int, rank: int, elements: int, dtype: str) -> torch.Tensor:
    """Rank ``rank``'s input tensor for ``op`` (CPU; the caller moves it to the device)."""
    numel, _ = buffer_sizes(op, world_size, elements)
    return _pattern(rank, 0, numel, _scale_or_raise(dtype, world_size)).to(torch_dtype(dtype))


def expected_output(op: str, world_size: int, rank: int, elements: int, dtype: str) -> torch.Tensor:
    """Exactly what rank ``rank`` must hold after ``op`` (CPU), computed in int64 from the
    definition of the op — never by calling a collective.

    Only the slices of the other ranks' inputs that reach this rank are generated, so the
    memory is that of the output (all-to-all on 8 ranks would otherwise build 8 full inputs).
    """
    import torch

    buffer_sizes(op, world_size, elements)  # refuses unknown names
    scale = _scale_or_raise(dtype, world_size)
    ranks = range(world_size)
    mine = rank * elements  # where this rank's chunk starts in a world_size*elements buffer
    if op == "all_reduce":
        out = torch.zeros(elements, dtype=torch.int64)
        for r in ranks:
            out += _pattern(r, 0, elements, scale)
    elif op == "broadcast":
        out = _pattern(broadcast_source(world_size), 0, elements, scale)
    elif op == "all_gather":  # chunk r of the output is rank r's input
        out = torch.cat([_pattern(r, 0, elements, scale) for r in ranks])
    elif op == "reduce_scatter":  # the sum over ranks of chunk `rank` of their inputs
        out = torch.zeros(elements, dtype=torch.int64)
        for r in ranks:
            out += _pattern(r, mine, elements, scale)
    else:  # all_to_all: chunk r of the output is chunk `rank` of rank r's input
        out = torch.cat([_pattern(r, mine, elements, scale) for r in ranks])
    return out.to(torch_dtype(dtype))


def output_buffer(op: str, world_size: int, elements: int, dtype: str, device: Any = "cpu") -> torch.Tensor:
    """A fresh output buffer filled with :data:`SENTINEL`."""
    import torch

    _, numel = buffer_sizes(op, world_size, elements)
    return torch.full((numel,), SENTINEL, dtype=torch_dtype(dtype), device=device)


def compare(got: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """Exact comparison: mismatch count, first wrong index and the values there.

    NaN never equals anything, so a NaN counts as wrong. A size or dtype difference is a
    mismatch of every element (reported, not raised: a collective that returns the wrong
    shape is a wrong result).
    """
    import torch

    if got.shape != expected.shape or got.dtype != expected.dtype:
        return {"mismatches": int(expected.numel()), "first_index": 0,
                "got": f"{tuple(got.shape)} {got.dtype}", "expected": f"{tuple(expected.shape)} {expected.dtype}"}
    wrong = (got.detach().cpu() != expected).reshape(-1)
    count = int(wrong.sum())
    if count == 0:
        return {"mismatches": 0, "first_index": None, "got": None, "expected": None}
    first = int(torch.nonzero(wrong)[0, 0])
    return {"mismatches": count, "first_index": first, "got": got.reshape(-1)[first].item(),
            "expected": expected.reshape(-1)[first].item()}


_UNSUPPORTED_RE = re.compile(r"not (yet )?(supported|implemented)|does not support|doesn't support|unsupported",
                             re.IGNORECASE)


def classify_exception(exc: BaseException) -> Literal["unsupported", "raised"]:
    """``unsupported`` when the library says it lacks the op/dtype, else ``raised``."""
    if isinstance(exc, NotImplementedError) or _UNSUPPORTED_RE.search(str(exc)):
        return "unsupported"
    return "raised"


# --- params -------------------------------------------------------------------------------

class CollectivesParams(BaseModel):
    """Which collectives to check, with how many ranks, sizes and dtypes."""

    model_config = ConfigDict(extra="forbid")

    ops: list[str] = Field(
        default_factory=lambda: list(OPS),
        description=f"Collectives to check, in this order; any of {', '.join(OPS)}.")
    world_size: int | None = Field(
        default=None, ge=2, le=1024,
        description="Ranks (one process per device). None: the backend's device count on an accelerator "
                    "(one device → not applicable), 2 on a non-accelerator backend (CPU: 2 gloo ranks on loopback).")
    elements: list[int] = Field(
        default_factory=lambda: [1, 1031, 1_048_583],
        description="Per-rank chunk sizes in elements, each run for every op and dtype: size 1, an odd small "
                    "size and an odd ~1M size, since libraries switch algorithms/protocols by message size. "
                    "all_gather/reduce_scatter/all_to_all move world_size × this.")
    dtypes: list[DtypeName] = Field(
        default_factory=lambda: list(DEFAULT_DTYPES),
        description="Dtypes, each with integer values small enough for exact sums (fp32 < 2^24, bf16 < 2^8 …). "
                    "bf16/fp16 run only where the backend declares them; an integer dtype the library lacks "
                    "is reported as unsupported.")
    on_unsupported: Literal["fail", "report"] | None = Field(
        default=None,
        description="What an op/dtype the library reports as unsupported costs: 'fail', or 'report' (listed, "
                    "check passes on the rest). None: 'fail' on accelerator backends, 'report' otherwise.")
    timeout_s: float = Field(
        default=90, gt=0, le=24 * 3600,
        description="Deadline for the whole multi-process run (start-up, rendezvous, every op); ranks still "
                    "running then are killed and the check is an error naming the rank and op (the process "
                    "group's own timeout is set 60 s later, as a backstop). Keep it below the ladder's time "
                    "limit for the check (default 120 s), or the runner kills the check first, with less evidence.")
    crash_grace_s: float = Field(
        default=5, ge=0, le=600,
        description="After one rank dies, how long the others get to finish or fail on their own before "
                    "they are killed (a peer's death usually leaves them blocked in a collective).")
    impl: str | None = Field(
        default=None, pattern=r"^[\w.]+:[\w.]+$",
        description="For tests and vendor overrides only: 'module:object' replacing the torch.distributed "
                    "implementation of the ops (a subclass of TorchCollectives, or a factory returning one).")

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, value: list[str]) -> list[str]:
        unknown = [op for op in value if op not in OPS]
        if unknown:
            raise ValueError(f"unknown collective(s) {', '.join(map(repr, unknown))}; valid: {', '.join(OPS)}")
        if not value:
            raise ValueError(f"at least one collective is needed; valid: {', '.join(OPS)}")
        if len(set(value)) != len(value):
            raise ValueError("each collective may appear once")
        return value

    @field_validator("elements")
    @classmethod
    def _sizes(cls, value: list[int]) -> list[int]:
        if not value or any(n < 1 or n > 1 << 28 for n in value):
            raise ValueError("elements: one or more sizes between 1 and 2^28")
        return value

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, value: list[str]) -> list[str]:
        if not value or len(set(value)) != len(value):
            raise ValueError("dtypes: one or more distinct dtype names")
        return value


# --- launcher -----------------------------------------------------------------------------

WORKER_MODULE = "adaptcheck.steps.framework.collectives_worker"


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

    records: dict[int, list[dict[str, Any]]]
    exits: list[RankExit]
    wall_s: float
    logs_dir: str
    timeout_s: float | None = None
    attempts: int = 1
    notes: list[str] = field(default_factory=list)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now (the OS picks; a race with another process is retried by
    :func:`launch` when rank 0 reports the address in use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


def import_root(module_name: str) -> str | None:
    """The sys.path entry a module was imported from, so the ranks (fresh interpreters, maybe
    another cwd) can import it too. Importing here also fails early with a clear error."""
    module = importlib.import_module(module_name)
    origin = getattr(module, "__file__", None)
    if not origin:
        return None
    path = Path(origin).resolve().parent
    depth = module_name.count(".")
    if Path(origin).name == "__init__.py":
        depth += 1
    for _ in range(depth):
        path = path.parent
    return str(path)


def load_object(ref: str) -> Any:
    """``'module:attr.attr'`` → the object."""
    module_name, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def class_ref(obj: type) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


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


def read_records(path: Path) -> list[dict[str, Any]]:
    """A rank's JSON-lines records; a torn last line (rank killed mid-write) is dropped."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the rank's whole process group (it leads its own session, so helper processes
    a collective library may fork go too), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


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


def launch(config: dict[str, Any], world_size: int, *, timeout_s: float, crash_grace_s: float,
           logs_dir: Path, extra_pythonpath: list[str] | None = None, attempts: int = 2) -> LaunchResult:
    """Run ``world_size`` ranks of the collectives worker and collect their records.

    ``config`` is passed to every rank as JSON (the rank adds its RANK from the
    environment). Ranks rendezvous through ``env://`` on 127.0.0.1 and a free port. The
    launcher never leaves a rank running: on the deadline, after a peer's death plus
    ``crash_grace_s``, or if the launcher itself is interrupted, every rank's process group
    is SIGKILLed; ranks also ask the kernel to kill them if the launcher dies
    (PR_SET_PDEATHSIG), which covers the launcher being SIGKILLed by the ladder runner.
    PR_SET_PDEATHSIG follows the *thread* that started the rank: call this from a thread that
    outlives the run (the worker's main thread does).
    """
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
        if not lost_port or any(r.get("event") == "op" for rs in result.records.values() for r in rs):
            break
        notes.append(f"attempt {attempt}: rendezvous port was taken by another process, retried")
    assert result is not None
    result.wall_s, result.timeout_s = time.monotonic() - start, timeout_s
    return result


def _launch_once(config: dict[str, Any], world_size: int, *, timeout_s: float, crash_grace_s: float,
                 logs_dir: Path, extra_pythonpath: list[str]) -> LaunchResult:
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
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
            rank_config = dict(config, results=str(logs_dir / f"rank{rank}.jsonl"))
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", WORKER_MODULE, json.dumps(rank_config)],
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
                        _kill_group(p)
                break
            time.sleep(0.02)
    finally:
        # Whatever happened above (KeyboardInterrupt included), no rank outlives the launcher.
        for i, p in enumerate(procs):
            if p.poll() is None:
                killed.setdefault(i, "launcher interrupted")
                _kill_group(p)
    exits = []
    for i, p in enumerate(procs):
        lines = _log_lines(logs[i])
        exits.append(RankExit(rank=i, returncode=p.returncode, killed=killed.get(i), last_line=last_line(lines),
                              stuck_at=stuck_frame(lines) if i in killed else "",
                              ended_s=ended.get(i), log=str(logs[i])))
    records = {i: read_records(logs_dir / f"rank{i}.jsonl") for i in range(world_size)}
    return LaunchResult(records=records, exits=exits, wall_s=time.monotonic() - began, logs_dir=str(logs_dir))


# --- verdict ------------------------------------------------------------------------------

def _signal_text(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _where(records: list[dict[str, Any]]) -> str:
    """What a rank was doing when it stopped: the op begun but not finished, or its phase."""
    begun = None
    for rec in records:
        if rec.get("event") == "begin":
            begun = rec
        elif rec.get("event") == "op" and begun is not None and rec.get("key") == begun.get("key"):
            begun = None
    if begun is not None:
        return f"in {begun['op']} ({begun['dtype']}, {begun['elements']} elements)"
    events = [r.get("event") for r in records]
    if "done" in events:
        return "after finishing"
    if "ready" in events:
        return "between ops"
    if "start" in events:
        return "during rendezvous"
    return "before start-up finished"


@dataclass
class Plan:
    """What the check asked the ranks to run (and what it left out, with why)."""

    ops: list[str]
    dtypes: list[str]
    elements: list[int]
    world_size: int
    library: str
    dist_backend: str
    on_unsupported: str
    skipped_dtypes: dict[str, str] = field(default_factory=dict)


def merge_rows(plan: Plan, records: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (op, dtype, elements) with each rank's result folded in.

    Row status: ``mismatch`` (some rank got a wrong element: conclusive whatever else
    happened) > ``incomplete`` (some rank never reported it — it died or hung there, and what
    its peers raised, e.g. "connection closed by peer", is a consequence, kept as evidence) >
    ``raised`` > ``unsupported`` > ``ok`` (every rank matched).
    """
    by_key: dict[str, dict[int, dict[str, Any]]] = {}
    for rank, recs in records.items():
        for rec in recs:
            if rec.get("event") == "op":
                by_key.setdefault(rec["key"], {})[rank] = rec
    rows: list[dict[str, Any]] = []
    for op in plan.ops:
        for dtype in plan.dtypes:
            for n in plan.elements:
                key = f"{op}/{dtype}/{n}"
                got = by_key.get(key, {})
                statuses = {r: rec.get("status") for r, rec in got.items()}
                row: dict[str, Any] = {"op": op, "dtype": dtype, "elements": n,
                                       "bytes_per_rank": n * ITEMSIZE[dtype]}
                if any(s == "mismatch" for s in statuses.values()):
                    row["status"] = "mismatch"
                elif len(got) < plan.world_size:
                    row["status"] = "incomplete"
                elif any(s == "raised" for s in statuses.values()):
                    row["status"] = "raised"
                elif any(s == "unsupported" for s in statuses.values()):
                    row["status"] = "unsupported"
                elif all(s == "ok" for s in statuses.values()):
                    row["status"] = "ok"
                else:  # a status this version does not know: never count it as a pass
                    row["status"] = "incomplete"
                times = [rec["time_s"] for rec in got.values() if isinstance(rec.get("time_s"), (int, float))]
                row["time_s"] = max(times) if times else None  # a collective is as slow as its slowest rank
                bad = {r: {k: rec.get(k) for k in ("mismatches", "first_index", "got", "expected", "error")
                           if rec.get(k) is not None}
                       for r, rec in sorted(got.items()) if rec.get("status") != "ok"}
                if bad:
                    row["ranks"] = bad
                missing = [r for r in range(plan.world_size) if r not in got]
                if missing and row["status"] != "ok":
                    row["missing_ranks"] = missing
                rows.append(row)
    return rows


def summarize(plan: Plan, launched: LaunchResult) -> Outcome:
    """The verdict (see the module docstring's status policy)."""
    rows = merge_rows(plan, launched.records)
    ws = plan.world_size
    metrics: dict[str, Any] = {"world_size": ws, "library": plan.library, "wall_s": round(launched.wall_s, 3)}
    for op in plan.ops:
        times = [r["time_s"] for r in rows if r["op"] == op and r["time_s"] is not None]
        if times:
            metrics[f"{op}_s"] = round(sum(times), 6)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("ok", "mismatch", "raised", "unsupported",
                                                                      "incomplete")}
    metrics.update({f"rows_{k}": v for k, v in counts.items()})
    inits = [r.get("init_s") for rs in launched.records.values() for r in rs if r.get("event") == "ready"]
    if inits:
        metrics["rendezvous_s"] = round(max(i for i in inits if isinstance(i, (int, float))), 3)
    ranks = []
    for e in launched.exits:
        recs = launched.records.get(e.rank, [])
        start = next((r for r in recs if r.get("event") == "start"), {})
        ranks.append({"rank": e.rank, "device": start.get("device"), "pid": start.get("pid"),
                      "exit": _signal_text(e.returncode), "killed": e.killed, "last_line": e.last_line,
                      "stuck_at": e.stuck_at or None, "ended_s": e.ended_s, "log": e.log})
    apis = next((r.get("apis") for rs in launched.records.values() for r in rs if r.get("event") == "ready"), None)
    details: dict[str, Any] = {
        "table": rows, "ranks": ranks, "dist_backend": plan.dist_backend, "library": plan.library,
        "on_unsupported": plan.on_unsupported, "broadcast_src": broadcast_source(ws),
        "torch_apis": apis, "logs_dir": launched.logs_dir,
        "values": "rank r holds r*K + (i mod K) + 1, K chosen per dtype so sums stay exactly representable; "
                  "outputs start as -1; comparison is exact",
    }
    if plan.skipped_dtypes:
        details["skipped_dtypes"] = plan.skipped_dtypes
    if launched.notes:
        details["notes"] = launched.notes

    def label(r: dict[str, Any]) -> str:
        return f"{r['op']} ({r['dtype']}, {r['elements']} elements)"

    mismatched = [r for r in rows if r["status"] == "mismatch"]
    raised = [r for r in rows if r["status"] == "raised"]
    unsupported = [r for r in rows if r["status"] == "unsupported"]
    troubled = [e for e in launched.exits if e.returncode != 0 or e.killed]
    problems: list[str] = []
    for r in mismatched[:3]:
        bad = {k: v for k, v in r.get("ranks", {}).items() if v.get("mismatches")}
        rank, info = next(iter(bad.items()))
        problems.append(f"{label(r)} wrong on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}: "
                        f"{info['mismatches']} of {buffer_sizes(r['op'], ws, r['elements'])[1]} elements differ, "
                        f"first at [{info['first_index']}] = {info['got']} (expected {info['expected']}) "
                        f"on rank {rank}")
    for r in raised[:3]:
        rank, info = next(iter(r.get("ranks", {}).items()))
        problems.append(f"{label(r)} raised on rank {rank}: {info.get('error', '?')}")
    unsupported_ops = sorted({f"{r['op']}/{r['dtype']}" for r in unsupported})
    if unsupported and plan.on_unsupported == "fail":
        problems.append(f"not supported by {plan.library}: {', '.join(unsupported_ops)}")
    note_unsupported = (f"; not supported by {plan.library} (reported, not failed): {', '.join(unsupported_ops)}"
                        if unsupported and plan.on_unsupported == "report" else "")

    crash = ""
    if troubled:
        # The rank that died first by itself is the cause; the ones killed afterwards (or that
        # died of losing a peer) were waiting on it — so they come later in the message.
        troubled.sort(key=lambda e: (e.killed is not None, e.ended_s if e.ended_s is not None else 1e18, e.rank))
        parts = []
        for e in troubled[:3]:
            where = _where(launched.records.get(e.rank, []))
            if e.killed == "timeout":
                limit = launched.timeout_s if launched.timeout_s is not None else launched.wall_s
                what = f"rank {e.rank} hung {where}: killed at the {limit:g} s deadline"
            elif e.killed:
                what = f"rank {e.rank} killed {where} ({e.killed})"
            else:
                what = f"rank {e.rank} {_signal_text(e.returncode)} {where}"
            if e.stuck_at:
                what += f", stuck at {e.stuck_at}"
            parts.append(what + (f"; last line: {e.last_line}" if e.last_line and not e.stuck_at else ""))
        crash = "; ".join(parts)

    if problems:
        return Outcome.failed("; ".join(problems) + (f"; also {crash}" if crash else ""), metrics=metrics,
                              details=details)
    if crash:
        return Outcome.errored(crash, metrics=metrics, details=details)
    ran = [r for r in rows if r["status"] == "ok"]
    incomplete = [r for r in rows if r["status"] == "incomplete"]
    if incomplete:  # every rank exited 0 but some row has no record: the worker is broken
        return Outcome.errored(f"{len(incomplete)} op runs were never reported, first {label(incomplete[0])}",
                               metrics=metrics, details=details)
    if not ran:
        return Outcome.skipped(f"no collective ran: every op was unsupported by {plan.library}"
                               f" ({', '.join(unsupported_ops)})", metrics=metrics, details=details)
    ops_ok = [op for op in plan.ops if any(r["op"] == op for r in ran)]
    skipped = f"; dtypes not checked: {', '.join(f'{d} ({why})' for d, why in plan.skipped_dtypes.items())}" \
        if plan.skipped_dtypes else ""
    return Outcome.passed(
        f"{', '.join(ops_ok)} exact on {ws} {plan.library} ranks ({len(ran)} op runs: "
        f"{', '.join(plan.dtypes)} × {len(plan.elements)} sizes){note_unsupported}{skipped}",
        metrics=metrics, details=details)


# --- the check ----------------------------------------------------------------------------

def resolve_world_size(backend: Backend, device_count: int, requested: int | None) -> tuple[int | None, str]:
    """(world size, reason if none). One device on an accelerator → None (not applicable)."""
    if not backend.is_accelerator:
        return (requested or 2), ""
    if requested is None:
        if device_count < 2:
            return None, (f"collectives need more than one device; {device_count} {backend.display_name} "
                          "device visible")
        return device_count, ""
    if requested > device_count:
        return None, f"world_size {requested} asks for more devices than the {device_count} visible"
    return requested, ""


def make_plan(backend: Backend, params: CollectivesParams, world_size: int) -> Plan:
    """What to run: the dtypes that can be checked exactly here, and why others are left out."""
    dtypes: list[str] = []
    skipped: dict[str, str] = {}
    for d in params.dtypes:
        if d in ("fp16", "bf16", "int8") and d not in backend.dtypes:
            # The backend's own declaration (held to it by step 2) decides; int32/int64 are
            # not in that vocabulary and are left to the library to accept or refuse.
            skipped[d] = f"{backend.name} does not declare {d}"
        elif value_scale(d, world_size) < 1:
            skipped[d] = f"cannot hold an exact {world_size}-rank sum"
        else:
            dtypes.append(d)
    return Plan(ops=list(params.ops), dtypes=dtypes, elements=list(params.elements), world_size=world_size,
                library=backend.collective_library, dist_backend=backend.dist_backend,
                on_unsupported=params.on_unsupported or ("fail" if backend.is_accelerator else "report"),
                skipped_dtypes=skipped)


class CollectivesCheck(Check):
    """all-reduce, all-gather, reduce-scatter, all-to-all and broadcast return exact results on every rank."""

    kind = "framework.collectives"
    step = 4
    description = ("Collectives through torch.distributed and the backend's collective library, one process per "
                   "device, give exact results on every rank.")
    params_model = CollectivesParams

    def run(self, ctx: CheckContext, params: CollectivesParams) -> Outcome:
        backend = ctx.backend
        ws, why = resolve_world_size(backend, ctx.device_count, params.world_size)
        if ws is None:
            single = params.world_size is None
            return Outcome.skipped(why, applicable=not single,
                                   details={"device_count": ctx.device_count, "library": backend.collective_library})
        plan = make_plan(backend, params, ws)
        if not plan.dtypes:
            return Outcome.skipped("no dtype can be checked exactly: " + "; ".join(
                f"{d}: {why}" for d, why in plan.skipped_dtypes.items()), details={"skipped_dtypes": plan.skipped_dtypes})
        # Importing the override and the backend class here fails early, in this process, with
        # a clear error; their sys.path roots go to the ranks so fresh interpreters find them.
        roots: list[str] = []
        backend_ref = class_ref(type(backend))
        for ref in ([params.impl] if params.impl else []) + [backend_ref]:
            try:
                load_object(ref)
                root = import_root(ref.partition(":")[0])
            except (ImportError, AttributeError) as exc:
                return Outcome.errored(f"cannot load {ref}: {type(exc).__name__}: {exc}")
            if root:
                roots.append(root)
        config = {"backend": backend.name, "backend_class": backend_ref, "ops": plan.ops, "dtypes": plan.dtypes,
                  "elements": plan.elements, "impl": params.impl, "timeout_s": params.timeout_s}
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        logs_dir = Path(tempfile.mkdtemp(prefix="collectives-", dir=ctx.run_dir))
        launched = launch(config, ws, timeout_s=params.timeout_s, crash_grace_s=params.crash_grace_s,
                          logs_dir=logs_dir, extra_pythonpath=roots)
        outcome = summarize(plan, launched)
        if params.impl:
            outcome.details["impl"] = params.impl
        return outcome
