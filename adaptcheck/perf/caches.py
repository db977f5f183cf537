"""The last-level cache a memory benchmark must outgrow, read from what the machine reports.

Responsibility: one figure, the total bytes of last-level cache (every instance counted
once), for sizing memory-bandwidth problems: a copy whose footprint fits in it measures the
cache, not DRAM (a 16 MiB copy ran at 147-261 % of the DRAM reference on EPYC guests).

* Host CPU: ``/sys/devices/system/cpu/cpu*/cache/index*/`` — the highest ``level`` of type
  Data or Unified; instances are told apart by ``shared_cpu_list`` (one L3 shared by 8
  cores is one instance, not eight). Sizes like ``32768K``.
* Accelerator: the device's L2 where torch reports it (``L2_cache_size`` of CUDA/ROCm device
  properties); else unknown.

Rules (:func:`residency`): a footprint (all buffers a call touches) of at least
``DRAM_FACTOR`` × the LLC is held to the DRAM peak; a smaller one is labelled
cache-resident (≤ the LLC) or partly cache-resident, and not held to it. Four times is
"well beyond": a streaming copy through an LRU-like cache misses once the footprint
exceeds it, and 4× leaves room for non-inclusive caches (AMD's L3 is a victim cache beside
private L2s), prefetchers and replacement policies that keep part of a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend

DRAM_FACTOR = 4
"""A footprint ≥ this × the LLC measures memory, not cache."""


@dataclass(frozen=True)
class LastLevelCache:
    """The last-level cache, as the sizing rules need it."""

    level: int
    total_bytes: int
    instances: int
    source: str

    def describe(self) -> str:
        each = self.total_bytes // max(1, self.instances)
        return (f"L{self.level} {self.total_bytes / (1 << 20):g} MiB"
                + (f" ({self.instances} × {each / (1 << 20):g} MiB)" if self.instances > 1 else "")
                + f" from {self.source}")


def parse_size(text: str) -> int | None:
    """'32768K' → 33554432; '1M', '512' (bytes) too; None when unreadable."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * mult if digits.isdigit() else None


def host_llc(sysfs: Path = Path("/sys/devices/system/cpu")) -> LastLevelCache | None:
    """The host's last-level cache from sysfs, or None where it is not reported."""
    found: dict[int, dict[str, int]] = {}  # level -> shared_cpu_list -> bytes
    try:
        cpus = sorted(sysfs.glob("cpu[0-9]*/cache/index[0-9]*"))
    except OSError:
        return None
    for index in cpus:
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text().strip())
            size = parse_size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind not in ("Data", "Unified") or size is None:
            continue
        found.setdefault(level, {})[shared] = size
    if not found:
        return None
    level = max(found)
    return LastLevelCache(level=level, total_bytes=sum(found[level].values()), instances=len(found[level]),
                          source=f"{sysfs}/cpu*/cache (shared_cpu_list tells instances apart)")


def device_llc(backend: Backend, index: int) -> LastLevelCache | None:
    """The last-level cache in front of ``backend``'s memory: the host's for the CPU, the
    device's L2 where torch reports it, else None."""
    if not backend.is_accelerator:
        return host_llc()
    try:
        props: Any = backend.torch_api().get_device_properties(index)
        size = int(getattr(props, "L2_cache_size", 0) or 0)
    except Exception:  # noqa: BLE001 - a device module without properties: unknown
        return None
    return LastLevelCache(level=2, total_bytes=size, instances=1, source="torch device properties L2_cache_size") \
        if size > 0 else None


def residency(footprint: float, llc: LastLevelCache | None) -> str | None:
    """None when ``footprint`` bytes are held to the DRAM peak; else 'cache-resident' or
    'partly cache-resident'. Unknown LLC: None (nothing to compare with; the row is held to
    the peak as before)."""
    if llc is None or footprint >= DRAM_FACTOR * llc.total_bytes:
        return None
    return "cache-resident" if footprint <= llc.total_bytes else "partly cache-resident"
