"""The CPU's peak, derived from what the machine reports, with every step written down.

A CPU has no datasheet entry that fits every SKU, VM slice and affinity mask, so its peak
is computed from facts: usable cores (``sched_getaffinity`` ÷ threads per core), clock, and
the SIMD and matrix extensions in the ``flags`` line. The clock is the all-core vector clock
*measured* by :mod:`adaptcheck.perf.cpu_clock` (a timed dependent chain of 1-cycle vector
adds on every core at once); only where that cannot run (not x86-64, executable memory
refused …) does it fall back to ``cpuinfo_max_freq`` from cpufreq, else ``cpu MHz`` from
``/proc/cpuinfo``, with the reason in the derivation. ``cpu MHz`` is the base or TSC rate in
many VMs (2.6 GHz on an EPYC whose cores run at 3.6 GHz: efficiencies of 120-150 %), and
``cpuinfo_max_freq`` the single-core boost. The rules, per core and cycle (the AMD family
0x19 figures were checked on an EPYC 9004 guest with independent-accumulator throughput
loops: 1 vfmadd231ps zmm, 1 vdpbf16ps zmm and 1 vpdpbusd zmm per cycle):

* **Vector FMA rate** (fp32): lanes × FMA units × 2 FLOP per FMA. AVX-512 (``avx512f``): 16
  lanes; 2 FMA units assumed on Intel server parts (some Xeon Bronze/Silver and client
  parts have one: the peak is then 2× too high); AMD family 0x19 (Zen 4) executes a 512-bit
  FMA on two 256-bit pipes, i.e. one 512-bit FMA per cycle; family ≥ 0x1A (Zen 5) has two.
  AVX2 + FMA: 8 lanes × 2 units. Arm ``asimd``: 4 lanes × 2 units (Neoverse N1-class; wider
  cores are underestimated). Anything else: 4 lanes, a multiply and an add per cycle.
* **bf16**: AMX (``amx_bf16``) 1024 FLOP/cycle/core — Intel's figure for the TMUL unit of
  4th-gen Xeon ("1024 BF16 operations per cycle per core", Intel AMX overview and
  Sapphire Rapids launch material); else ``avx512_bf16`` (VDPBF16PS: a 2-element dot
  product per fp32 lane) 2 × the fp32 rate; else the fp32 rate (torch converts to fp32).
* **fp16**: ``amx_fp16`` 1024; ``avx512_fp16`` (32 native lanes) 2 × fp32; else the fp32
  rate (conversion through F16C, then fp32 arithmetic).
* **int8**: AMX (``amx_int8``) 2048 OP/cycle/core (same Intel source); ``avx512_vnni``
  (VPDPBUSD: 4 multiply-adds per 32-bit lane) 4 × the AVX-512 fp32 rate; ``avx_vnni`` 4 ×
  the 256-bit rate; else not derived (no int8 dot-product instruction).
* **fp8**: no x86 or Arm server core has fp8 arithmetic; not derived.

Memory bandwidth cannot be derived from ``/proc`` (channel count and DIMM speed are not
reported; in a VM they would not be this guest's share anyway). The caller passes a
reference — measured achievable copy bandwidth (labelled ``measured``) or a datasheet figure
from a peaks file (``spec``) — and the derivation says which.

All functions are pure over :class:`CpuFacts`; :func:`read_cpu_facts` is the only one that
reads the machine, so tests feed recorded ``/proc/cpuinfo`` text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from adaptcheck.base.hostfacts import parse_lscpu_like
from adaptcheck.perf.cpu_clock import (
    VectorClock,
    remeasure_vector_clock,
    vector_clock_cached,
)
from adaptcheck.perf.peaks import Peak, fmt_rate

AMX_BF16_FLOP_PER_CYCLE = 1024
AMX_INT8_OP_PER_CYCLE = 2048
AMX_SOURCE = ("Intel: 4th Gen Xeon Scalable AMX TMUL performs 2048 INT8 or 1024 BF16 operations per cycle per "
              "core (Intel AMX overview, https://www.intel.com/content/www/us/en/products/docs/accelerator-engines/"
              "advanced-matrix-extensions/overview.html)")
DERIVED_SOURCE = ("derived from /proc/cpuinfo, sched_getaffinity and the measured all-core vector clock "
                  "(see derivation)")


@dataclass(frozen=True)
class CpuFacts:
    """What the machine reports, as the derivation needs it."""

    model_name: str
    vendor_id: str
    family: int | None
    flags: frozenset[str]
    usable_logical: int
    """Logical CPUs this process may run on (sched_getaffinity)."""
    threads_per_core: int
    freq_ghz: float | None
    freq_source: str
    """'vector loop' (measured), 'cpuinfo_max_freq', 'cpu MHz' or 'unknown'."""
    reported_ghz: float | None = None
    """The clock the machine reports (cpufreq max, else 'cpu MHz'), beside a measured one."""
    reported_source: str = "unknown"
    vector_clock: VectorClock | None = None
    """The measurement (or why there is none); None: not attempted (recorded facts)."""

    @property
    def cores(self) -> int:
        return max(1, self.usable_logical // max(1, self.threads_per_core))


def parse_cpu_facts(cpuinfo: str, *, usable_logical: int, max_freq_khz: str | None = None,
                    vector_clock: VectorClock | None = None) -> CpuFacts:
    """Facts from ``/proc/cpuinfo`` text, the affinity count, cpufreq's ``cpuinfo_max_freq`` and
    the measured vector clock (which, when measured, is the clock the peak uses)."""
    fields = parse_lscpu_like(cpuinfo)
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    try:
        family: int | None = int(fields.get("cpu family", ""))
    except ValueError:
        family = None
    try:
        siblings, cores = int(fields.get("siblings", "")), int(fields.get("cpu cores", ""))
        threads = max(1, siblings // cores) if cores > 0 else 1
    except ValueError:
        threads = 1
    freq, source = None, "unknown"
    if max_freq_khz and max_freq_khz.strip().isdigit() and int(max_freq_khz) > 0:
        freq, source = int(max_freq_khz) / 1e6, "cpuinfo_max_freq"
    else:
        try:
            mhz = float(fields.get("cpu MHz", ""))
            if mhz > 0:
                freq, source = mhz / 1e3, "cpu MHz"
        except ValueError:
            pass
    reported, reported_source = freq, source
    if vector_clock is not None and vector_clock.ghz is not None:
        freq, source = vector_clock.ghz, "vector loop"
    return CpuFacts(model_name=fields.get("model name") or fields.get("CPU part") or "CPU",
                    vendor_id=fields.get("vendor_id") or fields.get("CPU implementer") or "unknown",
                    family=family, flags=flags, usable_logical=max(1, usable_logical), threads_per_core=threads,
                    freq_ghz=freq, freq_source=source, reported_ghz=reported, reported_source=reported_source,
                    vector_clock=vector_clock)


def read_cpu_facts(*, measure_clock: bool = True) -> CpuFacts:
    """This machine's facts; ``measure_clock``: with the all-core vector clock (measured once
    per process, ~0.5 s)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    try:
        maxf: str | None = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text().strip()
    except OSError:
        maxf = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    clock = None
    if measure_clock:
        flags = parse_cpu_facts(cpuinfo, usable_logical=usable).flags
        clock = vector_clock_cached(flags)
    return parse_cpu_facts(cpuinfo, usable_logical=usable, max_freq_khz=maxf, vector_clock=clock)


def remeasure_cpu_clock() -> bool:
    """Measure this machine's vector clock again (the best of all measurements is kept, and
    :func:`read_cpu_facts` returns it from now on). False when no clock can be measured here."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return remeasure_vector_clock(parse_cpu_facts(cpuinfo, usable_logical=usable).flags).measured


def vector_unit(facts: CpuFacts) -> tuple[int, int, int, str]:
    """(fp32 lanes, FMA units, FLOP per lane-op, description) of the widest vector unit."""
    f = facts.flags
    if "avx512f" in f:
        if facts.vendor_id == "AuthenticAMD" and facts.family is not None and facts.family < 0x1A:
            return 16, 1, 2, ("AVX-512 (avx512f) on AMD family 0x19 (Zen 4): 512-bit FMAs run on two 256-bit pipes "
                              "= 1 full-width FMA per cycle")
        return 16, 2, 2, "AVX-512 (avx512f): 2 FMA units assumed (server parts; some have 1)"
    if "avx2" in f and "fma" in f:
        return 8, 2, 2, "AVX2 + FMA: 2 FMA units"
    if "asimd" in f:
        return 4, 2, 2, "Arm NEON (asimd): 2 128-bit FMA pipes assumed" + (" (SVE present; its vector length is "
                                                                           "not reported, NEON width used)"
                                                                           if "sve" in f else "")
    return 4, 1, 2, "no FMA/AVX2 found: 4 lanes, one multiply and one add per cycle"


def _reported(ghz: float | None, source: str) -> str:
    if ghz is None:
        return "the machine reports no clock"
    return (f"cpufreq cpuinfo_max_freq says {ghz:.3f} GHz (the single-core boost)" if source == "cpuinfo_max_freq"
            else f"/proc/cpuinfo 'cpu MHz' says {ghz:.3f} GHz (no cpufreq here, as in many VMs: often the base "
                 "or TSC rate)")


def clock_line(facts: CpuFacts) -> str:
    """The derivation's clock line: measured (with what the machine reports beside it), or the
    reported clock with why nothing was measured."""
    assert facts.freq_ghz is not None
    vc = facts.vector_clock
    if facts.freq_source == "vector loop" and vc is not None:
        return (f"clock: {facts.freq_ghz:.3f} GHz all-core vector clock, {vc.describe()}; "
                f"{_reported(facts.reported_ghz, facts.reported_source)}")
    why = f"; {vc.describe()}" if vc is not None else "; vector clock not measured (recorded facts)"
    caveat = ("the single-core boost: all cores busy with vectors run lower, so these peaks are upper bounds"
              if facts.freq_source == "cpuinfo_max_freq"
              else "cpufreq is not exposed here, as in many VMs; this is often the base or TSC rate, below what "
                   "the cores run at, so efficiencies may exceed 100 %")
    where = "cpufreq cpuinfo_max_freq" if facts.freq_source == "cpuinfo_max_freq" else "/proc/cpuinfo 'cpu MHz'"
    return f"clock: {facts.freq_ghz:.3f} GHz from {where} ({caveat}){why}"


def _line(label: str, per_cycle: float, facts: CpuFacts, why: str) -> tuple[float, str]:
    assert facts.freq_ghz is not None
    rate = facts.cores * facts.freq_ghz * 1e9 * per_cycle
    op = "OP" if label == "int8" else "FLOP"  # integer multiply-adds are operations, not FLOPs
    return rate, (f"{label}: {why} = {per_cycle:g} {op}/cycle/core → {facts.cores} cores × {facts.freq_ghz:.3f} GHz "
                  f"× {per_cycle:g} = {fmt_rate(rate, op + '/s')}")


def derive_cpu_peak(facts: CpuFacts, *, memory_bw: float | None = None, memory_basis: str = "unknown",
                    memory_note: str = "") -> Peak:
    """The CPU peak with its derivation lines. ``flops`` is empty when the clock is unknown."""
    threads = f", {facts.threads_per_core} threads per core" if facts.threads_per_core > 1 else ""
    lines = [(f"CPU: {facts.model_name} ({facts.vendor_id}, family {facts.family}); {facts.cores} usable cores "
              f"({facts.usable_logical} logical CPUs in this process's affinity{threads})")]
    flops: dict[str, float] = {}
    if facts.freq_ghz is None:
        lines.append("clock: unknown (no cpufreq cpuinfo_max_freq, no 'cpu MHz' in /proc/cpuinfo): no FLOP/s peak "
                     "can be derived; add a cpu entry to a peaks_file")
    else:
        lines.append(clock_line(facts))
        f = facts.flags
        lanes, units, per_fma, desc = vector_unit(facts)
        fp32_cycle = lanes * units * per_fma
        flops["fp32"], text = _line("fp32", fp32_cycle, facts,
                                    f"{desc}; {lanes} fp32 lanes × {units} FMA units × {per_fma} FLOP per FMA")
        lines.append(text)
        if "amx_bf16" in f:
            flops["bf16"], text = _line("bf16", AMX_BF16_FLOP_PER_CYCLE, facts, "AMX (amx_bf16) TMUL, Intel's figure")
        elif "avx512_bf16" in f:
            flops["bf16"], text = _line("bf16", 2 * fp32_cycle, facts,
                                        "avx512_bf16 (VDPBF16PS: 2-element dot product per fp32 lane) 2 × fp32")
        else:
            flops["bf16"], text = _line("bf16", fp32_cycle, facts, "no bf16 arithmetic: converted, fp32 rate")
        lines.append(text)
        if "amx_fp16" in f:
            flops["fp16"], text = _line("fp16", AMX_BF16_FLOP_PER_CYCLE, facts, "AMX (amx_fp16) TMUL, as bf16")
        elif "avx512_fp16" in f:
            flops["fp16"], text = _line("fp16", 2 * fp32_cycle, facts, "avx512_fp16 (32 fp16 lanes) 2 × fp32")
        elif "asimdhp" in f:
            flops["fp16"], text = _line("fp16", 2 * fp32_cycle, facts, "Arm asimdhp (8 fp16 lanes) 2 × fp32")
        else:
            flops["fp16"], text = _line("fp16", fp32_cycle, facts, "no fp16 arithmetic: converted (F16C), fp32 rate")
        lines.append(text)
        if "amx_int8" in f:
            flops["int8"], text = _line("int8", AMX_INT8_OP_PER_CYCLE, facts, "AMX (amx_int8) TMUL, Intel's figure")
            lines.append(text)
        elif "avx512_vnni" in f and "avx512f" in f:
            flops["int8"], text = _line("int8", 4 * fp32_cycle, facts, "avx512_vnni (VPDPBUSD: 4 MACs per 32-bit "
                                                                       "lane) 4 × fp32")
            lines.append(text)
        elif "avx_vnni" in f:
            flops["int8"], text = _line("int8", 4 * 8 * 2 * 2, facts, "avx_vnni (256-bit VPDPBUSD) 4 × the AVX2 "
                                                                      "fp32 rate of 32")
            lines.append(text)
        else:
            lines.append("int8: no VNNI or AMX int8 instructions: not derived")
        lines.append("fp8: no fp8 arithmetic on CPUs: not derived")
        if "amx_bf16" in f or "amx_int8" in f:
            lines.append(f"AMX source: {AMX_SOURCE}")
    if memory_bw is None:
        lines.append("memory: no bandwidth can be derived from /proc (channel count and DIMM speed are not "
                     "reported); none given")
    else:
        lines.append(f"memory: {fmt_rate(memory_bw, 'B/s')} ({memory_basis}){': ' + memory_note if memory_note else ''}")
    return Peak(device=facts.model_name, entry="derived:cpu", source=DERIVED_SOURCE, verified=False,
                flops=flops, memory_bw=memory_bw, host_link_bw=None,
                # gloo ranks on one host exchange data by copies through loopback: the memory
                # reference is the ceiling their bus bandwidth is compared against.
                interconnect_bw=memory_bw, derivation=tuple(lines),
                memory_bw_basis=memory_basis if memory_bw is not None else "unknown")


def with_memory_reference(peak: Peak, memory_bw: float, basis: str, note: str) -> Peak:
    """``peak`` with a memory bandwidth filled in (only where it has none), its line replaced."""
    if peak.memory_bw is not None:
        return peak
    lines = [ln for ln in peak.derivation if not ln.startswith("memory:")]
    lines.append(f"memory: {fmt_rate(memory_bw, 'B/s')} ({basis}): {note}")
    return peak.replace(memory_bw=memory_bw, memory_bw_basis=basis,
                        interconnect_bw=peak.interconnect_bw or memory_bw, derivation=tuple(lines))
