"""Intel XPU backend: xpu-smi parsing on recorded output, the two-command inventory, probes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptcheck.backends import xpu
from adaptcheck.backends.xpu import (
    XpuBackend,
    merge_detail,
    oneapi_version_from_path,
    parse_xpu_smi_discovery,
)
from tests.backends.fakes import install_fake_module, install_fake_tool

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings" / "xpu-smi"
LIST_DOCS = RECORDINGS / "discovery_json_intel-docs_0x020a.json"
TABLE_DOCS = RECORDINGS / "discovery_d_table_intel-docs_0x020a.txt"
LIST_MAX = RECORDINGS / "discovery_json_max1100_x2.json"
DETAIL_MAX0 = RECORDINGS / "discovery_d0_json_max1100.json"


def install_fake_xpu_smi(directory: Path, outputs: dict[str, tuple[str, int]]) -> None:
    """A fake ``xpu-smi`` answering each exact argument string with (stdout, exit code);
    any other arguments exit 1 with an error on stderr."""
    lines = ['case "$*" in']
    for i, (args, (stdout, code)) in enumerate(outputs.items()):
        payload = directory / f"xpu-smi.{i}.out"
        payload.write_text(stdout)
        lines.append(f"  '{args}') cat '{payload}'; exit {code};;")
    lines += ["  *) echo \"Error: unsupported arguments $*\" >&2; exit 1;;", "esac"]
    install_fake_tool(directory, "xpu-smi", body="\n".join(lines))


# --- parsing ---------------------------------------------------------------------------

def test_discovery_list_from_intel_docs() -> None:
    [device] = parse_xpu_smi_discovery(LIST_DOCS.read_text())
    assert device.index == 0
    assert device.name == "Intel(R) Graphics [0x020a]"
    assert device.vendor == "Intel"
    assert device.bus_id == "0000:4d:00.0"
    assert device.uuid == "00000000-0000-0000-0000-020a00008086"
    assert device.extra["pci_device_id"] == "0x20a"
    # The list form has no memory / driver / firmware: they must stay unknown, not 0.
    assert device.memory_total_mib is None and device.driver_version is None and device.firmware_version is None


def test_discovery_detail_table_from_intel_docs() -> None:
    [device] = parse_xpu_smi_discovery(TABLE_DOCS.read_text())
    assert device.name == "Intel(R) Graphics [0x020a]"
    assert device.driver_version == "16929133"
    assert device.firmware_version == "ATS0_1.1"
    assert device.memory_total_mib == 32768.0
    assert device.bus_id == "0000:4d:00.0"
    assert device.uuid == "00000000-0000-0000-0000-020a00008086"
    assert device.extra["number_of_tiles"] == "2" and device.extra["memory_ecc_state"] == "enabled"


def test_discovery_list_two_max_1100() -> None:
    devices = parse_xpu_smi_discovery(LIST_MAX.read_text())
    assert [d.index for d in devices] == [0, 1]
    assert {d.name for d in devices} == {"Intel(R) Data Center GPU Max 1100"}
    assert [d.bus_id for d in devices] == ["0000:29:00.0", "0000:9a:00.0"]
    assert [d.extra["drm_device"] for d in devices] == ["/dev/dri/card1", "/dev/dri/card2"]


def test_discovery_detail_json_max_1100() -> None:
    [device] = parse_xpu_smi_discovery(DETAIL_MAX0.read_text())
    assert device.driver_version == "I915_23.10.72_PSB_231129.76"
    assert device.memory_total_mib == 51522830336 / 2**20
    assert device.memory_used_mib == pytest.approx((51522830336 - 51493543936) / 2**20)
    assert device.firmware_version is None  # xpu-smi printed "unknown"
    assert device.extra["kernel_version"] == "5.15.0-122-generic"


def test_merge_list_row_with_detail() -> None:
    row = parse_xpu_smi_discovery(LIST_MAX.read_text())[0]
    detail = parse_xpu_smi_discovery(DETAIL_MAX0.read_text())[0]
    merged = merge_detail(row, detail)
    assert merged.bus_id == "0000:29:00.0"  # only in the list
    assert merged.driver_version == "I915_23.10.72_PSB_231129.76"  # only in the detail
    assert merged.memory_total_mib == 51522830336 / 2**20
    assert merged.extra["pci_device_id"] == "0xbda" and merged.extra["device_stepping"] == "B4"


def test_virtual_functions_are_skipped() -> None:
    data = json.loads(LIST_MAX.read_text())
    data["device_list"][1]["device_function_type"] = "virtual"
    assert [d.index for d in parse_xpu_smi_discovery(json.dumps(data))] == [0]


def test_numeric_memory_size_is_accepted() -> None:
    data = json.loads(DETAIL_MAX0.read_text())
    data["memory_physical_size_byte"] = 17179869184  # some builds print a number, not a string
    assert parse_xpu_smi_discovery(json.dumps(data))[0].memory_total_mib == 16384.0


@pytest.mark.parametrize("text", ["", "   \n", "No device discovered\n"])
def test_no_devices(text: str) -> None:
    assert parse_xpu_smi_discovery(text) == []


def test_truncated_json_raises_for_inventory_to_report() -> None:
    with pytest.raises(ValueError):
        parse_xpu_smi_discovery(LIST_MAX.read_text()[:200])


# --- inventory end to end --------------------------------------------------------------

def test_inventory_merges_list_and_detail(fake_bin: Path) -> None:
    install_fake_xpu_smi(fake_bin, {
        "discovery -j": (LIST_MAX.read_text(), 0),
        "discovery -d 0 -j": (DETAIL_MAX0.read_text(), 0),
        "discovery -d 1 -j": ("Error: device 1 is busy\n", 3),
    })
    devices, note = XpuBackend().inventory()
    assert [d.index for d in devices] == [0, 1]
    assert devices[0].driver_version == "I915_23.10.72_PSB_231129.76"
    assert devices[0].memory_total_mib == 51522830336 / 2**20
    assert devices[1].memory_total_mib is None and devices[1].bus_id == "0000:9a:00.0"
    assert note == ("from xpu-smi discovery -j and discovery -d N -j; "
                    "no detail for device 1 (xpu-smi exited with 3: Error: device 1 is busy)")


def test_inventory_detail_not_json(fake_bin: Path) -> None:
    install_fake_xpu_smi(fake_bin, {
        "discovery -j": (LIST_DOCS.read_text(), 0),
        "discovery -d 0 -j": ("{\"device_id\": 0, \"device_na", 0),
    })
    devices, note = XpuBackend().inventory()
    assert len(devices) == 1 and devices[0].name == "Intel(R) Graphics [0x020a]"
    assert "detail of device 0 not understood (JSONDecodeError" in note


def test_inventory_truncated_list_falls_back(fake_bin: Path) -> None:
    install_fake_xpu_smi(fake_bin, {"discovery -j": (LIST_MAX.read_text()[:150], 0)})
    devices, note = XpuBackend().inventory()
    assert devices == []
    assert note.startswith("xpu-smi output not understood: JSONDecodeError")
    assert note.endswith("; from torch")


def test_inventory_empty_and_failing(fake_bin: Path) -> None:
    install_fake_xpu_smi(fake_bin, {"discovery -j": ("{\"device_list\": []}\n", 0)})
    assert XpuBackend().inventory() == ([], "xpu-smi reported no devices; from torch")
    install_fake_xpu_smi(fake_bin, {"discovery -j": ("Level Zero initialization failed\n", 1)})
    devices, note = XpuBackend().inventory()
    assert devices == [] and note == "xpu-smi exited with 1: Level Zero initialization failed; from torch"


def test_inventory_without_tool(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_bin))
    assert XpuBackend().inventory() == ([], "xpu-smi not found on PATH; from torch")


# --- versions ----------------------------------------------------------------------------

def test_oneapi_version_from_path() -> None:
    assert oneapi_version_from_path("/opt/intel/oneapi/compiler/2025.0") == "2025.0"
    assert oneapi_version_from_path("/opt/intel/oneapi/compiler/2024.2.1/") == "2024.2.1"
    assert oneapi_version_from_path("/opt/intel/oneapi/compiler/latest") is None


def test_runtime_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = tmp_path / "compiler" / "2025.1"
    release.mkdir(parents=True)
    (tmp_path / "compiler" / "latest").symlink_to(release)
    monkeypatch.setenv("ONEAPI_ROOT", str(tmp_path))
    # The CPU torch here has torch.version.xpu None and no IPEX.
    assert XpuBackend().runtime_versions() == {"xpu": None, "oneapi": "2025.1", "ipex": None}


# --- probes ------------------------------------------------------------------------------

def test_probe_on_cpu_torch() -> None:
    result = XpuBackend().probe()
    assert result.available is False and result.device_count == 0
    assert "is not built with XPU support (torch.version.xpu is None" in result.reason


def test_probe_with_broken_ipex(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a torch without XPU the probe tries IPEX; a broken IPEX must be a reason.
    install_fake_module(tmp_path, monkeypatch, xpu.IPEX_MODULE,
                        "raise ImportError('libsycl.so.7: cannot open shared object file')\n")
    result = XpuBackend().probe()
    assert result.available is False
    assert result.reason == ("intel_extension_for_pytorch is installed but failed to import: "
                             "ImportError: libsycl.so.7: cannot open shared object file")


def test_describe() -> None:
    assert XpuBackend().describe() == {
        "name": "xpu", "display_name": "Intel XPU", "device_type": "xpu", "torch_module": "torch.xpu",
        "extension_module": None, "dist_backend": "xccl", "collective_library": "oneccl",
        "smi_tool": "xpu-smi", "dtypes": ["fp32", "fp16", "bf16", "int8"], "fp8_flavour": None,
        "has_streams": True, "supersedes": [],
    }
    assert XpuBackend.runtime_names == ("xpu", "oneapi")
