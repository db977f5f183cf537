"""The AMD ROCm backend: what an AMD machine offers, detection on the HIP build of torch,
amd-smi (both layouts) / rocm-smi parsing, and the HIP, ROCm and RCCL versions.

Details: docs/backends.md (Built-in backends).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from adaptcheck.backends.base import Backend, ProbeResult, run_tool
from adaptcheck.backends.cuda import (
    clean_text,
    cuda_api_probe,
    leading_number,
    nccl_version,
    read_first_line,
    torch_build_label,
    torch_or_reason,
)
from adaptcheck.base.schemas.environment import DeviceInfo

ROCM_DIRS: tuple[str, ...] = ("/opt/rocm",)
"""Default ROCm install roots (``$ROCM_PATH`` is consulted first). Module-level for tests."""

AMD_SMI_STATIC = ("amd-smi", "static", "--json")
AMD_SMI_METRIC = ("amd-smi", "metric", "--json")
ROCM_SMI_FALLBACK = ("rocm-smi", "--showproductname", "--showuse", "--showmeminfo", "vram", "--json")


def fp8_flavour_for_arch(gfx_arch: str | None) -> str | None:
    """fp8 e4m3 flavour a given AMD architecture computes in.

    gfx942 (MI300X/MI300A/MI325X) implements the FNUZ variants (no negative zero, bias 8:
    torch.float8_e4m3fnuz); gfx950 (MI350/MI355) and RDNA4 (gfx12xx) implement the OCP
    e4m3fn format like NVIDIA. Older parts (gfx90a, gfx908) have no fp8 at all.
    """
    if not gfx_arch:
        return None
    arch = gfx_arch.lower().split(":")[0]
    if arch.startswith("gfx94"):
        return "e4m3fnuz"
    if arch.startswith("gfx95") or arch.startswith("gfx12"):
        return "e4m3fn"
    return None


# --------------------------------------------------------------------------------------------
# amd-smi / rocm-smi parsing
# --------------------------------------------------------------------------------------------
def _amd_gpu_list(text: str) -> list[dict[str, object]]:
    """The per-GPU objects of an amd-smi JSON document, in either of its two layouts."""
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    if not isinstance(data, list):
        raise ValueError("amd-smi JSON is neither a list nor an object with 'gpu_data'")
    return [g for g in data if isinstance(g, dict)]


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _value(obj: Any) -> float | None:
    """A number from amd-smi's ``{"value": 65520, "unit": "MB"}`` shape or a bare value."""
    if isinstance(obj, dict):
        obj = obj.get("value")
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return float(obj)
    return leading_number(obj) if isinstance(obj, str) else None


def _int(obj: Any) -> int | None:
    value = _value(obj)
    return int(value) if value is not None else None


def _mib(obj: Any) -> float | None:
    """Memory in MiB from a ``{"value", "unit"}`` pair.

    amd-smi labels MiB quantities "MB": a 64 GiB MI210 reports ``65520 MB`` and a 192 GiB
    MI300X ``196592 MB``, both of which only make sense as MiB. So "MB" is taken as MiB.
    """
    value = _value(obj)
    if value is None:
        return None
    unit = str(obj.get("unit", "MB")).strip().upper() if isinstance(obj, dict) else "MB"
    scale = {"B": 1 / 2**20, "KB": 1 / 1024, "KIB": 1 / 1024, "MB": 1.0, "MIB": 1.0, "GB": 1024.0, "GIB": 1024.0}
    return value * scale.get(unit, 1.0)


def _text(obj: Any) -> str | None:
    return clean_text(obj) if isinstance(obj, str) else (str(obj) if isinstance(obj, (int, float)) else None)


def parse_amd_smi_static(text: str) -> list[DeviceInfo]:
    """``amd-smi static --json`` → DeviceInfo rows (name, VRAM, driver, VBIOS/IFWI, bus, serial)."""
    rows: list[DeviceInfo] = []
    for position, gpu in enumerate(_amd_gpu_list(text)):
        index = gpu.get("gpu")
        asic = gpu.get("asic") or {}
        # amd-smi ≥ 26 renamed the firmware image section "vbios" → "ifwi".
        firmware = gpu.get("ifwi") if isinstance(gpu.get("ifwi"), dict) else gpu.get("vbios") or {}
        gfx = _text(_get(asic, "target_graphics_version"))
        extra = {
            "target_graphics_version": gfx,
            "fp8_flavour": fp8_flavour_for_arch(gfx),
            "device_id": _text(_get(asic, "device_id")),
            "compute_units": _int(_get(asic, "num_compute_units")),
            "firmware_name": _text(_get(firmware, "name")),
            "firmware_part_number": _text(_get(firmware, "part_number")),
            "board_product_serial": _text(_get(gpu, "board", "product_serial")),
            "slot_type": _text(_get(gpu, "bus", "slot_type")),
            "pcie_interface": _text(_get(gpu, "bus", "pcie_interface_version")),
            "vram_type": _text(_get(gpu, "vram", "type")),
            "vram_vendor": _text(_get(gpu, "vram", "vendor")),
            "power_cap_w": _value(_get(gpu, "limit", "socket_power")) or _value(_get(gpu, "limit", "max_power")),
            "compute_partition": _text(_get(gpu, "partition", "compute_partition")),
            "memory_partition": _text(_get(gpu, "partition", "memory_partition")),
            "numa_node": _int(_get(gpu, "numa", "node")),
        }
        rows.append(DeviceInfo(
            index=int(index) if isinstance(index, int) else position,
            name=_text(_get(asic, "market_name")) or "AMD GPU",
            vendor=RocmBackend.vendor,
            memory_total_mib=_mib(_get(gpu, "vram", "size")),
            driver_version=_text(_get(gpu, "driver", "version")) or _text(_get(gpu, "driver", "driver_version")),
            firmware_version=_text(_get(firmware, "version")) or _text(_get(firmware, "name")),
            bus_id=_text(_get(gpu, "bus", "bdf")),
            uuid=_text(_get(asic, "asic_serial")),
            extra={k: v for k, v in extra.items() if v is not None},
        ))
    return rows


def parse_amd_smi_metric(text: str) -> dict[int, dict[str, float]]:
    """``amd-smi metric --json`` → {gpu index: {memory_used_mib, memory_total_mib, utilization_pct,
    temperature_c, power_w}} with only the values present."""
    samples: dict[int, dict[str, float]] = {}
    for position, gpu in enumerate(_amd_gpu_list(text)):
        gpu_id = gpu.get("gpu")
        index = gpu_id if isinstance(gpu_id, int) else position
        temperature = _get(gpu, "temperature") or {}
        sample = {
            "memory_used_mib": _mib(_get(gpu, "mem_usage", "used_vram")),
            "memory_total_mib": _mib(_get(gpu, "mem_usage", "total_vram")),
            "utilization_pct": _value(_get(gpu, "usage", "gfx_activity")),
            # The junction (hotspot) is what throttles; edge is the fallback on parts without it.
            "temperature_c": _value(_get(temperature, "hotspot")) or _value(_get(temperature, "edge")),
            "power_w": _value(_get(gpu, "power", "socket_power")) or _value(_get(gpu, "power", "average_socket_power")),
        }
        samples[int(index)] = {k: v for k, v in sample.items() if v is not None}
    return samples


def merge_metric(devices: list[DeviceInfo], metric: dict[int, dict[str, float]]) -> list[DeviceInfo]:
    """Fill live fields of static rows from a metric sample (static values win for totals)."""
    merged: list[DeviceInfo] = []
    for dev in devices:
        sample = metric.get(dev.index, {})
        update = {k: v for k, v in sample.items() if getattr(dev, k) is None}
        merged.append(dev.model_copy(update=update) if update else dev)
    return merged


def _first_key(card: Mapping[str, object], *names: str) -> Any:
    lowered = {k.lower(): v for k, v in card.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def parse_rocm_smi_json(text: str) -> list[DeviceInfo]:
    """``rocm-smi … --json`` → DeviceInfo rows. Keys differ in case between releases
    ('Card Series' / 'Card series'), so lookups ignore case; the 'system' block holds the driver."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("rocm-smi JSON is not an object keyed by card")
    driver = _text(_first_key(data.get("system") or {}, "Driver version"))
    rows: list[DeviceInfo] = []
    for key, card in data.items():
        if not (isinstance(card, dict) and key.lower().startswith("card")):
            continue
        index = int(leading_number(key) or len(rows))
        total_b = leading_number(_first_key(card, "VRAM Total Memory (B)"))
        used_b = leading_number(_first_key(card, "VRAM Total Used Memory (B)"))
        gfx = _text(_first_key(card, "GFX Version"))
        extra = {
            "target_graphics_version": gfx,
            "fp8_flavour": fp8_flavour_for_arch(gfx),
            "card_model": _text(_first_key(card, "Card Model", "Device ID")),
            "card_sku": _text(_first_key(card, "Card SKU")),
            "node_id": _text(_first_key(card, "Node ID")),
            "guid": _text(_first_key(card, "GUID")),
        }
        rows.append(DeviceInfo(
            index=index,
            name=_text(_first_key(card, "Card Series", "Device Name", "Card series")) or "AMD GPU",
            vendor=RocmBackend.vendor,
            memory_total_mib=total_b / 2**20 if total_b is not None else None,
            memory_used_mib=used_b / 2**20 if used_b is not None else None,
            driver_version=driver,
            firmware_version=_text(_first_key(card, "VBIOS version")),
            bus_id=_text(_first_key(card, "PCI Bus")),
            uuid=_text(_first_key(card, "Unique ID", "Serial Number")),
            temperature_c=leading_number(_first_key(card, "Temperature (Sensor junction) (C)",
                                                    "Temperature (Sensor edge) (C)")),
            power_w=leading_number(_first_key(card, "Average Graphics Package Power (W)",
                                              "Current Socket Graphics Package Power (W)")),
            utilization_pct=leading_number(_first_key(card, "GPU use (%)")),
            extra={k: v for k, v in extra.items() if v is not None},
        ))
    return rows


def rocm_roots() -> list[Path]:
    """``$ROCM_PATH`` first, then the default install roots."""
    roots = [Path(p) for p in (os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH")) if p]
    return roots + [Path(p) for p in ROCM_DIRS]


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------
class RocmBackend(Backend):
    """AMD GPUs through the ROCm (HIP) build of PyTorch."""

    name = "rocm"
    display_name = "AMD ROCm"
    vendor = "AMD"
    device_type = "cuda"  # ROCm torch exposes HIP devices as torch.device("cuda")
    torch_module = "cuda"
    dist_backend = "nccl"  # the "nccl" backend name is served by RCCL in ROCm builds
    collective_library = "rccl"
    smi_tool = "amd-smi"
    tools = ("rocm-smi",)
    env_prefixes: ClassVar[tuple[str, ...]] = ("HIP_", "ROCM_", "HSA_", "RCCL_")
    smi_command: ClassVar[tuple[str, ...]] = AMD_SMI_STATIC
    dtypes: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")
    # The class declares one flavour; MI300 (gfx942), the most deployed fp8-capable Instinct
    # part, computes FNUZ. gfx950/RDNA4 are OCP e4m3fn: inventory rows carry the per-device
    # flavour in extra["fp8_flavour"] (see fp8_flavour_for_arch), and the dtype smoke probe
    # tests what the device really does.
    fp8_flavour: ClassVar[str | None] = "e4m3fnuz"
    has_streams = True
    runtime_names: ClassVar[tuple[str, ...]] = ("hip", "rocm", "rccl")

    # --- probe -------------------------------------------------------------------------------
    def _hip_build(self) -> tuple[Any | None, str, str]:
        """(torch, build label, reason) — torch is None unless it is a HIP build."""
        torch, why = torch_or_reason()
        if torch is None:
            return None, "", why
        build = torch_build_label(torch)
        hip = getattr(getattr(torch, "version", None), "hip", None)
        if not hip:
            return None, build, f"{build} is not a ROCm/HIP build (torch.version.hip is None)"
        return torch, build, ""

    def _probe(self) -> ProbeResult:
        torch, build, why = self._hip_build()
        if torch is None:
            return ProbeResult.no(why)
        return cuda_api_probe(torch, build)

    # --- vendor tool -------------------------------------------------------------------------
    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_amd_smi_static(text)

    def inventory(self) -> tuple[list[DeviceInfo], str]:
        notes: list[str] = []
        out = run_tool(AMD_SMI_STATIC, timeout_s=self.tool_timeout_s)
        if out.ok:
            try:
                devices = self.parse_smi(out.stdout)
            except Exception as exc:  # noqa: BLE001 - unknown layouts must not stop capture
                devices = []
                notes.append(f"amd-smi static output not understood: {type(exc).__name__}: {exc}")
            if devices:
                source = "from amd-smi static --json"
                metric = run_tool(AMD_SMI_METRIC, timeout_s=self.tool_timeout_s)
                try:
                    if metric.ok:
                        devices = merge_metric(devices, parse_amd_smi_metric(metric.stdout))
                        source += " + amd-smi metric --json"
                    else:
                        source += f" (live values missing: {metric.error})"
                except Exception as exc:  # noqa: BLE001
                    source += f" (amd-smi metric output not understood: {type(exc).__name__})"
                return devices, source
            if not notes:
                notes.append("amd-smi reported no GPUs")
        else:
            notes.append(out.error)
        # rocm-smi is deprecated but is still the only tool on ROCm ≤ 6.0 hosts.
        old = run_tool(ROCM_SMI_FALLBACK, timeout_s=self.tool_timeout_s)
        if old.ok:
            try:
                devices = parse_rocm_smi_json(old.stdout)
                if devices:
                    return devices, "; ".join([*notes, f"from {' '.join(ROCM_SMI_FALLBACK)}"])
                notes.append("rocm-smi reported no GPUs")
            except Exception as exc:  # noqa: BLE001
                notes.append(f"rocm-smi output not understood: {type(exc).__name__}: {exc}")
        else:
            notes.append(old.error)
        return self._torch_inventory(), "; ".join([*notes, "from torch"])

    def build_archs(self) -> tuple[str | None, list[str]]:
        """Device 0's ``gcnArchName`` target (``gfx942``, feature suffixes dropped) and the
        HIP build's ``torch.cuda.get_arch_list()``."""
        api = self.torch_api()
        archs = [str(a) for a in api.get_arch_list()]
        if not self.probe().device_count:
            return None, archs
        name = str(getattr(api.get_device_properties(0), "gcnArchName", "") or "")
        return (name.split(":", 1)[0] or None), archs

    def runtime_versions(self) -> dict[str, str | None]:
        versions = self._hip_versions()
        versions["rocm"] = read_first_line([root / ".info" / "version" for root in rocm_roots()])
        return versions

    def _hip_versions(self) -> dict[str, str | None]:
        """Every name in ``runtime_names`` mapped to None, with 'hip' and 'rccl' filled in from
        torch when it is a HIP build; subclasses (Hygon DTK) add their own names on top."""
        versions: dict[str, str | None] = {name: None for name in self.runtime_names}
        torch, _ = torch_or_reason()
        if torch is not None and getattr(torch.version, "hip", None):
            versions["hip"] = str(torch.version.hip)
            versions["rccl"] = nccl_version(torch)
        return versions
