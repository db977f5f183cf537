"""The Hygon DCU backend: HIP torch builds from Hygon's DTK told apart from AMD ROCm builds
(it supersedes the ROCm backend), ``hy-smi`` parsing, and the HIP, DTK, RCCL and driver versions.

The evidence that separates the builds: docs/backends.md (Built-in backends).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path
from typing import Any

from adaptcheck.backends.base import ProbeResult, run_tool
from adaptcheck.backends.cuda import (
    clean_text,
    cuda_api_probe,
    leading_number,
    read_first_line,
    torch_version_tag,
)
from adaptcheck.backends.rocm import RocmBackend
from adaptcheck.base.modules import module_present
from adaptcheck.base.schemas.environment import DeviceInfo

# Where a DTK install leaves evidence. Module-level so tests can point them elsewhere.
DTK_GLOBS: tuple[str, ...] = ("/opt/dtk", "/opt/dtk-*")
HYHAL_DIRS: tuple[str, ...] = ("/opt/hyhal",)
VLLM_PLUGIN_MODULE = "vllm_hcu"

_KV_LINE = re.compile(r"^\s*(?:HCU|DCU|GPU)\[(\d+)\]\s*:\s*([^:]+?)\s*:\s*(.*?)\s*$")
_DRIVER_LINE = re.compile(r"^\s*Driver Version\s*:\s*(\S+)", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# hy-smi parsing
# --------------------------------------------------------------------------------------------
def _table_rows(lines: list[str]) -> dict[int, dict[str, str]]:
    """Rows of the default status table, keyed by DCU index, as {column: cell}.

    Columns are taken from the header line rather than fixed positions: DTK 26.04 added
    'Dec%' and 'Enc%' between 'HCU%' and 'Mode', and older builds print fewer columns.
    """
    rows: dict[int, dict[str, str]] = {}
    header: list[str] | None = None
    for line in lines:
        cells = line.split()
        if not cells:
            continue
        if cells[0] in {"HCU", "DCU", "GPU"} and "Temp" in cells:
            header = cells
            continue
        if header and cells[0].isdigit() and len(cells) == len(header):
            rows[int(cells[0])] = dict(zip(header, cells, strict=False))
    return rows


def parse_hy_smi(text: str) -> list[DeviceInfo]:
    """``hy-smi`` output (the default table, ``HCU[i] : key: value`` lines, or both concatenated)
    → one DeviceInfo per DCU index seen. Raises ValueError when nothing recognisable is found."""
    lines = text.splitlines()
    table = _table_rows(lines)
    kv: dict[int, dict[str, str]] = {}
    driver: str | None = None
    for line in lines:
        match = _KV_LINE.match(line)
        if match:
            kv.setdefault(int(match.group(1)), {})[match.group(2).strip().lower()] = match.group(3).strip()
            continue
        drv = _DRIVER_LINE.match(line)
        if drv:
            driver = clean_text(drv.group(1))
    indices = sorted(set(table) | set(kv))
    if not indices:
        raise ValueError("no hy-smi status table and no HCU[i] lines found")
    rows: list[DeviceInfo] = []
    for index in indices:
        cells = table.get(index, {})
        keys = kv.get(index, {})
        total = leading_number(keys.get("vram total memory (mib)"))
        used = leading_number(keys.get("vram total used memory (mib)"))
        vram_pct = leading_number(cells.get("VRAM%"))
        if used is None and vram_pct is not None and total is not None:
            # The table only gives a percentage; with the total known it becomes MiB.
            used = round(total * vram_pct / 100.0, 1)
        util = leading_number(cells.get("HCU%") or cells.get("DCU%") or keys.get("hcu use (%)")
                              or keys.get("dcu use (%)") or keys.get("gpu use (%)"))
        extra = {
            "vram_used_pct": vram_pct,
            "power_cap_w": leading_number(cells.get("PwrCap")),
            "performance_level": clean_text(cells.get("Perf")),
            "mode": clean_text(cells.get("Mode")),
            "card_vendor": clean_text(keys.get("card vendor")),
            # hy-smi --showmemavailable: the memory a process can allocate, not the board total.
            "available_memory_mib": leading_number(keys.get("available memory size (mib)")),
            "serial": clean_text(keys.get("serial number")),
        }
        rows.append(DeviceInfo(
            index=index,
            name=clean_text(keys.get("card series")) or clean_text(keys.get("card model")) or "Hygon DCU",
            vendor=HygonBackend.vendor,
            memory_total_mib=total,
            memory_used_mib=used,
            driver_version=driver,
            firmware_version=clean_text(keys.get("vbios version")),
            bus_id=clean_text(keys.get("pci bus")),
            uuid=clean_text(keys.get("unique id")),
            temperature_c=leading_number(cells.get("Temp")) or leading_number(keys.get("temperature (sensor junction) (c)")),
            power_w=leading_number(cells.get("AvgPwr"))
            or leading_number(keys.get("average graphics package power (w)")),
            utilization_pct=util,
            extra={k: v for k, v in extra.items() if v is not None},
        ))
    return rows


def parse_hy_smi_driver(text: str) -> str | None:
    """'Driver Version: 6.3.x' from ``hy-smi --showdriverversion``."""
    for line in text.splitlines():
        match = _DRIVER_LINE.match(line)
        if match:
            return clean_text(match.group(1))
    return None


def dtk_roots() -> list[Path]:
    """DTK install roots found on this host (``$ROCM_PATH`` first when it points into a dtk tree)."""
    roots: list[Path] = []
    rocm_path = os.environ.get("ROCM_PATH", "")
    if "dtk" in rocm_path.lower():
        roots.append(Path(rocm_path))
    for pattern in DTK_GLOBS:
        roots.extend(Path(p) for p in sorted(glob.glob(pattern)) if Path(p).is_dir())
    return roots


def hy_smi_command() -> str:
    """hy-smi on PATH, else the HyHAL install location (it is often not on PATH inside containers)."""
    if shutil.which("hy-smi"):
        return "hy-smi"
    for base in HYHAL_DIRS:
        candidate = Path(base) / "bin" / "hy-smi"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return "hy-smi"


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------
class HygonBackend(RocmBackend):
    """Hygon DCUs through the DTK (HIP) build of PyTorch."""

    name = "hygon"
    display_name = "Hygon DCU (DTK)"
    vendor = "Hygon"
    device_type = "cuda"
    torch_module = "cuda"
    dist_backend = "nccl"  # DTK torch serves the "nccl" backend name with RCCL
    collective_library = "rccl"
    smi_tool = "hy-smi"
    env_prefixes = ("HIP_", "HSA_", "HY_")
    smi_command = ("hy-smi",)
    # DCUs up to K100_AI have no fp8 units; claims are kept to what the dtype smoke probe
    # can be held to on every supported part.
    dtypes = ("fp32", "fp16", "bf16", "int8")
    fp8_flavour = None
    has_streams = True
    supersedes = ("rocm",)
    runtime_names = ("hip", "dtk", "rccl", "dcu_driver")

    INFO_COMMAND: tuple[str, ...] = ("--showproductname", "--showmeminfo", "vram", "--showdriverversion")
    """Arguments of the second hy-smi call that adds names, VRAM totals and the driver."""

    # --- probe -------------------------------------------------------------------------------
    @staticmethod
    def dtk_evidence(torch: Any | None = None) -> list[str]:
        """Everything on this host that marks a Hygon DTK install (empty: nothing does)."""
        found: list[str] = []
        if torch is not None:
            tag = torch_version_tag(torch)
            if "dtk" in tag or "das" in tag:
                found.append(f"torch build tag +{tag}")
        found.extend(f"{root} exists" for root in dtk_roots())
        found.extend(f"{d} exists" for d in HYHAL_DIRS if Path(d).is_dir())
        if shutil.which("hy-smi"):
            found.append("hy-smi on PATH")
        if module_present(VLLM_PLUGIN_MODULE):
            found.append(f"{VLLM_PLUGIN_MODULE} installed")
        return found

    def _probe(self) -> ProbeResult:
        torch, build, why = self._hip_build()
        if torch is None:
            return ProbeResult.no(why)
        if not self.dtk_evidence(torch):
            return ProbeResult.no(
                f"{build} is a HIP build, but nothing marks it as Hygon DTK: no dtk/das tag in the torch "
                f"version, no /opt/dtk* or /opt/hyhal, ROCM_PATH not in a dtk tree, no hy-smi on PATH, "
                f"{VLLM_PLUGIN_MODULE} not installed")
        return cuda_api_probe(torch, build)

    # --- vendor tool -------------------------------------------------------------------------
    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_hy_smi(text)

    def inventory(self) -> tuple[list[DeviceInfo], str]:
        exe = hy_smi_command()
        texts: list[str] = []
        used: list[str] = []
        notes: list[str] = []
        for command in ((exe,), (exe, *self.INFO_COMMAND)):
            out = run_tool(command, timeout_s=self.tool_timeout_s)
            if out.ok:
                texts.append(out.stdout)
                used.append(" ".join(command))
            elif out.error not in notes:  # a missing tool fails both calls the same way
                notes.append(out.error)
        if texts:
            try:
                devices = self.parse_smi("\n".join(texts))
                return devices, "; ".join([*notes, f"from {' + '.join(used)}"])
            except Exception as exc:  # noqa: BLE001 - unknown output must not stop capture
                notes.append(f"hy-smi output not understood: {type(exc).__name__}: {exc}")
        return self._torch_inventory(), "; ".join([*notes, "from torch"])

    def runtime_versions(self) -> dict[str, str | None]:
        versions = self._hip_versions()
        # DTK writes its own release ("26.04", the dtkNNNN of DAS wheel tags) to .info/rocm_version;
        # .info/version is the ROCm base it derives from (HYGON-AI/vllm-plugin-das setup.py).
        versions["dtk"] = read_first_line([root / ".info" / name for root in dtk_roots()
                                           for name in ("rocm_version", "version")])
        out = run_tool((hy_smi_command(), "--showdriverversion"), timeout_s=self.tool_timeout_s)
        if out.ok:
            versions["dcu_driver"] = parse_hy_smi_driver(out.stdout)
        return versions
