"""The NVIDIA CUDA backend: what an NVIDIA machine offers, whether the installed torch is a
genuine NVIDIA CUDA build, ``nvidia-smi -q -x`` parsing and the runtime versions; also the
helpers every ``torch.cuda``-based backend shares (build identification, the API probe).

How the builds are told apart: docs/backends.md (Built-in backends).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from adaptcheck.backends.base import Backend, ProbeResult, run_tool
from adaptcheck.base.schemas.environment import DeviceInfo

"""Limit for one vendor-tool call. A module attribute so tests can shorten it."""

# Where a MetaX MACA install leaves evidence. Module-level so tests can point them elsewhere.
MACA_DIRS: tuple[str, ...] = ("/opt/maca",)
MACA_ENV_VARS: tuple[str, ...] = ("MACA_PATH",)

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


# --------------------------------------------------------------------------------------------
# small shared helpers
# --------------------------------------------------------------------------------------------
def leading_number(text: str | None) -> float | None:
    """First number in a vendor value such as '81920 MiB', '67.03 W', '27 C', '59.0C'.

    Vendor tools write 'N/A', '[N/A]', 'Not Supported' or 'Requested functionality has been
    deprecated' where a value is missing; all of those give None rather than a bogus zero.
    """
    if text is None:
        return None
    match = _NUMBER.search(str(text))
    return float(match.group()) if match else None


def clean_text(text: str | None) -> str | None:
    """Stripped text, or None for the vendors' spellings of 'missing'."""
    if text is None:
        return None
    value = str(text).strip()
    if not value or value.upper() in {"N/A", "[N/A]", "NA", "NONE", "NOT SUPPORTED", "UNKNOWN"}:
        return None
    return value


def torch_or_reason() -> tuple[Any | None, str]:
    """Import torch; on failure return (None, reason)."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch install is a reason, not a crash
        return None, f"torch is not importable: {type(exc).__name__}: {exc}"
    return torch, ""


def torch_build_label(torch: Any) -> str:
    """'torch 2.13.0+cpu' — quoted in probe reasons so the user sees which build was looked at."""
    return f"torch {getattr(torch, '__version__', '?')}"


def torch_version_tag(torch: Any) -> str:
    """Local version part of torch.__version__ ('cpu', 'cu128', 'metax3.3.0.2', 'das.opt1.dtk2504'…)."""
    version = str(getattr(torch, "__version__", ""))
    return version.partition("+")[2].lower()


def metax_torch_tag(torch: Any) -> str | None:
    """The MACA tag of a MetaX torch build, or None.

    MetaX ships torch wheels whose local version names the MACA release they were built for,
    e.g. ``2.8.0+metax3.3.0.2`` or ``2.10.0+metax3.8.1.0``; older images used ``maca`` in the
    tag. Such a build reports ``torch.version.cuda`` (it aliases the CUDA API), so this tag is
    what tells it apart from an NVIDIA build.
    """
    tag = torch_version_tag(torch)
    return tag if ("metax" in tag or "maca" in tag) else None


def maca_install_evidence() -> list[str]:
    """Signs of a MetaX MACA software install on this host (environment variable, install dir)."""
    found: list[str] = []
    for var in MACA_ENV_VARS:
        value = os.environ.get(var)
        if value:
            found.append(f"{var}={value}")
    for path in MACA_DIRS:
        if Path(path).is_dir():
            found.append(f"{path} exists")
    return found


def cuda_api_probe(torch: Any, build: str) -> ProbeResult:
    """Common tail of every torch.cuda-based probe: is a device actually usable?"""
    api = getattr(torch, "cuda", None)
    if api is None or not hasattr(api, "is_available"):
        return ProbeResult.no(f"{build} has no torch.cuda device API")
    try:
        available = bool(api.is_available())
    except Exception as exc:  # noqa: BLE001 - a driver fault surfaces here on fresh hardware
        return ProbeResult.no(f"{build}: torch.cuda.is_available() raised {type(exc).__name__}: {exc}")
    if not available:
        return ProbeResult.no(f"{build}: torch.cuda.is_available() is False (no device visible, or the driver "
                              "is not loaded / does not match)")
    try:
        count = int(api.device_count())
    except Exception as exc:  # noqa: BLE001
        return ProbeResult.no(f"{build}: torch.cuda.device_count() raised {type(exc).__name__}: {exc}")
    if count < 1:
        return ProbeResult.no(f"{build}: torch.cuda.device_count() is 0")
    return ProbeResult(True, "", count)


def read_first_line(paths: list[Path]) -> str | None:
    """First non-empty line of the first readable file (version files)."""
    for path in paths:
        try:
            for line in path.read_text(errors="replace").splitlines():
                if line.strip():
                    return line.strip()
        except OSError:
            continue
    return None


def nccl_version(torch: Any) -> str | None:
    """Version of the collective library behind ``torch.cuda.nccl`` ("2.21.5"), None if unknown.

    That is NCCL on CUDA builds, RCCL on ROCm/DTK builds and MCCL on MACA builds. Reading it
    does not initialise a device; any failure counts as unknown (versions are best effort).
    """
    try:
        return ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - versions are best effort
        return None


# --------------------------------------------------------------------------------------------
# nvidia-smi -q -x
# --------------------------------------------------------------------------------------------
def _find_text(elem: ET.Element | None, path: str) -> str | None:
    if elem is None:
        return None
    found = elem.find(path)
    return clean_text(found.text) if found is not None else None


def _find_number(elem: ET.Element | None, *paths: str) -> float | None:
    """First numeric value among several paths (the schema moved fields between driver releases)."""
    for path in paths:
        value = leading_number(_find_text(elem, path))
        if value is not None:
            return value
    return None


def _find_int(elem: ET.Element | None, path: str) -> int | None:
    value = leading_number(_find_text(elem, path))
    return int(value) if value is not None else None


class MigDevice(TypedDict):
    """One MIG slice of a GPU as ``nvidia-smi -q -x`` lists it (None where it reports N/A)."""

    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory_total_mib: float | None
    memory_used_mib: float | None


def _mig_devices(gpu: ET.Element) -> list[MigDevice]:
    rows: list[MigDevice] = []
    for mig in gpu.findall("mig_devices/mig_device"):
        rows.append({
            "index": _find_int(mig, "index"),
            "gpu_instance_id": _find_int(mig, "gpu_instance_id"),
            "compute_instance_id": _find_int(mig, "compute_instance_id"),
            "multiprocessor_count": _find_int(mig, "device_attributes/shared/multiprocessor_count"),
            "memory_total_mib": leading_number(_find_text(mig, "fb_memory_usage/total")),
            "memory_used_mib": leading_number(_find_text(mig, "fb_memory_usage/used")),
        })
    return rows


def _ecc_counts(gpu: ET.Element) -> dict[str, float | None]:
    """ECC errors since the driver loaded (``volatile``), SRAM + DRAM, in the R515+ layout
    (``ecc_errors/volatile/{sram,dram}_{correctable,uncorrectable}``); None where the GPU
    reports N/A (ECC off, consumer parts) or the driver uses the older single/double-bit layout."""
    out: dict[str, float | None] = {}
    for kind in ("correctable", "uncorrectable"):
        parts = [_find_number(gpu, f"ecc_errors/volatile/{mem}_{kind}") for mem in ("sram", "dram")]
        out[f"ecc_volatile_{kind}"] = sum(p for p in parts if p is not None) if any(p is not None for p in parts) \
            else None
    return out


def parse_nvidia_smi_xml_header(text: str) -> dict[str, str | None]:
    """Top-level facts of ``nvidia-smi -q -x``: driver version, the driver's CUDA version, GPU count."""
    root = ET.fromstring(text.strip())
    return {
        "driver_version": _find_text(root, "driver_version"),
        "cuda_version": _find_text(root, "cuda_version"),
        "attached_gpus": _find_text(root, "attached_gpus"),
    }


def parse_nvidia_smi_xml(text: str) -> list[DeviceInfo]:
    """``nvidia-smi -q -x`` → one DeviceInfo per physical GPU.

    * 'N/A' values stay None; numbers are read from their unit-suffixed text.
    * Power moved from ``power_readings/power_draw`` (≤ R525) to
      ``gpu_power_readings/power_draw`` (R535) and ``…/instant_power_draw`` (R570+): try all.
    * MIG instances are kept under ``extra['mig_devices']`` of their parent GPU: the parent is
      the unit of inventory and certification, the slices are how it is currently cut.
    Raises ``xml.etree.ElementTree.ParseError`` or ValueError on output that is not an
    ``nvidia_smi_log`` document; ``inventory()`` turns that into a note.
    """
    root = ET.fromstring(text.strip())
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"expected <nvidia_smi_log>, got <{root.tag}>")
    driver = _find_text(root, "driver_version")
    cuda_version = _find_text(root, "cuda_version")
    rows: list[DeviceInfo] = []
    for position, gpu in enumerate(root.findall("gpu")):
        extra: dict[str, str | float | list[MigDevice] | None] = {
            "architecture": _find_text(gpu, "product_architecture"),
            "brand": _find_text(gpu, "product_brand"),
            "serial": _find_text(gpu, "serial"),
            "minor_number": _find_int(gpu, "minor_number"),
            "cuda_version_of_driver": cuda_version,
            "gsp_firmware_version": _find_text(gpu, "gsp_firmware_version"),
            "inforom_image_version": _find_text(gpu, "inforom_version/img_version"),
            "persistence_mode": _find_text(gpu, "persistence_mode"),
            "compute_mode": _find_text(gpu, "compute_mode"),
            "performance_state": _find_text(gpu, "performance_state"),
            "ecc_mode": _find_text(gpu, "ecc_mode/current_ecc"),
            "memory_temperature_c": _find_number(gpu, "temperature/memory_temp"),
            "power_limit_w": _find_number(gpu, "gpu_power_readings/current_power_limit",
                                          "power_readings/power_limit", "power_readings/enforced_power_limit"),
            "mig_mode": _find_text(gpu, "mig_mode/current_mig"),
            "pcie_link_gen": _find_number(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
            "pcie_link_width": _find_number(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width"),
            "graphics_clock_mhz": _find_number(gpu, "clocks/graphics_clock"),
            "sm_clock_mhz": _find_number(gpu, "clocks/sm_clock"),
            "memory_clock_mhz": _find_number(gpu, "clocks/mem_clock"),
            **_ecc_counts(gpu),
        }
        migs = _mig_devices(gpu)
        if migs:
            extra["mig_devices"] = migs
        rows.append(DeviceInfo(
            # nvidia-smi numbers GPUs by PCI order, which is also the document order.
            index=position,
            name=_find_text(gpu, "product_name") or "NVIDIA GPU",
            vendor=CudaBackend.vendor,
            memory_total_mib=_find_number(gpu, "fb_memory_usage/total"),
            memory_used_mib=_find_number(gpu, "fb_memory_usage/used"),
            driver_version=driver,
            firmware_version=_find_text(gpu, "vbios_version"),
            bus_id=clean_text(gpu.get("id")) or _find_text(gpu, "pci/pci_bus_id"),
            uuid=_find_text(gpu, "uuid"),
            temperature_c=_find_number(gpu, "temperature/gpu_temp"),
            power_w=_find_number(gpu, "gpu_power_readings/power_draw", "gpu_power_readings/instant_power_draw",
                                 "gpu_power_readings/average_power_draw", "power_readings/power_draw"),
            utilization_pct=_find_number(gpu, "utilization/gpu_util"),
            extra={k: v for k, v in extra.items() if v is not None},
        ))
    return rows


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------
class CudaBackend(Backend):
    """NVIDIA GPUs through the CUDA build of PyTorch."""

    name = "cuda"
    display_name = "NVIDIA CUDA"
    vendor = "NVIDIA"
    device_type = "cuda"
    torch_module = "cuda"
    dist_backend = "nccl"
    collective_library = "nccl"
    smi_tool = "nvidia-smi"
    env_prefixes: ClassVar[tuple[str, ...]] = ("CUDA_", "NVIDIA_", "NCCL_")
    smi_command: ClassVar[tuple[str, ...]] = ("nvidia-smi", "-q", "-x")
    # fp8 needs sm_89+ (Ada/Hopper/Blackwell); the dtype smoke probe holds older parts to it.
    dtypes: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")
    fp8_flavour: ClassVar[str | None] = "e4m3fn"  # NVIDIA implements the OCP FP8 formats (torch.float8_e4m3fn)
    has_streams = True
    runtime_names: ClassVar[tuple[str, ...]] = ("cuda", "cudnn", "nccl", "nvidia_driver", "cuda_driver")
    telemetry_extra: ClassVar[tuple[str, ...]] = ("graphics_clock_mhz", "sm_clock_mhz", "memory_clock_mhz",
                                                  "memory_temperature_c", "ecc_volatile_correctable",
                                                  "ecc_volatile_uncorrectable")

    # --- probe -------------------------------------------------------------------------------
    def _probe(self) -> ProbeResult:
        torch, why = torch_or_reason()
        if torch is None:
            return ProbeResult.no(why)
        build = torch_build_label(torch)
        version = getattr(torch, "version", None)
        hip = getattr(version, "hip", None)
        if hip:
            return ProbeResult.no(f"{build} is a ROCm/HIP build (torch.version.hip={hip}), not NVIDIA CUDA")
        if not getattr(version, "cuda", None):
            return ProbeResult.no(f"{build} is not a CUDA build (torch.version.cuda is None)")
        tag = metax_torch_tag(torch)
        if tag:
            # MetaX builds alias the CUDA API and report torch.version.cuda; they are the
            # MetaX backend's to claim.
            return ProbeResult.no(f"{build} is a MetaX MACA build (+{tag}), not NVIDIA CUDA")
        return cuda_api_probe(torch, build)

    # --- vendor tool -------------------------------------------------------------------------
    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_nvidia_smi_xml(text)

    def build_archs(self) -> tuple[str | None, list[str]]:
        """``sm_<major><minor>`` of device 0 (torch reports it even when the build lacks it)
        and ``torch.cuda.get_arch_list()``."""
        api = self.torch_api()
        archs = [str(a) for a in api.get_arch_list()]
        if not self.probe().device_count:
            return None, archs
        major, minor = api.get_device_capability(0)
        return f"sm_{major}{minor}", archs

    def runtime_versions(self) -> dict[str, str | None]:
        versions: dict[str, str | None] = {name: None for name in self.runtime_names}
        torch, _ = torch_or_reason()
        if torch is not None and getattr(torch.version, "cuda", None) and not getattr(torch.version, "hip", None):
            versions["cuda"] = str(torch.version.cuda)
            try:
                cudnn = torch.backends.cudnn.version()
                versions["cudnn"] = str(cudnn) if cudnn else None
            except Exception:  # noqa: BLE001 - versions are best effort
                pass
            versions["nccl"] = nccl_version(torch)
        header = self._smi_header(parse_nvidia_smi_xml_header)
        versions["nvidia_driver"] = header.get("driver_version")
        versions["cuda_driver"] = header.get("cuda_version")
        return versions

    def _smi_header(self, parse: Callable[[str], Mapping[str, str | None]]) -> dict[str, str | None]:
        """``smi_command``'s output read by PARSE; empty when the tool fails or PARSE raises.

        The header facts (driver, runtime release) feed ``runtime_versions()``, which is best
        effort: a missing or misbehaving tool leaves those versions None.
        """
        out = run_tool(self.smi_command, timeout_s=self.tool_timeout_s)
        if not out.ok:
            return {}
        try:
            return dict(parse(out.stdout))
        except Exception:  # noqa: BLE001 - versions are best effort
            return {}
