"""The clock the CPU's vector units really run at with every usable core busy, measured by a
timed dependent loop of vector adds in machine code run in a child process (a fallback to the
reported clock, with why, where it cannot run): the clock of the derived CPU peak
(:mod:`adaptcheck.perf.cpu_peak`). Method, widths and fallbacks: docs/perf.md ("CPU clock:
measured, not read").
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

CHAIN = 64
"""Dependent adds per loop iteration: large enough that ``dec``/``jnz`` hide behind them."""

# The instructions, encoded by hand and checked against GNU as / objdump (tests/perf/test_cpu_clock.py):
ADD: dict[str, bytes] = {
    "zmm": bytes.fromhex("62f17d48fec1"),  # vpaddd zmm0, zmm0, zmm1   (EVEX.512.66.0F.W0 FE /r)
    "ymm": bytes.fromhex("c5fdfec1"),  # vpaddd ymm0, ymm0, ymm1       (VEX.256.66.0F.WIG FE /r)
    "xmm": bytes.fromhex("660ffec1"),  # paddd xmm0, xmm1              (SSE2: 66 0F FE /r)
}
DEC_RDI = bytes.fromhex("48ffcf")  # dec rdi
JNZ_REL32 = bytes.fromhex("0f85")  # jnz rel32 (the loop body is longer than a rel8 reaches)
VZEROUPPER = bytes.fromhex("c5f877")  # leaves no dirty upper state behind (SSE transition penalty)
RET = bytes.fromhex("c3")
FLAG_FOR = {"zmm": "avx512f", "ymm": "avx2", "xmm": "sse2"}
ZMM_LATENCY_RATIO = 0.6
"""zmm below this fraction of ymm: the zmm add has a 2-cycle latency here, not a lower clock."""


def loop_code(width: str, chain: int = CHAIN) -> bytes:
    """Machine code of ``void f(uint64 iters)`` (System V: iters in rdi, iters ≥ 1): ``chain``
    dependent adds of ``width`` per iteration."""
    body = ADD[width] * chain + DEC_RDI
    back = -(len(body) + len(JNZ_REL32) + 4)  # from the end of the jnz back to the loop start
    tail = (VZEROUPPER if width != "xmm" else b"") + RET  # vzeroupper is an AVX instruction
    return body + JNZ_REL32 + back.to_bytes(4, "little", signed=True) + tail


@dataclass(frozen=True)
class VectorClock:
    """The measured all-core vector clock, or why there is none."""

    ghz: float | None
    """All-core clock under vector load; None: not measured (see ``reason``)."""
    width: str = ""
    """The width whose figure is ``ghz`` (zmm, ymm, xmm)."""
    by_width: dict[str, float] = field(default_factory=dict)
    """Best all-core GHz per width measured."""
    threads: int = 0
    cpus: tuple[int, ...] = ()
    reps: int = 0
    chain: int = CHAIN
    iters: int = 0
    rep_ghz: dict[str, list[float]] = field(default_factory=dict)
    """Per width, the all-core (slowest-thread) figure of every repetition."""
    wall_s: float = 0.0
    measurements: int = 1
    """How many separate measurements ``ghz`` is the best of (see :func:`remeasure_vector_clock`)."""
    reason: str = ""
    """Why ``ghz`` is None (fallback), or a note on which width was chosen."""

    @property
    def measured(self) -> bool:
        return self.ghz is not None

    def describe(self) -> str:
        """One line for the peak's derivation."""
        if self.ghz is None:
            return f"vector loop not run: {self.reason}"
        reps = self.rep_ghz.get(self.width, [])
        spread = f"{min(reps):.3f}-{max(reps):.3f} GHz over {len(reps)} repetitions" if reps else ""
        others = ", ".join(f"{w} {g:.3f} GHz" for w, g in self.by_width.items() if w != self.width)
        name = {"zmm": "vpaddd zmm", "ymm": "vpaddd ymm", "xmm": "paddd xmm"}[self.width]
        return (f"measured: a dependent chain of {self.chain} {name} (1 cycle each) × {self.iters} iterations per "
                f"thread on {self.threads} cores at once (CPUs {','.join(map(str, self.cpus))}), cycles ÷ thread CPU "
                f"time, slowest thread per repetition, best repetition ({spread})"
                + (f"; also {others}" if others else "") + (f"; {self.reason}" if self.reason else ""))


_WIRE: TypeAdapter[VectorClock] = TypeAdapter(VectorClock)
"""The child process's answer: one JSON line, validated by the parent."""


def fallback(reason: str) -> VectorClock:
    return VectorClock(ghz=None, reason=reason)


# --- the machine code, mapped executable ---------------------------------------------------------

PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20


class ExecutableCode:
    """``code`` in an anonymous mapping made read+execute, callable as ``f(iters)``."""

    def __init__(self, code: bytes) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._mmap, self._munmap, mprotect = libc.mmap, libc.munmap, libc.mprotect
        self._mmap.restype = ctypes.c_void_p
        self._mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_long]
        self._munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.size = max(4096, (len(code) + 4095) // 4096 * 4096)
        addr = self._mmap(None, self.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {self.size} bytes refused: {os.strerror(err)}")
        self.addr: int = addr
        ctypes.memmove(addr, code, len(code))
        # Writable, then executable: never both (W^X policies such as SELinux execmem refuse that).
        if mprotect(addr, self.size, PROT_READ | PROT_EXEC) != 0:
            err = ctypes.get_errno()
            self.close()
            raise OSError(err, f"mprotect to read+execute refused: {os.strerror(err)}")
        # CFUNCTYPE (not PYFUNCTYPE): ctypes releases the GIL for the call, so threads run in parallel.
        self.fn = ctypes.CFUNCTYPE(None, ctypes.c_uint64)(addr)

    def close(self) -> None:
        if getattr(self, "addr", None):
            self._munmap(self.addr, self.size)
            self.addr = 0


# --- measuring (in the process that calls; the parent runs this in a child) ---------------------

def one_cpu_per_core(cpus: Sequence[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[int]:
    """The first logical CPU of each physical core among ``cpus`` (SMT siblings share a core's
    vector units: one thread per core measures the core's clock)."""
    seen: set[tuple[str, str]] = set()
    out: list[int] = []
    for cpu in sorted(cpus):
        topo = sysfs / f"cpu{cpu}" / "topology"
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            key = ("?", str(cpu))  # no topology: count every CPU as a core
        if key not in seen:
            seen.add(key)
            out.append(cpu)
    return out


def _run_threads(fn: Any, cpus: Sequence[int], iters: int) -> list[float]:
    """Run ``fn(iters)`` on every CPU at once; per thread, seconds of its CPU time."""
    barrier = threading.Barrier(len(cpus))
    took: list[float] = [math.inf] * len(cpus)

    def work(slot: int, cpu: int) -> None:
        try:
            os.sched_setaffinity(0, {cpu})  # 0 = this thread on Linux
        except (OSError, AttributeError):
            pass  # unpinned: the scheduler still spreads busy threads over idle cores
        barrier.wait()
        t0 = time.thread_time()
        fn(iters)
        took[slot] = time.thread_time() - t0

    threads = [threading.Thread(target=work, args=(i, c), daemon=True) for i, c in enumerate(cpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took


def measure_here(widths: Sequence[str], cpus: Sequence[int], *, reps: int = 7, rep_s: float = 0.02,
                 budget_s: float = 2.0) -> VectorClock:
    """Measure in this process (the child's body; tests call it directly): up to ``reps``
    repetitions of ~``rep_s`` CPU seconds per width, fewer (at least 3) once the loop has taken
    ``budget_s`` of wall time (pinned threads wait for their core on a busy host). The widths
    take turns repetition by repetition, so a disturbed moment touches each of them, not one
    width's whole series (which would skew :func:`choose_width`'s zmm/ymm ratio). Raises
    OSError when the code cannot be mapped executable."""
    began = time.perf_counter()
    rep_ghz: dict[str, list[float]] = {w: [] for w in widths}
    codes: dict[str, ExecutableCode] = {}
    iters: dict[str, int] = {}
    try:
        for width in widths:
            code = codes[width] = ExecutableCode(loop_code(width))
            # Calibrate on one thread: ~2 ms, then size a repetition to about rep_s.
            probe = 20_000
            t0 = time.thread_time()
            code.fn(probe)
            dt = max(time.thread_time() - t0, 1e-6)
            iters[width] = max(1000, int(probe * rep_s / dt))
            code.fn(iters[width] // 10)  # warm-up: wake the vector units (and any licence transition) first
        started = time.perf_counter()
        for rep in range(reps):
            if rep >= 3 and time.perf_counter() - started >= budget_s:
                break
            for width in widths:
                n = iters[width]
                rep_ghz[width].append(CHAIN * n / max(_run_threads(codes[width].fn, cpus, n)) / 1e9)
    finally:
        for code in codes.values():
            code.close()
    by_width = {w: max(r) for w, r in rep_ghz.items()}
    width, note = choose_width(by_width)
    return VectorClock(ghz=by_width[width], width=width, by_width=by_width, threads=len(cpus), cpus=tuple(cpus),
                       reps=len(rep_ghz[width]), iters=iters[width], rep_ghz=rep_ghz,
                       wall_s=time.perf_counter() - began, reason=note)


def choose_width(by_width: dict[str, float]) -> tuple[str, str]:
    """(width whose clock is used, note): zmm where measured — the width the GEMM kernels run
    at, its clock including any AVX-512 offset (taking the lower of the two would only bias
    the figure low by their noise) — unless zmm looks like a 2-cycle latency, not a clock."""
    if "zmm" in by_width and "ymm" in by_width:
        if by_width["zmm"] < ZMM_LATENCY_RATIO * by_width["ymm"]:
            return "ymm", (f"zmm gave {by_width['zmm']:.3f} GHz < {ZMM_LATENCY_RATIO} × ymm: a 2-cycle zmm add on "
                           "this core, not a clock; ymm used")
        return "zmm", ""
    return next(iter(by_width)), ""


def widths_for(flags: frozenset[str]) -> list[str]:
    """Widths to measure on a CPU with these ``/proc/cpuinfo`` flags (widest first)."""
    if "avx512f" in flags:
        return ["zmm", "ymm"]
    if "avx2" in flags:
        return ["ymm"]
    return ["xmm"]  # SSE2 is part of x86-64


def unsupported_reason(machine: str | None = None, system: str | None = None) -> str | None:
    """Why the loop cannot run on this platform, or None."""
    machine = (machine or platform.machine()).lower()
    system = system or platform.system()
    if machine not in ("x86_64", "amd64"):
        return f"the loop is x86-64 machine code and this machine is {machine}"
    if system != "Linux":
        return f"the loop maps memory with Linux's mmap/mprotect and this OS is {system}"
    return None


def child_command(widths: Sequence[str], cpus: Sequence[int]) -> list[str]:
    return [sys.executable, "-m", "adaptcheck.perf.cpu_clock", ",".join(widths), ",".join(map(str, cpus))]


def measure_vector_clock(flags: frozenset[str], cpus: Sequence[int] | None = None, *,
                         timeout_s: float = 30.0) -> VectorClock:
    """The all-core vector clock measured in a child process, or a fallback with the reason."""
    why = unsupported_reason()
    if why:
        return fallback(why)
    if cpus is None:
        cpus = one_cpu_per_core(sorted(os.sched_getaffinity(0)))
    widths = widths_for(flags)
    try:
        proc = subprocess.run(child_command(widths, cpus), capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return fallback(f"the vector loop did not finish within {timeout_s:g} s")
    except OSError as exc:
        return fallback(f"could not start the measuring process: {exc}")
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name if -proc.returncode in signal.valid_signals() else "?"
        return fallback(f"the vector loop ({'/'.join(widths)}) was killed by {sig}"
                        + (" (an instruction the kernel or hypervisor does not enable)" if sig == "SIGILL" else ""))
    try:
        data = _WIRE.validate_json(proc.stdout.strip().splitlines()[-1])
    except (ValidationError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return fallback(f"the measuring process exited {proc.returncode}: {tail[:200]}")
    if data.ghz is None:
        return fallback(data.reason or "no figure")
    return replace(data, measurements=1)


_BEST: dict[frozenset[str], VectorClock] = {}
"""Per flag set, the best clock this process has measured (see :func:`remeasure_vector_clock`)."""


def vector_clock_cached(flags: frozenset[str]) -> VectorClock:
    """:func:`measure_vector_clock` once per process (each worker measures once, ~0.5 s), or
    the best of every measurement since, once :func:`remeasure_vector_clock` has run."""
    if flags not in _BEST:
        _BEST[flags] = measure_vector_clock(flags)
    return _BEST[flags]


def remeasure_vector_clock(flags: frozenset[str]) -> VectorClock:
    """Measure again and keep, per width, the best of all measurements so far.

    The clock is a maximum estimator: a disturbance (a busy SMT sibling on the host, another
    guest's vector work) only ever makes a repetition slower, so a later, faster figure shows
    the earlier one was disturbed and supersedes it. Callers re-measure when a compute row
    ran above the peak the clock gave — the evidence that the clock came out low."""
    merged = merge_clocks(vector_clock_cached(flags), measure_vector_clock(flags))
    _BEST[flags] = merged
    return merged


def merge_clocks(a: VectorClock, b: VectorClock) -> VectorClock:
    """Per width the best figure of the two, repetitions pooled; a fallback yields to a measurement."""
    if not b.measured:
        return a
    if not a.measured:
        return b
    by_width = {w: max(a.by_width.get(w, 0.0), b.by_width.get(w, 0.0)) for w in {**a.by_width, **b.by_width}}
    rep_ghz = {w: [*a.rep_ghz.get(w, []), *b.rep_ghz.get(w, [])] for w in by_width}
    width, note = choose_width(by_width)
    measurements = a.measurements + b.measurements
    note = "; ".join(x for x in (note, f"best of {measurements} measurements in this process") if x)
    return replace(b, ghz=by_width[width], width=width, by_width=by_width, reps=len(rep_ghz[width]),
                   rep_ghz=rep_ghz, wall_s=a.wall_s + b.wall_s, reason=note, measurements=measurements)


def _child_main(argv: Sequence[str]) -> int:
    widths = [w for w in argv[0].split(",") if w]
    cpus = [int(c) for c in argv[1].split(",") if c]
    try:
        clock = measure_here(widths, cpus)
    except OSError as exc:
        clock = fallback(f"executable memory refused: {exc}")
    print(_WIRE.dump_json(clock).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
