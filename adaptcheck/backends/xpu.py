"""The Intel XPU backend (torch.xpu, oneAPI / SYCL, XCCL, ``xpu-smi``).

Responsible for declaring what an Intel GPU machine offers (Data Center GPU Max / Flex,
Arc), probing whether this torch build reaches an XPU (and saying precisely why not),
turning ``xpu-smi discovery`` output into :class:`DeviceInfo` rows, and reporting the
torch XPU, oneAPI and IPEX versions. Since torch 2.4 the XPU device is built into torch;
intel_extension_for_pytorch (IPEX) is optional and only imported when torch lacks it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from adaptcheck.backends.base import Backend, ProbeResult, module_version, run_tool
from adaptcheck.base.schemas.environment import DeviceInfo

IPEX_MODULE = "intel_extension_for_pytorch"
DEFAULT_ONEAPI_ROOT = "/opt/intel/oneapi"

# Labels of the ``xpu-smi discovery -d N`` text table, mapped to the JSON keys of
# ``xpu-smi discovery -d N -j`` so that both outputs go through one conversion.
_TABLE_KEYS = {
    "Device Type": "device_type", "Device Name": "device_name", "Vendor Name": "vendor_name",
    "UUID": "uuid", "Serial Number": "serial_number", "Core Clock Rate": "core_clock_rate",
    "Stepping": "device_stepping", "Driver Version": "driver_version",
    "Firmware Name": "gfx_firmware_name", "Firmware Version": "gfx_firmware_version",
    "GFX Firmware Version": "gfx_firmware_version", "PCI BDF Address": "pci_bdf_address",
    "PCI Device ID": "pci_device_id", "Memory Physical Size": "memory_physical_size",
    "ECC State": "memory_ecc_state", "Number of EUs": "number_of_eus",
    "Number of Tiles": "number_of_tiles", "Function Type": "device_function_type",
    "PCIe Generation": "pcie_generation", "PCIe Max Link Width": "pcie_max_link_width",
}

# xpu-smi prints these where it could not read a value; they are not versions.
_UNKNOWN = {"", "unknown", "n/a", "na"}


def _known(value: Any) -> str | None:
    text = str(value).strip() if value is not None else ""
    return None if text.lower() in _UNKNOWN else text


def _mib_from_bytes(value: Any) -> float | None:
    """xpu-smi prints byte counts as JSON strings on some builds and as numbers on others."""
    try:
        return int(str(value).strip()) / 2**20
    except (TypeError, ValueError):
        return None


def _mib_from_text(value: Any) -> float | None:
    """'32768.00 MiB' (table and older JSON) → 32768.0."""
    match = re.match(r"\s*([\d.]+)\s*(MiB|GiB)?", str(value or ""))
    if not match:
        return None
    number = float(match.group(1))
    return number * 1024 if match.group(2) == "GiB" else number


def _device_from_record(record: Mapping[str, object], position: int) -> DeviceInfo | None:
    """One DeviceInfo from a discovery record (list entry or ``-d N`` detail); None for VFs."""
    if str(record.get("device_function_type", "physical")).lower() == "virtual":
        return None  # SR-IOV virtual functions duplicate the physical card's memory
    total = _mib_from_bytes(record.get("memory_physical_size_byte"))
    if total is None:
        total = _mib_from_text(record.get("memory_physical_size"))
    free = _mib_from_bytes(record.get("memory_free_size_byte"))
    used = total - free if total is not None and free is not None else None
    extra = {key: record[key] for key in (
        "device_type", "pci_device_id", "drm_device", "device_stepping", "kernel_version",
        "memory_ecc_state", "number_of_tiles", "number_of_eus", "sku_type", "gfx_firmware_status",
        "pcie_generation", "pcie_max_link_width", "device_function_type") if _known(record.get(key))}
    index = record.get("device_id", position)
    return DeviceInfo(
        index=int(str(index).strip()) if str(index).strip().isdigit() else position,
        name=_known(record.get("device_name")) or "Intel GPU",
        vendor="Intel",
        memory_total_mib=total, memory_used_mib=used,
        driver_version=_known(record.get("driver_version")),
        firmware_version=_known(record.get("gfx_firmware_version")),
        bus_id=_known(record.get("pci_bdf_address")),
        uuid=_known(record.get("uuid")) or _known(record.get("serial_number")),
        extra=extra,
    )


def _records_from_table(text: str) -> list[dict[str, object]]:
    """``| 0 | Device Name: … |`` tables of ``xpu-smi discovery [-d N]`` as JSON-like records."""
    records: list[dict[str, object]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("|"):
            continue
        cells = [c.strip() for c in stripped.strip("|").split("|")]
        if len(cells) < 2 or cells[0] == "Device ID":
            continue
        if cells[0].isdigit():
            records.append({"device_id": int(cells[0])})
        if records and ":" in cells[1]:
            label, _, value = cells[1].partition(":")
            key = _TABLE_KEYS.get(label.strip())
            if key:
                records[-1].setdefault(key, value.strip())
    return records


def parse_xpu_smi_discovery(text: str) -> list[DeviceInfo]:
    """Parse ``xpu-smi discovery`` output into DeviceInfo rows.

    Accepts ``discovery -j`` (``{"device_list": [...]}``), ``discovery -d N -j`` (one
    device object), and the human tables of ``discovery`` / ``discovery -d N``. The list
    form carries names, bus ids and UUIDs; memory, driver and firmware only come with the
    per-device detail, which :meth:`XpuBackend.inventory` merges in.
    """
    stripped = text.strip()
    if not stripped:
        return []
    if stripped.startswith("{"):
        data = json.loads(stripped)
        if not isinstance(data, dict):
            raise ValueError("xpu-smi JSON is not an object")
        records = data.get("device_list")
        if records is None:
            records = [data] if "device_id" in data or "device_name" in data else []
        if not isinstance(records, list):
            raise ValueError("xpu-smi 'device_list' is not a list")
    else:
        records = _records_from_table(stripped)
    devices = [_device_from_record(r, i) for i, r in enumerate(records) if isinstance(r, dict)]
    return [d for d in devices if d is not None]


def merge_detail(base: DeviceInfo, detail: DeviceInfo) -> DeviceInfo:
    """The list row completed by the per-device detail (detail wins only where base is empty)."""
    data = base.model_dump()
    for key, value in detail.model_dump().items():
        if key == "extra":
            data["extra"] = {**value, **data["extra"]}
        elif data.get(key) in (None, "", "Intel GPU") and value is not None:
            data[key] = value
    return DeviceInfo(**data)


def oneapi_version_from_path(resolved: str) -> str | None:
    """oneAPI release from the resolved ``compiler/latest`` link, e.g. '.../compiler/2025.0' → '2025.0'."""
    match = re.search(r"/(\d{4}\.\d+(?:\.\d+)*)/?$", resolved)
    return match.group(1) if match else None


class XpuBackend(Backend):
    """Intel GPUs through torch.xpu (SYCL / Level Zero)."""

    name = "xpu"
    display_name = "Intel XPU"
    vendor = "Intel"
    device_type = "xpu"
    torch_module = "xpu"
    # torch >= 2.4 ships the XPU device itself; IPEX is only needed with older torch.
    extension_module = None
    dist_backend = "xccl"
    # XCCL is torch's process-group name; the library underneath is Intel oneCCL.
    collective_library = "oneccl"
    smi_tool = "xpu-smi"
    extension_distributions: ClassVar[dict[str, str]] = {"intel_extension_for_pytorch": "intel-extension-for-pytorch"}
    env_prefixes = ("ZE_", "ONEAPI_", "SYCL_", "CCL_")
    smi_command = ("xpu-smi", "discovery", "-j")
    # Max (PVC), Flex and Arc have fp16/bf16 XMX and int8 DPAS; none has fp8 hardware,
    # so fp8 is not claimed (the smoke dtype probe would otherwise "pass" an emulation).
    dtypes = ("fp32", "fp16", "bf16", "int8")
    fp8_flavour = None
    has_streams = True
    runtime_names = ("xpu", "oneapi")

    def _probe(self) -> ProbeResult:
        try:
            import torch
        except ImportError as exc:
            return ProbeResult.no(f"torch is not importable: {exc}")
        built_with_xpu = getattr(getattr(torch, "version", None), "xpu", None)
        if (not hasattr(torch, "xpu") or not built_with_xpu) and importlib.util.find_spec(IPEX_MODULE):
            # Older stacks get torch.xpu from IPEX; a broken IPEX is a reason, not a crash.
            try:
                importlib.import_module(IPEX_MODULE)
            except Exception as exc:  # noqa: BLE001
                return ProbeResult.no(f"{IPEX_MODULE} is installed but failed to import: {type(exc).__name__}: {exc}")
        xpu = getattr(torch, "xpu", None)
        if xpu is None or not hasattr(xpu, "is_available"):
            return ProbeResult.no(f"torch {torch.__version__} has no torch.xpu (needs torch >= 2.4 built for XPU, "
                                  f"or {IPEX_MODULE})")
        if not xpu.is_available():
            if not getattr(torch.version, "xpu", None) and not importlib.util.find_spec(IPEX_MODULE):
                return ProbeResult.no(f"torch {torch.__version__} is not built with XPU support (torch.version.xpu "
                                      "is None; install torch from the XPU wheel index)")
            return ProbeResult.no("torch.xpu.is_available() is False: no Level Zero GPU visible (check the GPU "
                                  "driver, 'xpu-smi discovery', render-group permissions and ZE_AFFINITY_MASK)")
        count = int(xpu.device_count())
        if count < 1:
            return ProbeResult.no("torch.xpu.device_count() is 0")
        return ProbeResult(True, "", count)

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_xpu_smi_discovery(text)

    def inventory(self) -> tuple[list[DeviceInfo], str]:
        """``xpu-smi discovery -j`` for the list, then ``discovery -d N -j`` per device for
        memory, driver and firmware (the list alone has none of them)."""
        out = run_tool(self.smi_command, self.tool_timeout_s)
        if not out.ok:
            return self._torch_inventory(), f"{out.error}; from torch"
        try:
            devices = self.parse_smi(out.stdout)
        except Exception as exc:  # noqa: BLE001 - unknown output must not crash capture
            return self._torch_inventory(), (f"xpu-smi output not understood: {type(exc).__name__}: {exc}; "
                                             "from torch")
        if not devices:
            return self._torch_inventory(), "xpu-smi reported no devices; from torch"
        notes: list[str] = []
        merged: list[DeviceInfo] = []
        for device in devices:
            detail_out = run_tool(["xpu-smi", "discovery", "-d", str(device.index), "-j"], self.tool_timeout_s)
            details: list[DeviceInfo] = []
            if not detail_out.ok:
                notes.append(f"no detail for device {device.index} ({detail_out.error})")
            else:
                try:
                    details = self.parse_smi(detail_out.stdout)
                except Exception as exc:  # noqa: BLE001 - keep the list row, say why it is thin
                    notes.append(f"detail of device {device.index} not understood ({type(exc).__name__}: {exc})")
            merged.append(merge_detail(device, details[0]) if details else device)
        note = "from xpu-smi discovery -j and discovery -d N -j"
        return merged, note + ("; " + "; ".join(notes) if notes else "")

    def runtime_versions(self) -> dict[str, str | None]:
        """torch's XPU (SYCL) runtime, the oneAPI release found on disk, and IPEX."""
        out: dict[str, str | None] = {"xpu": None, "oneapi": None, "ipex": module_version(IPEX_MODULE)}
        try:
            import torch

            out["xpu"] = getattr(torch.version, "xpu", None)
        except Exception:  # noqa: BLE001 - versions are best effort
            pass
        try:
            root = os.environ.get("ONEAPI_ROOT") or DEFAULT_ONEAPI_ROOT
            latest = Path(root) / "compiler" / "latest"
            if latest.exists():
                out["oneapi"] = oneapi_version_from_path(str(latest.resolve()))
        except Exception:  # noqa: BLE001
            pass
        return out
