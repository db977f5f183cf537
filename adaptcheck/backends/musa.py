"""The Moore Threads MUSA backend (torch_musa, MUSA toolkit, MCCL, ``mthreads-gmi``).

Responsible for declaring what a Moore Threads machine offers (MTT S80 / S3000 / S4000 /
S5000), probing whether torch_musa reaches a GPU here (and saying precisely why not),
turning the ``mthreads-gmi`` overview table into :class:`DeviceInfo` rows, and reading the
MUSA toolkit version. Parsers are pure functions tested on recorded output.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from adaptcheck.backends.base import Backend, module_version
from adaptcheck.base.schemas.environment import DeviceInfo

DEFAULT_MUSA_HOME = "/usr/local/musa"

_HEADER = re.compile(r"mthreads-gmi:\s*(\S+)\s+Driver Version:\s*(\S+)")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_MEMORY = re.compile(r"(\d+)MiB\((\d+)MiB\)")
_TEMP = re.compile(r"^(\d+(?:\.\d+)?)C\b")


@dataclass
class _GmiBlock:
    """The three table lines of one GPU, split into cells (filled line by line)."""

    index: int
    name: str
    bus_id: str
    usage: list[str]
    """'%GPU used(total)MiB' split on blanks."""
    type: list[str] = field(default_factory=list)
    """Device type and, from gmi 2.x, the performance state."""
    lanes: str = ""
    temp_mpc: list[str] = field(default_factory=list)
    """Temperature and MPC capability."""
    ecc: str = ""


def parse_mthreads_gmi_table(text: str) -> list[DeviceInfo]:
    """Parse the ``mthreads-gmi`` overview table into one DeviceInfo per GPU.

    Each GPU is three '|'-separated lines: ``ID Name | PCIe bus id | %GPU used(total)MiB``,
    ``Device Type [Perf] | lane width | Temp MPC``, and ``| ECC mode``. Recorded layouts:
    gmi 1.14 (no Perf column) and gmi 2.4 (with Perf). The title line carries the tool and
    driver versions; the process table after 'Processes:' is not inventory. The table has
    no power or UUID; those need ``mthreads-gmi -q``.
    """
    tool_version = driver = None
    devices: list[_GmiBlock] = []
    current: _GmiBlock | None = None
    line_in_block = 0
    for line in text.splitlines():
        if line.strip().startswith("Processes:"):
            break
        match = _HEADER.search(line)
        if match and tool_version is None:
            tool_version, driver = match.group(1), match.group(2)
            continue
        if "|" not in line or line.strip().startswith("+"):
            continue
        cells = [c.strip() for c in line.split("|")]
        head = cells[0].split()
        if len(cells) >= 3 and head and head[0].isdigit() and len(head) > 1 and _BUS_ID.match(cells[1]):
            current = _GmiBlock(index=int(head[0]), name=" ".join(head[1:]), bus_id=cells[1],
                                usage=cells[2].split())
            devices.append(current)
            line_in_block = 1
            continue
        if current is None:
            continue
        if line_in_block == 1 and len(cells) >= 3:
            current.type = cells[0].split()
            current.lanes = cells[1]
            current.temp_mpc = cells[2].split()
            line_in_block = 2
        elif line_in_block == 2 and len(cells) >= 2 and not cells[0]:
            current.ecc = cells[1]
            line_in_block = 3
    return [_musa_device(d, driver, tool_version) for d in devices]


def _musa_device(raw: _GmiBlock, driver: str | None, tool_version: str | None) -> DeviceInfo:
    usage = raw.usage
    util = None
    if usage and usage[0].endswith("%"):
        try:
            util = float(usage[0][:-1])
        except ValueError:
            util = None
    mem = _MEMORY.search(" ".join(usage))
    extra: dict[str, str] = {}
    if tool_version:
        extra["mthreads_gmi_version"] = tool_version
    kind = raw.type
    if kind:
        extra["device_type"] = kind[0]
    if len(kind) > 1:
        extra["perf_state"] = kind[1]
    if raw.lanes:
        extra["pcie_lane_width"] = raw.lanes
    temp_mpc = raw.temp_mpc
    temperature = None
    if temp_mpc:
        match = _TEMP.match(temp_mpc[0])
        temperature = float(match.group(1)) if match else None
    if len(temp_mpc) > 1:
        extra["mpc_capable"] = temp_mpc[1]
    if raw.ecc:
        extra["ecc_mode"] = raw.ecc
    return DeviceInfo(
        index=raw.index, name=raw.name, vendor="Moore Threads",
        memory_total_mib=float(mem.group(2)) if mem else None,
        memory_used_mib=float(mem.group(1)) if mem else None,
        driver_version=driver, bus_id=raw.bus_id, temperature_c=temperature,
        utilization_pct=util, extra=extra,
    )


def parse_musa_version_json(text: str) -> dict[str, str]:
    """Component versions from ``/usr/local/musa/version.json`` (``{"musa_toolkits": {"version": …}}``)."""
    data = json.loads(text)
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for component, info in data.items():
            if isinstance(info, dict) and isinstance(info.get("version"), str):
                out[component] = info["version"]
    return out


class MusaBackend(Backend):
    """Moore Threads GPUs through torch_musa."""

    name = "musa"
    display_name = "Moore Threads MUSA"
    vendor = "Moore Threads"
    device_type = "musa"
    torch_module = "musa"
    extension_module = "torch_musa"
    dist_backend = "mccl"
    collective_library = "mccl"
    smi_tool = "mthreads-gmi"
    extension_distributions: ClassVar[dict[str, str]] = {"torch_musa": "torch-musa"}
    env_prefixes = ("MUSA_", "MTHREADS_", "MCCL_")
    smi_command = ("mthreads-gmi",)
    # S4000 / S5000 compute fp16, bf16 and int8; fp8 exists on S5000 only, so it is not
    # claimed for the backend as a whole (the smoke dtype probe records what each device does).
    dtypes = ("fp32", "fp16", "bf16", "int8")
    fp8_flavour = None
    has_streams = True
    runtime_names = ("musa",)

    install_hint = "install the torch_musa wheel matching torch and the MUSA toolkit"
    import_hint = "is /usr/local/musa/lib on LD_LIBRARY_PATH?"
    visible_devices_env = "MUSA_VISIBLE_DEVICES"

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_mthreads_gmi_table(text)

    def runtime_versions(self) -> dict[str, str | None]:
        """MUSA toolkit release and torch_musa version, each None when not found."""
        out: dict[str, str | None] = {"musa": None, "torch_musa": module_version("torch_musa")}
        try:
            home = Path(os.environ.get("MUSA_HOME") or os.environ.get("MUSA_PATH") or DEFAULT_MUSA_HOME)
            versions = parse_musa_version_json((home / "version.json").read_text(errors="replace"))
            out["musa"] = versions.get("musa_toolkits") or versions.get("musa_runtime")
        except Exception:  # noqa: BLE001 - version capture is best effort
            pass
        return out
