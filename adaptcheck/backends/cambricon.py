"""The Cambricon MLU backend (torch_mlu, Neuware / CNToolkit, CNCL, ``cnmon``).

Responsible for declaring what a Cambricon machine offers (MLU370, MLU590 …), probing
whether torch_mlu reaches an MLU here (and saying precisely why not), turning the ``cnmon``
overview table into :class:`DeviceInfo` rows, and reading the Neuware version. Parsers
are pure functions tested on recorded output.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from adaptcheck.backends.base import Backend, module_version
from adaptcheck.base.schemas.environment import DeviceInfo

DEFAULT_NEUWARE_HOME = "/usr/local/neuware"

_HEADER = re.compile(r"CNMON\s+v(\S+)(?:.*?Driver\s+v(\S+))?")
# '0     /   MLU370-X8    v1.1.6': card, VF ('/' for the physical function), name, firmware.
_CARD = re.compile(r"^(\d+)\s+(\S+)\s+(.+?)(?:\s+(v\S+))?$")
_TEMP = re.compile(r"(\d+(?:\.\d+)?)\s*C\b")
_POWER = re.compile(r"([\d.]+|N/A)\s*W\s*/\s*([\d.]+|N/A)\s*W")
_MEMORY = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")


def _float(token: str | None) -> float | None:
    try:
        return float(token) if token is not None else None
    except ValueError:
        return None


def parse_cnmon_table(text: str) -> list[DeviceInfo]:
    """Parse the ``cnmon`` overview table into one DeviceInfo per MLU.

    Two recorded layouts: CNMON 5.x prints ``Driver vX`` in the title and a Bus-Id middle
    column; CNMON 4.x prints ``Inited  Driver`` there instead (and vMemory-Usage on the
    right). Each card is two rows: identity (card, VF, name, firmware | bus id or driver |
    util, ECC) and telemetry (fan, temperature, power | memory | …). The process table
    after 'Processes:' is not inventory.
    """
    cnmon_version = driver = None
    devices: list[DeviceInfo] = []
    ident: _IdentityRow | None = None
    for line in text.splitlines():
        if "Processes:" in line:
            break
        match = _HEADER.search(line)
        if match and cnmon_version is None:
            cnmon_version, driver = match.group(1), match.group(2)
            continue
        stripped = line.strip()
        if not (stripped.startswith("|") and stripped.endswith("|")):
            continue
        cells = [c.strip() for c in stripped[1:-1].split("|")]
        if len(cells) < 3 or cells[0].startswith(("Card", "Fan")):
            continue
        card = _CARD.match(cells[0])
        if card and not _TEMP.search(cells[0]):
            if ident is not None:  # identity row whose telemetry row is missing (truncated output)
                devices.append(_cambricon_device(ident, None, driver, cnmon_version))
            ident = _IdentityRow(card=int(card.group(1)), vf=card.group(2), name=card.group(3),
                                 firmware=card.group(4), middle=cells[1], right=cells[2])
            continue
        if ident is not None and (_TEMP.search(cells[0]) or _MEMORY.search(cells[1])):
            devices.append(_cambricon_device(ident, cells, driver, cnmon_version))
            ident = None
    if ident is not None:
        devices.append(_cambricon_device(ident, None, driver, cnmon_version))
    return devices


@dataclass
class _IdentityRow:
    """First row of a card: 'Card VF Name Firmware | Bus-Id (or Inited Driver) | Util Ecc-Error'."""

    card: int
    vf: str
    name: str
    firmware: str | None
    middle: str
    right: str


def _cambricon_device(ident: _IdentityRow, telemetry: list[str] | None, driver: str | None,
                      cnmon_version: str | None) -> DeviceInfo:
    bus_id = ident.middle if _BUS_ID.match(ident.middle) else None
    row_driver = driver
    extra: dict[str, object] = {"vf": ident.vf}
    if bus_id is None:
        # CNMON 4.x: 'On          v4.20.11' = Inited state, then the driver version.
        parts = ident.middle.split()
        if parts and parts[-1].startswith("v"):
            row_driver = row_driver or parts[-1][1:]
        if parts:
            extra["inited"] = parts[0]
    right = ident.right.split()
    util = _float(right[0].rstrip("%")) if right and right[0].endswith("%") else None
    if cnmon_version:
        extra["cnmon_version"] = cnmon_version
    if len(right) > 1:
        extra["ecc_error"] = right[1]
    used = total = temperature = power = None
    if telemetry is not None:
        temp = _TEMP.search(telemetry[0])
        temperature = _float(temp.group(1)) if temp else None
        pwr = _POWER.search(telemetry[0])
        if pwr:
            power = _float(pwr.group(1))
            extra["power_cap_w"] = _float(pwr.group(2))
        fan = re.match(r"\s*(\d+)%", telemetry[0])
        if fan:
            extra["fan_pct"] = float(fan.group(1))
        mem = _MEMORY.search(telemetry[1])
        if mem:
            used, total = float(mem.group(1)), float(mem.group(2))
        if len(telemetry) > 2 and telemetry[2]:
            extra["right_column"] = " ".join(telemetry[2].split())
    return DeviceInfo(
        index=ident.card, name=ident.name, vendor="Cambricon",
        memory_total_mib=total, memory_used_mib=used,
        driver_version=row_driver,
        firmware_version=ident.firmware[1:] if ident.firmware else None,
        bus_id=bus_id, temperature_c=temperature, power_w=power, utilization_pct=util,
        extra=extra,
    )


def parse_neuware_version(text: str) -> str | None:
    """Neuware (CNToolkit) release from ``$NEUWARE_HOME/version.txt`` ('Neuware Version 3.9.0')."""
    match = re.search(r"(?:Neuware|CNToolkit)\s+Version\s*:?\s*(\S+)", text, re.IGNORECASE)
    return match.group(1) if match else None


class CambriconBackend(Backend):
    """Cambricon MLUs through torch_mlu."""

    name = "cambricon"
    display_name = "Cambricon MLU"
    vendor = "Cambricon"
    device_type = "mlu"
    torch_module = "mlu"
    extension_module = "torch_mlu"
    dist_backend = "cncl"
    collective_library = "cncl"
    smi_tool = "cnmon"
    extension_distributions: ClassVar[dict[str, str]] = {"torch_mlu": "torch-mlu"}
    env_prefixes = ("MLU_", "CNCL_")
    # The bare table holds name, firmware, driver, bus id, utilisation, temperature, power
    # and memory for every card in one call; 'cnmon info' is per-field and far longer.
    smi_command = ("cnmon",)
    # MLU370 / MLU590 run fp16, bf16 and int8 natively; fp8 is not claimed for them.
    dtypes = ("fp32", "fp16", "bf16", "int8")
    fp8_flavour = None
    has_streams = True
    runtime_names = ("neuware",)

    install_hint = "Cambricon ships it with the Neuware / Cambricon PyTorch release"
    import_hint = "is NEUWARE_HOME/lib64 on LD_LIBRARY_PATH?"
    visible_devices_env = "MLU_VISIBLE_DEVICES"

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_cnmon_table(text)

    def runtime_versions(self) -> dict[str, str | None]:
        """Neuware / CNToolkit release and torch_mlu version, each None when not found."""
        out: dict[str, str | None] = {"neuware": None, "torch_mlu": module_version("torch_mlu")}
        try:
            home = Path(os.environ.get("NEUWARE_HOME") or DEFAULT_NEUWARE_HOME)
            text = (home / "version.txt").read_text(errors="replace")
            out["neuware"] = parse_neuware_version(text)
        except Exception:  # noqa: BLE001 - version capture is best effort
            pass
        return out
