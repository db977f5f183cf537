"""AMD ROCm backend: amd-smi / rocm-smi parsing on recordings, probe rules, inventory fallbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptcheck.backends.registry import discover
from adaptcheck.backends.rocm import (
    RocmBackend,
    fp8_flavour_for_arch,
    merge_metric,
    parse_amd_smi_metric,
    parse_amd_smi_static,
    parse_rocm_smi_json,
)
from tests.backends.fakes import install_fake_tool, install_fake_torch

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
MI210_STATIC = RECORDINGS / "amd-smi" / "mi210_static.json"
METRIC_RECONSTRUCTED = RECORDINGS / "amd-smi" / "rx7800xt_metric_RECONSTRUCTED.json"
ROCM_SMI = RECORDINGS / "rocm-smi" / "rx7900xt_productname_use_meminfo.json"


def amd_smi_body(static: Path | str, metric: Path | str | None = None) -> str:
    """A fake amd-smi that answers 'static' and 'metric' from files (or fails for metric)."""
    metric_branch = f"cat '{metric}'" if metric else "echo 'metric not supported' >&2; exit 2"
    return f'case "$1" in static) cat \'{static}\';; metric) {metric_branch};; *) exit 1;; esac'


# --- parsing the recordings ---------------------------------------------------------------------
def test_recorded_mi210_static_parses_to_exact_values() -> None:
    devices = RocmBackend.parse_smi(MI210_STATIC.read_text())
    assert len(devices) == 1
    gpu = devices[0]
    assert (gpu.index, gpu.name, gpu.vendor) == (0, "AMD Instinct MI210", "AMD")
    # amd-smi writes MiB as "MB": 65520 "MB" on a 64 GiB part.
    assert gpu.memory_total_mib == 65520.0
    assert gpu.driver_version is not None and gpu.driver_version.startswith("Linuxversion6.14.0-24-generic")
    assert gpu.firmware_version == "Mi200 pcie"
    # The recording has no bdf and no asic_serial: they stay unknown rather than invented.
    assert gpu.bus_id is None and gpu.uuid is None
    assert gpu.extra["target_graphics_version"] == "gfx90a"
    assert gpu.extra["compute_units"] == 104
    assert gpu.extra["vram_type"] == "HBM" and gpu.extra["vram_vendor"] == "HYNIX"
    assert gpu.extra["power_cap_w"] == 300.0
    assert gpu.extra["numa_node"] == 1
    assert "fp8_flavour" not in gpu.extra  # gfx90a has no fp8


def test_pre_26_list_layout_parses_the_same() -> None:
    # amd-smi < 26 printed a bare list instead of {"gpu_data": [...]}.
    as_list = json.dumps(json.loads(MI210_STATIC.read_text())["gpu_data"])
    assert parse_amd_smi_static(as_list) == parse_amd_smi_static(MI210_STATIC.read_text())


def test_metric_values_are_read() -> None:
    sample = parse_amd_smi_metric(METRIC_RECONSTRUCTED.read_text())
    assert sample == {0: {"memory_used_mib": 14569.0, "memory_total_mib": 16368.0, "utilization_pct": 2.0,
                          "temperature_c": 41.0}}


def test_metric_fills_only_missing_fields() -> None:
    static = parse_amd_smi_static(MI210_STATIC.read_text())
    merged = merge_metric(static, parse_amd_smi_metric(METRIC_RECONSTRUCTED.read_text()))
    assert merged[0].memory_total_mib == 65520.0  # the static total wins
    assert merged[0].memory_used_mib == 14569.0
    assert merged[0].temperature_c == 41.0 and merged[0].utilization_pct == 2.0


def test_recorded_rocm_smi_parses_to_exact_values() -> None:
    devices = parse_rocm_smi_json(ROCM_SMI.read_text())
    assert len(devices) == 1
    gpu = devices[0]
    assert (gpu.index, gpu.name) == (0, "Radeon RX 7900 XT")
    assert gpu.memory_total_mib == 21458059264 / 2**20
    assert gpu.memory_used_mib == 27856896 / 2**20
    assert gpu.utilization_pct == 0.0
    assert gpu.extra["target_graphics_version"] == "gfx1100"
    assert gpu.extra["card_sku"] == "D70401XT"


@pytest.mark.parametrize("arch, flavour", [("gfx942", "e4m3fnuz"), ("gfx942:sramecc+:xnack-", "e4m3fnuz"),
                                           ("gfx950", "e4m3fn"), ("gfx1201", "e4m3fn"), ("gfx90a", None),
                                           (None, None)])
def test_fp8_flavour_follows_the_architecture(arch: str | None, flavour: str | None) -> None:
    assert fp8_flavour_for_arch(arch) == flavour


@pytest.mark.parametrize("bad", ["", "{", "42", '"text"'])
def test_parsers_reject_garbage(bad: str) -> None:
    with pytest.raises((ValueError, json.JSONDecodeError)):
        parse_amd_smi_static(bad)
    with pytest.raises((ValueError, json.JSONDecodeError)):
        parse_rocm_smi_json(bad)


# --- inventory end to end -----------------------------------------------------------------------
def test_inventory_merges_static_and_metric(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "amd-smi", body=amd_smi_body(MI210_STATIC, METRIC_RECONSTRUCTED))
    devices, note = RocmBackend().inventory()
    assert note == "from amd-smi static --json + amd-smi metric --json"
    assert devices[0].name == "AMD Instinct MI210" and devices[0].memory_used_mib == 14569.0


def test_inventory_without_metric_keeps_static_and_says_why(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "amd-smi", body=amd_smi_body(MI210_STATIC))
    devices, note = RocmBackend().inventory()
    assert devices[0].memory_total_mib == 65520.0 and devices[0].memory_used_mib is None
    assert "live values missing: amd-smi exited with 2: metric not supported" in note


def test_inventory_falls_back_to_rocm_smi(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "amd-smi", body="echo '[{\"gpu\": 0, \"asic\"'")  # truncated JSON
    install_fake_tool(fake_bin, "rocm-smi", body=f"cat '{ROCM_SMI}'")
    devices, note = RocmBackend().inventory()
    assert [d.name for d in devices] == ["Radeon RX 7900 XT"]
    assert "amd-smi static output not understood" in note
    assert note.endswith("from rocm-smi --showproductname --showuse --showmeminfo vram --json")


def test_inventory_with_nothing_usable_falls_back_to_torch(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "amd-smi", body="echo '{\"gpu_data\": []}'")
    install_fake_tool(fake_bin, "rocm-smi", body="echo 'WARNING: No JSON data to report'")
    devices, note = RocmBackend().inventory()
    assert devices == []
    assert "amd-smi reported no GPUs" in note and "rocm-smi output not understood" in note
    assert note.endswith("from torch")


def test_hanging_amd_smi_is_cut_off(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_tool(fake_bin, "amd-smi", body="exec sleep 30")
    monkeypatch.setattr(RocmBackend, "tool_timeout_s", 0.5)
    devices, note = RocmBackend().inventory()
    assert devices == []
    assert "amd-smi did not answer within 0.5 s" in note


# --- probe ----------------------------------------------------------------------------------------
def test_probe_on_this_cpu_machine_is_unavailable_with_reason() -> None:
    import torch

    if torch.version.hip:
        pytest.skip("this torch is a HIP build")
    result = RocmBackend().probe()
    assert result.available is False
    assert "is not a ROCm/HIP build (torch.version.hip is None)" in result.reason


def test_probe_accepts_a_hip_build_with_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, "2.5.1+rocm6.2", cuda=None, hip="6.2.41133", count=8)
    result = RocmBackend().probe()
    assert (result.available, result.device_count) == (True, 8)


def test_probe_hip_build_without_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, "2.5.1+rocm6.2", hip="6.2.41133", available=False)
    result = RocmBackend().probe()
    assert result.available is False and "torch.cuda.is_available() is False" in result.reason


def test_runtime_versions_read_the_rocm_version_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "rocm"
    (root / ".info").mkdir(parents=True)
    (root / ".info" / "version").write_text("6.2.4-120\n")
    monkeypatch.setenv("ROCM_PATH", str(root))
    versions = RocmBackend().runtime_versions()
    assert versions["rocm"] == "6.2.4-120"
    assert set(versions) == {"hip", "rocm", "rccl"}


# --- declarations -------------------------------------------------------------------------------
def test_describe_declares_rocm_capabilities() -> None:
    described = RocmBackend().describe()
    assert described["device_type"] == "cuda" and described["torch_module"] == "torch.cuda"
    assert described["dist_backend"] == "nccl" and described["collective_library"] == "rccl"
    assert described["smi_tool"] == "amd-smi"
    assert described["fp8_flavour"] == "e4m3fnuz"
    assert described["dtypes"] == ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"]
    assert described["has_streams"] is True and described["supersedes"] == []


def test_registered_under_its_entry_point() -> None:
    assert discover()["rocm"].cls is RocmBackend
