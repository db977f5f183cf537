"""MetaX backend: mx-smi parsing on a recorded 8× C550 host, MACA detection, supersedes CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.backends import cuda as cuda_mod
from adaptcheck.backends.cuda import CudaBackend
from adaptcheck.backends.metax import MetaxBackend, parse_mx_smi, parse_mx_smi_header
from adaptcheck.backends.registry import discover
from tests.backends.fakes import install_fake_tool, install_fake_torch

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "mx-smi" / "c550_x8_mxsmi224.txt"


@pytest.fixture
def no_maca_on_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_mod, "MACA_DIRS", (str(tmp_path / "no-maca"),))
    monkeypatch.delenv("MACA_PATH", raising=False)


# --- parsing the recording ----------------------------------------------------------------------
def test_recorded_c550_host_parses_to_exact_values() -> None:
    devices = MetaxBackend.parse_smi(RECORDING.read_text())
    assert [d.index for d in devices] == list(range(8))
    assert {d.name for d in devices} == {"MetaX C550"}
    assert {d.vendor for d in devices} == {"MetaX"}
    assert [d.bus_id for d in devices] == ["0000:0f:00.0", "0000:34:00.0", "0000:48:00.0", "0000:5a:00.0",
                                           "0000:87:00.0", "0000:ae:00.0", "0000:c2:00.0", "0000:d7:00.0"]
    assert [d.temperature_c for d in devices] == [29.0, 29.0, 30.0, 29.0, 30.0, 32.0, 32.0, 31.0]
    assert [d.power_w for d in devices] == [53.0, 53.0, 54.0, 54.0, 53.0, 55.0, 56.0, 56.0]
    first = devices[0]
    assert (first.memory_used_mib, first.memory_total_mib) == (858.0, 65536.0)
    assert first.utilization_pct == 0.0
    assert first.driver_version == "2.15.9"
    assert first.firmware_version == "1.25.1.0"
    assert first.uuid is None
    assert first.extra == {"maca_version": "2.32.0.6", "mx_smi_version": "2.2.4", "power_cap_w": 450.0,
                           "state": "Available"}


def test_header_versions() -> None:
    assert parse_mx_smi_header(RECORDING.read_text()) == {
        "mx_smi_version": "2.2.4", "driver_version": "2.15.9", "maca_version": "2.32.0.6",
        "bios_version": "1.25.1.0", "attached_gpus": "8"}


def test_newer_columns_and_missing_power_cap() -> None:
    # mx-smi ≥ 2.2.8 adds Persistence-M/Perf/sGPU-M columns; some hosts print 'NA' for the cap.
    text = RECORDING.read_text().replace(
        "| 0           MetaX C550             | 0000:0f:00.0        | 0%                   |",
        "| 0       MetaX C550             Off | 0000:0f:00.0        | 7%            Native |").replace(
        "| 29C         53W / 450W             | 858/65536 MiB       | Available            |",
        "| 29C         53W / NA                P0 | 858/65536 MiB       | Available            |", 1)
    first = parse_mx_smi(text)[0]
    assert first.name == "MetaX C550" and first.utilization_pct == 7.0
    assert first.power_w == 53.0 and "power_cap_w" not in first.extra
    assert first.extra["persistence_mode"] == "Off" and first.extra["sgpu_mode"] == "Native"
    assert first.extra["performance_state"] == "P0"


@pytest.mark.parametrize("bad", ["", "mx-smi: command not found", RECORDING.read_text()[:600]])
def test_parser_rejects_output_without_gpus(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_mx_smi(bad)


# --- inventory end to end -----------------------------------------------------------------------
def test_inventory_runs_mx_smi(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "mx-smi", body=f"cat '{RECORDING}'")
    devices, note = MetaxBackend().inventory()
    assert note == "from mx-smi"
    assert len(devices) == 8


@pytest.mark.parametrize("body, expected", [
    ("echo 'no device found'", "mx-smi output not understood: ValueError"),
    ("echo 'mxsml init failed' >&2; exit 3", "mx-smi exited with 3: mxsml init failed"),
])
def test_bad_output_falls_back_with_a_note(fake_bin: Path, body: str, expected: str) -> None:
    install_fake_tool(fake_bin, "mx-smi", body=body)
    devices, note = MetaxBackend().inventory()
    assert devices == [] and expected in note and note.endswith("from torch")


def test_hanging_mx_smi_is_cut_off(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_tool(fake_bin, "mx-smi", body="exec sleep 30")
    monkeypatch.setattr(MetaxBackend, "tool_timeout_s", 0.5)
    devices, note = MetaxBackend().inventory()
    assert devices == [] and "mx-smi did not answer within 0.5 s" in note


def test_runtime_versions_from_mx_smi(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "mx-smi", body=f"cat '{RECORDING}'")
    versions = MetaxBackend().runtime_versions()
    assert versions["maca"] == "2.32.0.6" and versions["metax_driver"] == "2.15.9"
    assert set(versions) == set(MetaxBackend.runtime_names)


def test_maca_version_file_keeps_only_the_version(fake_bin: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without mx-smi's header, /opt/maca/Version.txt: its first line is "<component>:<version>"
    (MetaX-MACA/vLLM-metax docs), and the rules compare the version alone."""
    install_fake_tool(fake_bin, "mx-smi", body="exit 1")
    (tmp_path / "Version.txt").write_text("maca:3.8.2.5\n")
    monkeypatch.setenv("MACA_PATH", str(tmp_path))
    assert MetaxBackend().runtime_versions()["maca"] == "3.8.2.5"


# --- probe ----------------------------------------------------------------------------------------
@pytest.mark.usefixtures("no_maca_on_host")
def test_probe_on_this_cpu_machine_is_unavailable_with_reason() -> None:
    import torch

    if "metax" in torch.__version__:
        pytest.skip("this torch is a MetaX build")
    result = MetaxBackend().probe()
    assert result.available is False
    assert "is not a MetaX MACA build" in result.reason and "/opt/maca absent" in result.reason


@pytest.mark.usefixtures("no_maca_on_host")
def test_metax_tagged_build_is_claimed_and_cuda_steps_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, "2.8.0+metax3.3.0.2", cuda="11.6", count=8)
    result = MetaxBackend().probe()
    assert (result.available, result.device_count) == (True, 8)
    assert CudaBackend().probe().available is False


@pytest.mark.usefixtures("no_maca_on_host")
def test_nvidia_build_is_not_taken_for_metax(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, "2.6.0+cu124", cuda="12.4")
    assert MetaxBackend().probe().available is False
    assert CudaBackend().probe().available is True


@pytest.mark.usefixtures("no_maca_on_host")
def test_mx_smi_alone_is_not_evidence(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MOFFETT's SOLA toolkit ships a different tool under the same name.
    install_fake_tool(fake_bin, "mx-smi", body="true")
    install_fake_torch(monkeypatch, "2.6.0+cu124", cuda="12.4")
    assert MetaxBackend().probe().available is False


def test_maca_install_without_maca_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MACA_PATH", str(tmp_path / "maca"))
    install_fake_torch(monkeypatch, "2.13.0+cpu")
    result = MetaxBackend().probe()
    assert result.available is False
    assert "a MACA install is present" in result.reason and "torch.version.cuda is None" in result.reason


# --- declarations -------------------------------------------------------------------------------
def test_supersedes_cuda() -> None:
    assert MetaxBackend.supersedes == ("cuda",)


def test_describe_declares_metax_capabilities() -> None:
    assert MetaxBackend().describe() == {
        "name": "metax", "display_name": "MetaX (MACA)", "device_type": "cuda", "torch_module": "torch.cuda",
        "extension_module": None, "dist_backend": "nccl", "collective_library": "mccl", "smi_tool": "mx-smi",
        "dtypes": ["fp32", "fp16", "bf16", "int8"], "fp8_flavour": None, "has_streams": True,
        "supersedes": ["cuda"],
    }


def test_registered_under_its_entry_point() -> None:
    assert discover()["metax"].cls is MetaxBackend
