"""Cambricon backend: cnmon parsing on recorded output, Neuware version, probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.backends.cambricon import (
    CambriconBackend,
    parse_cnmon_table,
    parse_neuware_version,
)
from tests.backends.fakes import install_fake_module, install_fake_tool

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
CNMON_5 = RECORDINGS / "cnmon" / "cnmon_v5.10.13_mlu370-x8_x2.txt"
CNMON_4 = RECORDINGS / "cnmon" / "cnmon_v4.20.11_mlu370-x4_x3.txt"
NEUWARE_VERSION = RECORDINGS / "neuware" / "version.txt"


def test_cnmon_5_two_mlu370_x8() -> None:
    devices = parse_cnmon_table(CNMON_5.read_text())
    assert [d.index for d in devices] == [0, 1]
    assert {d.name for d in devices} == {"MLU370-X8"}
    assert {d.vendor for d in devices} == {"Cambricon"}
    assert {d.driver_version for d in devices} == {"5.10.13"}  # from the 'Driver v5.10.13' title
    assert {d.firmware_version for d in devices} == {"1.1.6"}
    assert [d.bus_id for d in devices] == ["0000:39:00.0", "0000:3D:00.0"]
    assert [(d.memory_used_mib, d.memory_total_mib) for d in devices] == [(0, 23374), (0, 23374)]
    assert [d.temperature_c for d in devices] == [32, 39]
    assert [d.power_w for d in devices] == [106, 106]
    assert [d.utilization_pct for d in devices] == [0, 0]
    assert devices[0].extra["power_cap_w"] == 250 and devices[0].extra["ecc_error"] == "N/A"
    assert devices[0].extra["cnmon_version"] == "5.10.13"


def test_cnmon_4_three_mlu370_x4_driver_from_rows() -> None:
    devices = parse_cnmon_table(CNMON_4.read_text())
    assert [d.index for d in devices] == [0, 1, 2]
    assert {d.name for d in devices} == {"MLU370-X4"}
    # CNMON 4.x has no driver in the title: it is the 'On  v4.20.11' middle column.
    assert {d.driver_version for d in devices} == {"4.20.11"}
    assert {d.bus_id for d in devices} == {None}
    assert [d.power_w for d in devices] == [30, 25, 26]
    assert [d.temperature_c for d in devices] == [32, 33, 30]
    assert {d.memory_total_mib for d in devices} == {23308}
    assert devices[0].extra["inited"] == "On"
    assert devices[0].extra["right_column"] == "10240 MiB/1048576 MiB"  # vMemory, not device memory


def test_process_table_is_not_inventory() -> None:
    text = CNMON_5.read_text().replace(
        "|  No running processes found                                                  |",
        "|     0     /  12345    python3 serve.py                              1024 MiB |")
    assert len(parse_cnmon_table(text)) == 2


def test_truncated_table_keeps_identity_row() -> None:
    lines = CNMON_5.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("| 1     /")) + 1
    devices = parse_cnmon_table("\n".join(lines[:cut]))
    assert [d.index for d in devices] == [0, 1]
    assert devices[1].bus_id == "0000:3D:00.0" and devices[1].memory_total_mib is None


@pytest.mark.parametrize("text", ["", "Error: Init CNDev failed, please check driver!\n", "| x | y | z |\n"])
def test_no_devices(text: str) -> None:
    assert parse_cnmon_table(text) == []


def test_inventory_reads_the_tool(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "cnmon", CNMON_4.read_text())
    devices, note = CambriconBackend().inventory()
    assert note == "from cnmon"
    assert [d.power_w for d in devices] == [30, 25, 26]


def test_inventory_falls_back_on_errors(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "cnmon", "Error: Init CNDev failed, please check driver!\n")
    assert CambriconBackend().inventory() == ([], "cnmon reported no devices; from torch")
    install_fake_tool(fake_bin, "cnmon", "", exit_code=255)
    assert CambriconBackend().inventory() == ([], "cnmon exited with 255; from torch")


def test_inventory_truncated(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "cnmon", "\n".join(CNMON_4.read_text().splitlines()[:9]))
    devices, note = CambriconBackend().inventory()
    assert note == "from cnmon" and len(devices) == 1 and devices[0].memory_total_mib == 23308


def test_neuware_version() -> None:
    assert parse_neuware_version(NEUWARE_VERSION.read_text()) == "3.9.0"
    assert parse_neuware_version("") is None


def test_runtime_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "version.txt").write_text(NEUWARE_VERSION.read_text())
    monkeypatch.setenv("NEUWARE_HOME", str(tmp_path))
    assert CambriconBackend().runtime_versions() == {"neuware": "3.9.0", "torch_mlu": None}
    monkeypatch.setenv("NEUWARE_HOME", str(tmp_path / "missing"))
    assert CambriconBackend().runtime_versions() == {"neuware": None, "torch_mlu": None}


def test_probe_on_cpu_machine() -> None:
    result = CambriconBackend().probe()
    assert result.available is False and result.device_count == 0
    assert result.reason.startswith("torch_mlu is not installed")


def test_probe_with_broken_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_module(tmp_path, monkeypatch, "torch_mlu",
                        "raise OSError('libcnrt.so: cannot open shared object file')\n")
    result = CambriconBackend().probe()
    assert result.available is False
    assert result.reason.startswith("torch_mlu is installed but failed to import: OSError: libcnrt.so")


def test_describe() -> None:
    assert CambriconBackend().describe() == {
        "name": "cambricon", "display_name": "Cambricon MLU", "device_type": "mlu", "torch_module": "torch.mlu",
        "extension_module": "torch_mlu", "dist_backend": "cncl", "collective_library": "cncl",
        "smi_tool": "cnmon", "dtypes": ["fp32", "fp16", "bf16", "int8"], "fp8_flavour": None,
        "has_streams": True, "supersedes": [],
    }
    assert CambriconBackend.runtime_names == ("neuware",)
