"""NVIDIA CUDA backend: nvidia-smi XML parsing on a recorded A100 (MIG), probe rules, inventory."""

from __future__ import annotations

import copy
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from adaptcheck.backends.cuda import (
    CudaBackend,
    parse_nvidia_smi_xml,
    parse_nvidia_smi_xml_header,
)
from adaptcheck.backends.registry import discover
from tests.backends.fakes import install_fake_tool, install_fake_torch

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "nvidia-smi" / "a100-sxm4-80gb_mig_r535.xml"


# --- parsing the recording --------------------------------------------------------------------
def test_recorded_a100_parses_to_exact_values() -> None:
    devices = CudaBackend.parse_smi(RECORDING.read_text())
    assert len(devices) == 1
    gpu = devices[0]
    assert gpu.index == 0
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.vendor == "NVIDIA"
    assert gpu.memory_total_mib == 81920.0
    assert gpu.memory_used_mib == 50.0
    assert gpu.driver_version == "535.54.03"
    assert gpu.firmware_version == "92.00.36.00.02"
    assert gpu.bus_id == "00000000:01:00.0"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.temperature_c == 27.0
    assert gpu.power_w == 67.03
    assert gpu.extra["power_limit_w"] == 500.0
    assert gpu.extra["cuda_version_of_driver"] == "12.2"
    assert gpu.extra["architecture"] == "Ampere"
    assert gpu.extra["minor_number"] == 1


def test_na_utilisation_stays_none_not_zero() -> None:
    # The recording reports <gpu_util>N/A</gpu_util> (MIG mode): no value, not 0 %.
    gpu = CudaBackend.parse_smi(RECORDING.read_text())[0]
    assert gpu.utilization_pct is None
    assert "fan_speed" not in gpu.extra


def test_mig_slices_are_kept_under_their_parent() -> None:
    gpu = CudaBackend.parse_smi(RECORDING.read_text())[0]
    assert gpu.extra["mig_mode"] == "Enabled"
    migs = gpu.extra["mig_devices"]
    assert [m["index"] for m in migs] == [0, 1, 2, 3]
    assert [m["gpu_instance_id"] for m in migs] == [3, 4, 5, 6]
    assert all(m["memory_total_mib"] == 19968.0 and m["memory_used_mib"] == 12.0 for m in migs)
    assert all(m["multiprocessor_count"] == 14 for m in migs)


def test_header_gives_driver_and_driver_cuda() -> None:
    header = parse_nvidia_smi_xml_header(RECORDING.read_text())
    assert header == {"driver_version": "535.54.03", "cuda_version": "12.2", "attached_gpus": "4"}


def test_several_gpus_are_numbered_in_document_order() -> None:
    # Built from the recording itself: the recorded <gpu> block is duplicated with a second bus id.
    root = ET.fromstring(RECORDING.read_text())
    second = copy.deepcopy(root.find("gpu"))
    assert second is not None
    second.set("id", "00000000:41:00.0")
    uuid = second.find("uuid")
    assert uuid is not None
    uuid.text = "GPU-second"
    root.append(second)
    devices = parse_nvidia_smi_xml(ET.tostring(root, encoding="unicode"))
    assert [(d.index, d.bus_id, d.uuid) for d in devices] == [
        (0, "00000000:01:00.0", "GPU-513536b6-7d19-9063-b049-1e69664bb298"),
        (1, "00000000:41:00.0", "GPU-second"),
    ]


def test_newer_schema_instant_power_is_read() -> None:
    # R570+ drivers replaced <power_draw> with <instant_power_draw>/<average_power_draw>.
    text = RECORDING.read_text().replace("<power_draw>67.03 W</power_draw>",
                                         "<average_power_draw>6.41 W</average_power_draw>"
                                         "<instant_power_draw>6.52 W</instant_power_draw>", 1)
    assert CudaBackend.parse_smi(text)[0].power_w == 6.52


@pytest.mark.parametrize("bad", ["", "not xml at all", RECORDING.read_text()[:5000], "<other/>"])
def test_parser_rejects_garbage_loudly(bad: str) -> None:
    with pytest.raises((ET.ParseError, ValueError)):
        parse_nvidia_smi_xml(bad)


# --- inventory end to end through run_tool ----------------------------------------------------
def test_inventory_runs_the_tool_and_parses(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", RECORDING.read_text())
    devices, note = CudaBackend().inventory()
    assert note == "from nvidia-smi -q -x"
    assert [d.name for d in devices] == ["NVIDIA A100-SXM4-80GB"]


@pytest.mark.parametrize("output, expected", [
    ("", "nvidia-smi output not understood"),
    ("<nvidia_smi_log><driver_version>535</driver", "nvidia-smi output not understood"),
    ("<?xml version='1.0'?><nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>",
     "nvidia-smi reported no devices"),
])
def test_bad_output_falls_back_with_a_note(fake_bin: Path, output: str, expected: str) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", output)
    devices, note = CudaBackend().inventory()
    assert expected in note and note.endswith("from torch")
    assert devices == []  # no usable CUDA device on this machine, so the torch fallback is empty


def test_failing_tool_reports_its_exit_and_message(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi",
                      body="echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2"
                           "; exit 9")
    _, note = CudaBackend().inventory()
    assert "nvidia-smi exited with 9" in note and "could not communicate" in note


def test_hanging_tool_is_cut_off(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", body="exec sleep 30")
    monkeypatch.setattr(CudaBackend, "tool_timeout_s", 0.5)
    devices, note = CudaBackend().inventory()
    assert devices == []
    assert "did not answer within 0.5 s" in note


def test_missing_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    _, note = CudaBackend().inventory()
    assert note == "nvidia-smi not found on PATH; from torch"


def test_runtime_versions_read_the_driver_from_nvidia_smi(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "nvidia-smi", RECORDING.read_text())
    versions = CudaBackend().runtime_versions()
    assert versions["nvidia_driver"] == "535.54.03"
    assert versions["cuda_driver"] == "12.2"
    assert set(versions) == set(CudaBackend.runtime_names)


# --- probe --------------------------------------------------------------------------------------
def test_probe_on_this_cpu_machine_is_unavailable_with_reason() -> None:
    import torch

    if torch.version.cuda:
        pytest.skip("this torch is a CUDA build")
    result = CudaBackend().probe()
    assert result.available is False and result.device_count == 0
    assert "is not a CUDA build (torch.version.cuda is None)" in result.reason
    assert torch.__version__ in result.reason


@pytest.mark.parametrize("version, cuda, hip, available, expected", [
    ("2.5.1+rocm6.2", "12.4", "6.2.41133", True, "is a ROCm/HIP build"),
    ("2.8.0+metax3.3.0.2", "11.6", None, True, "is a MetaX MACA build (+metax3.3.0.2)"),
    ("2.6.0+cu124", "12.4", None, False, "torch.cuda.is_available() is False"),
])
def test_probe_tells_builds_apart(monkeypatch: pytest.MonkeyPatch, version: str, cuda: str | None, hip: str | None,
                                  available: bool, expected: str) -> None:
    install_fake_torch(monkeypatch, version, cuda=cuda, hip=hip, available=available)
    result = CudaBackend().probe()
    assert result.available is False
    assert expected in result.reason


def test_probe_accepts_a_cuda_build_with_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, "2.6.0+cu124", cuda="12.4", count=8)
    result = CudaBackend().probe()
    assert (result.available, result.device_count) == (True, 8)


def test_probe_never_raises_even_if_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> bool:
        raise RuntimeError("CUDA driver initialization failed")

    install_fake_torch(monkeypatch, "2.6.0+cu124", cuda="12.4")
    sys.modules["torch"].cuda.is_available = boom  # type: ignore[attr-defined]
    result = CudaBackend().probe()
    assert result.available is False and "CUDA driver initialization failed" in result.reason


# --- declarations -----------------------------------------------------------------------------
def test_describe_declares_nvidia_capabilities() -> None:
    assert CudaBackend().describe() == {
        "name": "cuda", "display_name": "NVIDIA CUDA", "device_type": "cuda", "torch_module": "torch.cuda",
        "extension_module": None, "dist_backend": "nccl", "collective_library": "nccl", "smi_tool": "nvidia-smi",
        "dtypes": ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"], "fp8_flavour": "e4m3fn",
        "has_streams": True, "supersedes": [],
    }


def test_registered_under_its_entry_point() -> None:
    assert discover()["cuda"].cls is CudaBackend
