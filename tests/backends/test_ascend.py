"""Huawei Ascend backend: npu-smi parsing on recorded output, CANN version files, probes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from adaptcheck.backends import ascend
from adaptcheck.backends.ascend import (
    AscendBackend,
    parse_cann_version_cfg,
    parse_driver_version_info,
    parse_npu_smi_info,
    parse_toolkit_install_info,
)
from tests.backends.fakes import install_fake_module, install_fake_tool

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
NPU_SMI = RECORDINGS / "npu-smi"
CANN = RECORDINGS / "cann"
REC_910B = NPU_SMI / "info_910B1_x8_npu-smi-24.1.0.txt"
REC_A3 = NPU_SMI / "info_A3_Ascend910_8x2chips_npu-smi-24.1.rc3.7.txt"
REC_DUO = NPU_SMI / "info_300IDuo_310P3_npu-smi-25.0.rc1.1.txt"


# --- npu-smi info --------------------------------------------------------------------

def test_910b_eight_npus_exact_values() -> None:
    devices = parse_npu_smi_info(REC_910B.read_text())
    assert [d.index for d in devices] == list(range(8))
    assert {d.name for d in devices} == {"Ascend910B1"}
    assert {d.vendor for d in devices} == {"Huawei"}
    assert {d.driver_version for d in devices} == {"24.1.0"}
    # HBM column, not the all-zero Memory-Usage (DDR) column.
    assert [d.memory_used_mib for d in devices] == [3437, 3378, 3376, 3377, 3377, 3376, 3377, 3380]
    assert {d.memory_total_mib for d in devices} == {65536}
    assert [d.bus_id for d in devices] == ["0000:C1:00.0", "0000:01:00.0", "0000:C2:00.0", "0000:02:00.0",
                                           "0000:81:00.0", "0000:41:00.0", "0000:82:00.0", "0000:42:00.0"]
    assert [d.power_w for d in devices] == [89.1, 90.0, 91.5, 91.3, 92.7, 93.0, 91.5, 91.1]
    assert [d.temperature_c for d in devices] == [32, 33, 32, 32, 31, 33, 30, 32]
    assert {d.utilization_pct for d in devices} == {0.0}
    first = devices[0].extra
    assert first["health"] == "OK" and first["npu_id"] == 0 and first["chip_id"] == 0
    assert first["memory_kind"] == "HBM" and first["ddr_total_mib"] == 0
    assert first["npu_smi_name"] == "910B1"


def test_process_table_does_not_add_devices() -> None:
    # The recording has a running process on NPU 0 ('| 0  0 | 641248 | ...'): not a device.
    devices = parse_npu_smi_info(REC_910B.read_text())
    assert len(devices) == 8
    assert all(d.bus_id and d.bus_id.startswith("0000:") for d in devices)


def test_a3_two_dies_per_npu() -> None:
    devices = parse_npu_smi_info(REC_A3.read_text())
    assert len(devices) == 16
    assert [d.index for d in devices] == list(range(16))  # Phy-ID column
    assert [d.extra["npu_id"] for d in devices] == [n for n in range(8) for _ in range(2)]
    assert [d.extra["chip_id"] for d in devices] == [0, 1] * 8
    assert {d.name for d in devices} == {"Ascend910"}
    assert {d.driver_version for d in devices} == {"24.1.rc3.7"}
    # Power is reported once per NPU, on die 0; die 1 prints '-'.
    assert devices[0].power_w == 178.5 and devices[1].power_w is None
    assert devices[14].power_w == 186.4 and devices[15].power_w is None
    assert devices[1].memory_used_mib == 3189 and devices[1].memory_total_mib == 65536
    assert devices[15].bus_id == "0000:83:00.0"
    assert devices[15].temperature_c == 37


def test_300i_duo_310p3_ddr_memory_and_na_power() -> None:
    devices = parse_npu_smi_info(REC_DUO.read_text())
    assert len(devices) == 2
    assert [d.index for d in devices] == [0, 1]  # 'Device' column, not the NPU id 6
    assert {d.extra["npu_id"] for d in devices} == {6}
    assert [d.name for d in devices] == ["Ascend310P3", "Ascend310P3"]
    assert [(d.memory_used_mib, d.memory_total_mib) for d in devices] == [(1175, 44280), (8322, 43693)]
    assert {d.extra["memory_kind"] for d in devices} == {"DDR"}
    assert [d.power_w for d in devices] == [None, None]  # 'NA'
    assert [d.temperature_c for d in devices] == [55, 52]
    assert devices[1].extra["hugepages_used"] == 3262
    assert {d.driver_version for d in devices} == {"25.0.rc1.1"}


def test_truncated_table_keeps_what_was_printed() -> None:
    lines = REC_910B.read_text().splitlines()
    # Cut in the middle of NPU 2: its card row is present, its chip row is not.
    cut = next(i for i, line in enumerate(lines) if "| 2     910B1" in line) + 1
    devices = parse_npu_smi_info("\n".join(lines[:cut]))
    assert len(devices) == 3
    assert devices[2].name == "Ascend910B1" and devices[2].memory_total_mib is None
    assert devices[2].power_w == 91.5 and devices[2].bus_id is None


@pytest.mark.parametrize("text", ["", "garbage\nnot a table\n", "| a | b |\n",
                                  "dcmi model initialized failed, because the device is used. ret is -8020\n"])
def test_unrecognised_text_gives_no_devices(text: str) -> None:
    assert parse_npu_smi_info(text) == []


# --- inventory end to end through run_tool -------------------------------------------

def test_inventory_reads_the_tool(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "npu-smi", REC_A3.read_text())
    devices, note = AscendBackend().inventory()
    assert note == "from npu-smi info"
    assert len(devices) == 16 and devices[3].memory_used_mib == 3185


def test_inventory_garbage_falls_back_with_note(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "npu-smi", "this is not the npu-smi table\n")
    devices, note = AscendBackend().inventory()
    assert devices == []  # CPU machine: torch fallback has nothing either
    assert note == "npu-smi reported no devices; from torch"


def test_inventory_failing_tool_falls_back_with_note(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "npu-smi", "dcmi module initialize failed. ret is -8005\n", exit_code=2)
    devices, note = AscendBackend().inventory()
    assert devices == []
    assert note.startswith("npu-smi exited with 2: dcmi module initialize failed")
    assert note.endswith("from torch")


def test_inventory_truncated_output(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "npu-smi", "\n".join(REC_DUO.read_text().splitlines()[:8]))
    devices, note = AscendBackend().inventory()
    assert note == "from npu-smi info"
    assert [d.index for d in devices] == [0]


def test_inventory_without_tool(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_bin))
    devices, note = AscendBackend().inventory()
    assert devices == [] and note == "npu-smi not found on PATH; from torch"


def test_telemetry_sample_from_tool(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "npu-smi", REC_910B.read_text())
    sample = AscendBackend().telemetry_sample(3)
    assert sample == {"memory_used_mib": 3377, "temperature_c": 32, "power_w": 91.3, "utilization_pct": 0.0}


# --- CANN / driver version files -----------------------------------------------------

def test_version_files() -> None:
    assert parse_cann_version_cfg((CANN / "version.cfg").read_text()) == "8.0.0"
    assert parse_toolkit_install_info((CANN / "ascend_toolkit_install.info").read_text()) == "8.0.0"
    assert parse_driver_version_info((CANN / "driver_version.info").read_text()) == "24.1.rc3"


def test_version_cfg_prefers_runtime_and_handles_rc_names() -> None:
    text = "# version: 1.0\nopp_running_version=[7.5.0.1.129:8.0.RC3]\nruntime_running_version=[7.5.0.1.129:8.0.RC3]\n"
    assert parse_cann_version_cfg(text) == "8.0.RC3"
    assert parse_cann_version_cfg("") is None
    assert parse_cann_version_cfg("runtime_running_version=garbage\n") is None


def test_runtime_versions_reads_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "latest"
    (home / "aarch64-linux").mkdir(parents=True)
    (home / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        (CANN / "ascend_toolkit_install.info").read_text())
    driver = tmp_path / "version.info"
    driver.write_text((CANN / "driver_version.info").read_text())
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(home))
    monkeypatch.setattr(ascend, "DEFAULT_DRIVER_VERSION_FILE", str(driver))
    # No version.cfg there: the install info under <arch>-linux/ is the fallback.
    assert AscendBackend().runtime_versions() == {"cann": "8.0.0", "ascend_driver": "24.1.rc3", "torch_npu": None}
    (home / "version.cfg").write_text("runtime_running_version=[7.6.0.1.220:8.0.1]\n")
    assert AscendBackend().runtime_versions()["cann"] == "8.0.1"


def test_runtime_versions_nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "nope"))
    monkeypatch.setattr(ascend, "DEFAULT_DRIVER_VERSION_FILE", str(tmp_path / "nope.info"))
    assert AscendBackend().runtime_versions() == {"cann": None, "ascend_driver": None, "torch_npu": None}


# --- probes --------------------------------------------------------------------------

def test_probe_on_cpu_machine_says_not_installed() -> None:
    result = AscendBackend().probe()
    assert result.available is False and result.device_count == 0
    assert result.reason.startswith("torch_npu is not installed")


def test_probe_with_broken_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_module(
        tmp_path, monkeypatch, "torch_npu",
        "raise RuntimeError('libascendcl.so: cannot open shared object file: No such file or directory')\n")
    result = AscendBackend().probe()
    assert result.available is False
    assert result.reason.startswith("torch_npu is installed but failed to import: RuntimeError: libascendcl.so")
    assert "set_env.sh" in result.reason
    assert "torch_npu" not in sys.modules


def test_probe_extension_without_device_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An importable torch_npu that registers nothing (e.g. built for another torch).
    install_fake_module(tmp_path, monkeypatch, "torch_npu", "VERSION = 'fake'\n")
    result = AscendBackend().probe()
    assert result.available is False
    assert "torch.npu is missing" in result.reason


# --- declarations --------------------------------------------------------------------

def test_describe() -> None:
    assert AscendBackend().describe() == {
        "name": "ascend", "display_name": "Huawei Ascend NPU", "device_type": "npu",
        "torch_module": "torch.npu", "extension_module": "torch_npu", "dist_backend": "hccl",
        "collective_library": "hccl", "smi_tool": "npu-smi", "dtypes": ["fp32", "fp16", "bf16", "int8"],
        "fp8_flavour": None, "has_streams": True, "supersedes": [],
    }
    assert AscendBackend.smi_command == ("npu-smi", "info")
    assert AscendBackend.runtime_names == ("cann",)
    assert AscendBackend.is_accelerator is True
