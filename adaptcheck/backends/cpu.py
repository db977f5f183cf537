"""The CPU backend: always available, exercised for real on the development machines."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from adaptcheck.backends.base import Backend, ProbeResult
from adaptcheck.base.hostfacts import parse_lscpu_like
from adaptcheck.base.schemas.environment import DeviceInfo

if TYPE_CHECKING:
    import torch


class CpuBackend(Backend):
    """Plain CPU through torch's CPU device."""

    name = "cpu"
    display_name = "CPU"
    vendor = "CPU"
    device_type = "cpu"
    torch_module = "cpu"
    dist_backend = "gloo"
    collective_library = "gloo"
    smi_tool = "lscpu"
    env_prefixes = ("OMP_", "MKL_", "KMP_")
    # torch's CPU build stores and casts both OCP fp8 formats (smoke.dtypes holds it to that).
    dtypes: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")
    fp8_flavour: ClassVar[str | None] = "e4m3fn"
    has_streams = False
    is_accelerator = False

    def _probe(self) -> ProbeResult:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            return ProbeResult.no(f"torch is not importable: {exc}")
        return ProbeResult(True, "", 1)

    def torch_device(self, index: int = 0) -> torch.device:
        import torch

        return torch.device("cpu")

    def device_name(self, index: int = 0) -> str:
        return self._cpu_fields().get("model name") or platform.processor() or "CPU"

    def synchronize(self, index: int = 0) -> None:
        """CPU work is synchronous."""

    def memory_stats(self, index: int = 0) -> dict[str, float]:
        info = _meminfo()
        out: dict[str, float] = {}
        if "MemTotal" in info:
            out["total"] = info["MemTotal"] * 1024.0
        if "MemAvailable" in info:
            out["free"] = info["MemAvailable"] * 1024.0
        return out

    def empty_cache(self) -> None:
        """Nothing to release: the CPU allocator returns memory itself."""

    @staticmethod
    def _cpu_fields() -> dict[str, str]:
        try:
            return parse_lscpu_like(Path("/proc/cpuinfo").read_text(errors="replace"))
        except OSError:
            return {}

    def inventory(self) -> tuple[list[DeviceInfo], str]:
        fields = self._cpu_fields()
        mem = _meminfo()
        flags = fields.get("flags", "").split()
        simd = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "avx2", "fma", "sve", "asimd")
                if f in flags]
        row = DeviceInfo(
            index=0,
            name=fields.get("model name") or platform.processor() or platform.machine(),
            vendor=fields.get("vendor_id", "CPU"),
            memory_total_mib=(mem["MemTotal"] / 1024.0) if "MemTotal" in mem else None,
            memory_used_mib=((mem["MemTotal"] - mem["MemAvailable"]) / 1024.0)
            if "MemTotal" in mem and "MemAvailable" in mem else None,
            extra={"logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0))
                   if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                   "simd": simd, "mhz": fields.get("cpu MHz")},
        )
        return [row], "from /proc/cpuinfo and /proc/meminfo"

    def runtime_versions(self) -> dict[str, str | None]:
        try:
            import torch

            return {"torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
        except Exception:  # noqa: BLE001
            return {}


def _meminfo() -> dict[str, float]:
    """/proc/meminfo in kB."""
    out: dict[str, float] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = float(parts[0])
    except (OSError, ValueError):
        pass
    return out
