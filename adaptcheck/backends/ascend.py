"""The Huawei Ascend NPU backend (torch_npu, CANN, HCCL, ``npu-smi``).

Responsible for declaring what an Ascend machine offers, probing whether torch_npu can
reach an NPU here (and saying precisely why not), turning the ``npu-smi info`` table into
:class:`DeviceInfo` rows, and reading the CANN / driver versions from the files the
installers leave behind. Every parser is a pure function, tested on recorded output.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from adaptcheck.backends.base import Backend, module_version
from adaptcheck.base.schemas.environment import DeviceInfo

# Where the CANN toolkit and the NPU driver install by default; the set_env.sh scripts
# export ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH, which win when set.
DEFAULT_TOOLKIT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
DEFAULT_DRIVER_VERSION_FILE = "/usr/local/Ascend/driver/version.info"

# A PCI address or the placeholders npu-smi prints inside containers / anonymised pastes.
_BUS_ID = re.compile(r"^[0-9A-Za-z]{4}:[0-9A-Za-z]{2}:[0-9A-Za-z]{2}\.[0-9A-Za-z]$|^NA$", re.IGNORECASE)
_FRACTION = re.compile(r"(\d+)\s*/\s*(\d+)")
_HEADER_VERSION = re.compile(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)")


def _number(token: str) -> float | None:
    """npu-smi prints 'NA' or '-' where a value does not apply (e.g. power of a second die)."""
    try:
        return float(token)
    except (TypeError, ValueError):
        return None


def _cells(line: str) -> list[str] | None:
    """The cells of a '| a | b | c |' table row, or None for rules, blanks and prose."""
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|")) or set(stripped) <= set("|+-= "):
        return None
    return [cell.strip() for cell in stripped[1:-1].split("|")]


def parse_npu_smi_info(text: str) -> list[DeviceInfo]:
    """Parse the ``npu-smi info`` overview table into one DeviceInfo per NPU chip.

    Layouts handled (all recorded): 910B (one chip per NPU, HBM column), Atlas A3 (two dies
    per NPU with a ``Chip Phy-ID`` column, the second die's power printed as '-'), and
    310P / 300I Duo (``Chip Device`` column, no HBM column, DDR in Memory-Usage, power 'NA').
    Each NPU is printed as a card row (NPU id, name, health, power, temperature, hugepages)
    followed by a chip row (chip id, [device id], bus id, AICore %, memory). The device
    index is the logical device id where the table shows it (Phy-ID / Device), else the
    chip's position, which is what torch_npu numbers ``npu:N`` by on 910B machines.
    """
    driver: str | None = None
    tool_version: str | None = None
    devices: list[DeviceInfo] = []
    card: _CardRow | None = None
    for line in text.splitlines():
        match = _HEADER_VERSION.search(line)
        if match and driver is None:
            tool_version, driver = match.group(1), match.group(2)
            continue
        cells = _cells(line)
        if cells is None:
            continue
        # The process table repeats 'NPU  Chip' rows: everything after its header is not inventory.
        if len(cells) >= 3 and cells[1].lower().startswith("process id"):
            break
        if len(cells) < 3 or cells[0].startswith(("NPU", "Chip")) or cells[0].startswith("No running"):
            continue
        first = cells[0].split()
        if len(first) >= 2 and first[0].isdigit() and not first[1].isdigit() and not _BUS_ID.match(cells[1]):
            if card is not None:  # a card row without its chip row (truncated output): keep what we have
                devices.append(_ascend_device(card, None, len(devices), driver, tool_version))
            card = _CardRow(npu=int(first[0]), name=" ".join(first[1:]), health=cells[1], metrics=cells[2].split())
            continue
        if first and all(tok.isdigit() for tok in first) and _BUS_ID.match(cells[1]) and card is not None:
            chip = _ChipRow(chip=int(first[0]), device=int(first[1]) if len(first) > 1 else None,
                            bus_id=cells[1], metrics=cells[2])
            devices.append(_ascend_device(card, chip, len(devices), driver, tool_version))
            card = None
    if card is not None:
        devices.append(_ascend_device(card, None, len(devices), driver, tool_version))
    return devices


@dataclass
class _CardRow:
    """First row of an NPU: 'NPU Name | Health | Power(W) Temp(C) Hugepages'."""

    npu: int
    name: str
    health: str
    metrics: list[str]


@dataclass
class _ChipRow:
    """Second row: 'Chip [Phy-ID|Device] | Bus-Id | AICore(%) Memory-Usage [HBM-Usage]'."""

    chip: int
    device: int | None
    bus_id: str
    metrics: str


def _ascend_device(card: _CardRow, chip: _ChipRow | None, position: int,
                   driver: str | None, tool_version: str | None) -> DeviceInfo:
    """One DeviceInfo from a card row and (when present) its chip row."""
    metrics = card.metrics
    extra: dict[str, object] = {"npu_id": card.npu, "health": card.health, "npu_smi_name": card.name}
    if tool_version:
        extra["npu_smi_version"] = tool_version
    card_fractions = _FRACTION.findall(" ".join(metrics))
    if card_fractions:
        extra["hugepages_used"], extra["hugepages_total"] = (int(v) for v in card_fractions[0])
    used = total = util = None
    bus_id = None
    index = position
    if chip is not None:
        extra["chip_id"] = chip.chip
        if chip.device is not None:
            extra["device_id"] = chip.device
            index = chip.device
        bus_id = None if chip.bus_id == "NA" else chip.bus_id
        tokens = chip.metrics.split()
        util = _number(tokens[0]) if tokens else None
        fractions = _FRACTION.findall(chip.metrics)
        if len(fractions) >= 2:
            # Memory-Usage (host-side DDR, 0/0 on 910B) then HBM-Usage: the device memory is HBM.
            extra["ddr_used_mib"], extra["ddr_total_mib"] = (int(v) for v in fractions[0])
            used, total = (float(v) for v in fractions[1])
            extra["memory_kind"] = "HBM"
        elif fractions:
            used, total = (float(v) for v in fractions[0])
            extra["memory_kind"] = "DDR"
    # torch_npu reports 'Ascend910B1'; npu-smi prints '910B1' (A3 already says 'Ascend910').
    name = card.name if card.name.lower().startswith("ascend") else f"Ascend{card.name}"
    return DeviceInfo(
        index=index, name=name, vendor="Huawei",
        memory_total_mib=total, memory_used_mib=used, driver_version=driver,
        bus_id=bus_id,
        power_w=_number(metrics[0]) if metrics else None,
        temperature_c=_number(metrics[1]) if len(metrics) > 1 else None,
        utilization_pct=util, extra=extra,
    )


def parse_key_value_file(text: str) -> dict[str, str]:
    """``key=value`` lines (ascend_toolkit_install.info, driver version.info); '#' lines skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), value.strip())
    return out


def parse_cann_version_cfg(text: str) -> str | None:
    """CANN release from ``<toolkit>/version.cfg``.

    Lines look like ``runtime_running_version=[7.6.0.1.220:8.0.0]``: the part before the
    colon is the component build, the part after it the CANN release users know (8.0.0,
    8.0.RC3 …). The runtime's release is taken, then the toolkit's, then any component's.
    """
    releases: dict[str, str] = {}
    for key, value in parse_key_value_file(text).items():
        match = re.fullmatch(r"\[([^\]:]*):?([^\]]*)\]", value)
        if match:
            releases[key] = match.group(2) or match.group(1)
    for key in ("runtime_running_version", "toolkit_running_version"):
        if releases.get(key):
            return releases[key]
    return next((v for v in releases.values() if v), None)


def parse_toolkit_install_info(text: str) -> str | None:
    """CANN release from ``<arch>-linux/ascend_toolkit_install.info`` (``version=8.0.0``)."""
    return parse_key_value_file(text).get("version") or None


def parse_driver_version_info(text: str) -> str | None:
    """NPU driver version from ``/usr/local/Ascend/driver/version.info`` (``Version=24.1.rc3``)."""
    fields = parse_key_value_file(text)
    return fields.get("Version") or fields.get("package_version") or None


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


class AscendBackend(Backend):
    """Huawei Ascend NPUs (910B / A2, A3, 310P) through torch_npu."""

    name = "ascend"
    display_name = "Huawei Ascend NPU"
    vendor = "Huawei"
    device_type = "npu"
    torch_module = "npu"
    extension_module = "torch_npu"
    dist_backend = "hccl"
    collective_library = "hccl"
    smi_tool = "npu-smi"
    extension_distributions: ClassVar[dict[str, str]] = {"torch_npu": "torch-npu"}
    env_prefixes = ("ASCEND_", "HCCL_", "NPU_")
    smi_command = ("npu-smi", "info")
    # 910B/A2 and A3 compute fp16, bf16 and int8 (w8a8) natively; they have no fp8 units
    # (fp8 arrives with the 950 series). 310P has no bf16: the smoke dtype probe records
    # that as a failure of the claim rather than this class guessing the model here.
    dtypes = ("fp32", "fp16", "bf16", "int8")
    fp8_flavour = None
    has_streams = True
    runtime_names = ("cann",)

    install_hint = "pip install torch-npu matching the installed torch and CANN"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def import_failure_hint(self, exc: BaseException) -> str:
        # Users hit this when CANN's set_env.sh was not sourced (libascendcl.so / libhccl.so not found).
        if re.search(r"lib(ascend|hccl|acl|ge_runner|runtime)", str(exc)):
            return " - source /usr/local/Ascend/ascend-toolkit/set_env.sh before running"
        return ""

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        return parse_npu_smi_info(text)

    def runtime_versions(self) -> dict[str, str | None]:
        """CANN release, NPU driver and torch_npu versions, each None when not found."""
        out: dict[str, str | None] = {"cann": None, "ascend_driver": None,
                                      "torch_npu": module_version("torch_npu")}
        try:
            home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH") or DEFAULT_TOOLKIT_HOME
            cfg = _read(Path(home) / "version.cfg")
            if cfg:
                out["cann"] = parse_cann_version_cfg(cfg)
            if out["cann"] is None:
                # The install info sits under <home>/<arch>-linux/ (aarch64-linux, x86_64-linux).
                for info in sorted(glob.glob(str(Path(home) / "*" / "ascend_toolkit_install.info"))):
                    text = _read(info)
                    if text and (version := parse_toolkit_install_info(text)):
                        out["cann"] = version
                        break
            driver_text = _read(DEFAULT_DRIVER_VERSION_FILE)
            if driver_text:
                out["ascend_driver"] = parse_driver_version_info(driver_text)
        except Exception:  # noqa: BLE001 - version capture is best effort
            pass
        return out
