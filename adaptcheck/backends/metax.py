"""The MetaX backend: MACA torch builds on MetaX GPUs told apart from NVIDIA builds (it
supersedes the CUDA backend), ``mx-smi`` parsing, and the MACA, MCCL and driver versions.

The evidence that separates the builds: docs/backends.md (Built-in backends).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from adaptcheck.backends import cuda as _cuda
from adaptcheck.backends.base import ProbeResult
from adaptcheck.backends.cuda import (
    CudaBackend,
    clean_text,
    cuda_api_probe,
    maca_install_evidence,
    metax_torch_tag,
    nccl_version,
    read_first_line,
    torch_build_label,
    torch_or_reason,
)
from adaptcheck.base.schemas.environment import DeviceInfo

_HEADER_FIELDS = {
    "mx_smi_version": re.compile(r"MX-SMI\s+(\S+)"),
    "driver_version": re.compile(r"Kernel Mode Driver Version:\s*(\S+)"),
    "maca_version": re.compile(r"MACA Version:\s*(\S+)"),
    "bios_version": re.compile(r"BIOS Version:\s*(\S+)"),
    "attached_gpus": re.compile(r"Attached GPUs\s*:\s*(\d+)"),
}
_BUS_ID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")
_TEMP = re.compile(r"(-?\d+(?:\.\d+)?)\s*C\b")
_WATTS = re.compile(r"(\d+(?:\.\d+)?)\s*W\b")
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*MiB")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")


# --------------------------------------------------------------------------------------------
# mx-smi parsing
# --------------------------------------------------------------------------------------------
def parse_mx_smi_header(text: str) -> dict[str, str | None]:
    """Versions printed above the GPU table: mx-smi, kernel-mode driver, MACA, BIOS; GPU count."""
    found: dict[str, str | None] = {}
    for key, pattern in _HEADER_FIELDS.items():
        match = pattern.search(text)
        found[key] = clean_text(match.group(1)) if match else None
    return found


def _cells(line: str) -> list[str]:
    """Cells of a '| a | b | c |' table line (empty for anything else)."""
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|")):
        return []
    return [cell.strip() for cell in stripped.strip("|").split("|")]


def parse_mx_smi(text: str) -> list[DeviceInfo]:
    """Default ``mx-smi`` report → one DeviceInfo per GPU.

    Each GPU is two table lines: ``| idx name [persistence] | bus-id | util% [sGPU mode] |``
    then ``| temp  power[ / cap] [Pn] | used/total MiB | state |``. Newer mx-smi releases add
    the bracketed columns; the parser keys on the bus-id cell and on units, not positions.
    Raises ValueError when no GPU block is found.
    """
    header = parse_mx_smi_header(text)
    lines = text.splitlines()
    rows: list[DeviceInfo] = []
    for position, line in enumerate(lines):
        first = _cells(line)
        if len(first) < 3 or not _BUS_ID.match(first[1].split()[0] if first[1] else ""):
            continue
        tokens = first[0].split()
        if not tokens or not tokens[0].isdigit():
            continue
        index = int(tokens[0])
        name_tokens = tokens[1:]
        persistence = None
        if name_tokens and name_tokens[-1] in {"On", "Off"}:
            persistence = name_tokens.pop()
        util = _PERCENT.search(first[2])
        second = _cells(lines[position + 1]) if position + 1 < len(lines) else []
        temp = power = cap = used = total = None
        state = perf = None
        if len(second) >= 2:
            t = _TEMP.search(second[0])
            temp = float(t.group(1)) if t else None
            watts = _WATTS.findall(second[0])
            power = float(watts[0]) if watts else None
            cap = float(watts[1]) if len(watts) > 1 else None
            p = re.search(r"\bP(\d+)\b", second[0])
            perf = p.group(0) if p else None
            m = _MEMORY.search(second[1])
            if m:
                used, total = float(m.group(1)), float(m.group(2))
            state = clean_text(second[2]) if len(second) > 2 else None
        mode = first[2].split()[-1] if len(first[2].split()) > 1 else None
        extra = {
            "maca_version": header.get("maca_version"),
            "mx_smi_version": header.get("mx_smi_version"),
            "power_cap_w": cap,
            "state": state,
            "performance_state": perf,
            "persistence_mode": persistence,
            "sgpu_mode": mode,
        }
        rows.append(DeviceInfo(
            index=index,
            name=" ".join(name_tokens) or "MetaX GPU",
            vendor=MetaxBackend.vendor,
            memory_total_mib=total,
            memory_used_mib=used,
            driver_version=header.get("driver_version"),
            firmware_version=header.get("bios_version"),
            bus_id=first[1].split()[0],
            temperature_c=temp,
            power_w=power,
            utilization_pct=float(util.group(1)) if util else None,
            extra={k: v for k, v in extra.items() if v is not None},
        ))
    if not rows:
        raise ValueError("no GPU block found in mx-smi output")
    return rows


def maca_roots() -> list[Path]:
    """``$MACA_PATH`` first, then the default install directories."""
    roots = [Path(os.environ[v]) for v in _cuda.MACA_ENV_VARS if os.environ.get(v)]
    return roots + [Path(p) for p in _cuda.MACA_DIRS]


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------
class MetaxBackend(CudaBackend):
    """MetaX GPUs through the MACA build of PyTorch (CUDA-compatible API)."""

    name = "metax"
    display_name = "MetaX (MACA)"
    vendor = "MetaX"
    device_type = "cuda"
    torch_module = "cuda"
    dist_backend = "nccl"  # the MACA torch build serves the "nccl" backend name with MCCL
    collective_library = "mccl"
    smi_tool = "mx-smi"
    env_prefixes = ("MACA_", "MCCL_")
    smi_command = ("mx-smi",)
    # C500/C550 compute fp32/fp16/bf16/int8; fp8 is not claimed for the current parts.
    dtypes = ("fp32", "fp16", "bf16", "int8")
    fp8_flavour = None
    has_streams = True
    supersedes = ("cuda",)
    runtime_names = ("maca", "maca_torch_tag", "mccl", "metax_driver")

    # --- probe -------------------------------------------------------------------------------
    def _probe(self) -> ProbeResult:
        torch, why = torch_or_reason()
        if torch is None:
            return ProbeResult.no(why)
        build = torch_build_label(torch)
        version = getattr(torch, "version", None)
        if getattr(version, "hip", None):
            return ProbeResult.no(f"{build} is a ROCm/HIP build, not a MetaX MACA build")
        tag = metax_torch_tag(torch)
        install = maca_install_evidence()
        if not tag:
            if not install:
                return ProbeResult.no(f"{build} is not a MetaX MACA build: no '+metax' tag in its version, and no "
                                      "MACA install found (MACA_PATH unset, /opt/maca absent)")
            if not getattr(version, "cuda", None):
                return ProbeResult.no(f"a MACA install is present ({', '.join(install)}), but {build} does not "
                                      "expose the CUDA API (torch.version.cuda is None): install MetaX's torch wheel")
        return cuda_api_probe(torch, build)

    # --- vendor tool -------------------------------------------------------------------------
    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_mx_smi(text)

    def runtime_versions(self) -> dict[str, str | None]:
        versions: dict[str, str | None] = {name: None for name in self.runtime_names}
        torch, _ = torch_or_reason()
        if torch is not None:
            versions["maca_torch_tag"] = metax_torch_tag(torch)
            if versions["maca_torch_tag"]:
                versions["mccl"] = nccl_version(torch)
        header = self._smi_header(parse_mx_smi_header)
        versions["metax_driver"] = header.get("driver_version")
        # mx-smi prints the MACA release; without it, look for a version file in the install.
        maca = header.get("maca_version") or read_first_line(
            [root / name for root in maca_roots() for name in ("Version.txt", "version.txt", ".info/version")])
        # /opt/maca/Version.txt's first line is "<component>:<version>" (MetaX-MACA/vLLM-metax docs).
        versions["maca"] = (maca.rpartition(":")[2].strip() or None) if maca else None
        return versions
