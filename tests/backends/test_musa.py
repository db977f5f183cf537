"""Moore Threads backend: mthreads-gmi parsing on recorded output, MUSA version, probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.backends.musa import (
    MusaBackend,
    parse_mthreads_gmi_table,
    parse_musa_version_json,
)
from tests.backends.fakes import install_fake_module, install_fake_tool

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
GMI_S5000 = RECORDINGS / "mthreads-gmi" / "gmi-2.4.1_driver-5.1.0-server_mtt-s5000_x8.txt"
GMI_S80 = RECORDINGS / "mthreads-gmi" / "gmi-1.14.0_driver-2.7.0_mtt-s80_x1.txt"
MUSA_VERSION = RECORDINGS / "musa" / "version.json"


def test_s5000_eight_gpus() -> None:
    devices = parse_mthreads_gmi_table(GMI_S5000.read_text())
    assert [d.index for d in devices] == list(range(8))
    assert {d.name for d in devices} == {"MTT S5000"}
    assert {d.vendor for d in devices} == {"Moore Threads"}
    assert {d.driver_version for d in devices} == {"5.1.0-server"}
    assert [d.bus_id for d in devices] == ["00000000:18:00.0", "00000000:3a:00.0", "00000000:4b:00.0",
                                           "00000000:5c:00.0", "00000000:9a:00.0", "00000000:ba:00.0",
                                           "00000000:ca:00.0", "00000000:da:00.0"]
    assert {(d.memory_used_mib, d.memory_total_mib) for d in devices} == {(0, 81920)}
    assert [d.temperature_c for d in devices] == [48, 48, 49, 48, 48, 50, 48, 49]
    assert {d.utilization_pct for d in devices} == {0}
    assert {d.power_w for d in devices} == {None}  # the table has no power column
    extra = devices[0].extra
    assert extra == {"mthreads_gmi_version": "2.4.1", "device_type": "Physical", "perf_state": "P0",
                     "pcie_lane_width": "16x(16x)", "mpc_capable": "YES", "ecc_mode": "On-die, EDC"}


def test_s80_older_layout_without_perf_column() -> None:
    [device] = parse_mthreads_gmi_table(GMI_S80.read_text())
    assert device.name == "MTT S80" and device.index == 0
    assert device.driver_version == "2.7.0"
    assert (device.memory_used_mib, device.memory_total_mib) == (2, 16384)
    assert device.temperature_c == 49 and device.bus_id == "00000000:04:00.0"
    assert device.extra["pcie_lane_width"] == "4x(16x)"  # a card running at x4 in an x16 slot
    assert "perf_state" not in device.extra and device.extra["ecc_mode"] == "N/A"


def test_processes_are_not_devices() -> None:
    text = GMI_S80.read_text().replace("   No running processes found",
                                       "0    1123      /usr/lib/xorg/Xorg                       134MiB")
    assert len(parse_mthreads_gmi_table(text)) == 1


def test_truncated_output_keeps_first_line_of_block() -> None:
    lines = GMI_S5000.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("3    MTT S5000")) + 1
    devices = parse_mthreads_gmi_table("\n".join(lines[:cut]))
    assert len(devices) == 4
    assert devices[3].memory_total_mib == 81920 and devices[3].temperature_c is None


@pytest.mark.parametrize("text", ["", "Failed to initialize MTML: Driver Not Loaded\n", "a | b | c\n"])
def test_no_devices(text: str) -> None:
    assert parse_mthreads_gmi_table(text) == []


def test_inventory_reads_the_tool(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "mthreads-gmi", GMI_S5000.read_text())
    devices, note = MusaBackend().inventory()
    assert note == "from mthreads-gmi" and len(devices) == 8 and devices[5].temperature_c == 50


def test_inventory_falls_back_on_errors(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "mthreads-gmi", "Failed to initialize MTML: Driver Not Loaded\n", exit_code=9)
    assert MusaBackend().inventory() == (
        [], "mthreads-gmi exited with 9: Failed to initialize MTML: Driver Not Loaded; from torch")
    install_fake_tool(fake_bin, "mthreads-gmi", "garbled \x00\x01 output\n")
    assert MusaBackend().inventory() == ([], "mthreads-gmi reported no devices; from torch")


def test_musa_version_json() -> None:
    assert parse_musa_version_json(MUSA_VERSION.read_text()) == {"musa_toolkits": "5.1.0"}
    with pytest.raises(ValueError):
        parse_musa_version_json("{\"musa_toolkits\": {\"vers")


def test_runtime_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "version.json").write_text(MUSA_VERSION.read_text())
    monkeypatch.setenv("MUSA_HOME", str(tmp_path))
    assert MusaBackend().runtime_versions() == {"musa": "5.1.0", "torch_musa": None}
    (tmp_path / "version.json").write_text("not json")
    assert MusaBackend().runtime_versions() == {"musa": None, "torch_musa": None}


def test_probe_on_cpu_machine() -> None:
    result = MusaBackend().probe()
    assert result.available is False and result.device_count == 0
    assert result.reason.startswith("torch_musa is not installed")


def test_probe_with_broken_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_module(tmp_path, monkeypatch, "torch_musa",
                        "raise ImportError('libmusart.so.4: cannot open shared object file')\n")
    result = MusaBackend().probe()
    assert result.available is False
    assert result.reason.startswith("torch_musa is installed but failed to import: ImportError: libmusart.so.4")


def test_describe() -> None:
    assert MusaBackend().describe() == {
        "name": "musa", "display_name": "Moore Threads MUSA", "device_type": "musa", "torch_module": "torch.musa",
        "extension_module": "torch_musa", "dist_backend": "mccl", "collective_library": "mccl",
        "smi_tool": "mthreads-gmi", "dtypes": ["fp32", "fp16", "bf16", "int8"], "fp8_flavour": None,
        "has_streams": True, "supersedes": [],
    }
    assert MusaBackend.runtime_names == ("musa",)
