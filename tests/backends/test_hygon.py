"""Hygon DCU backend: hy-smi parsing on recordings, DTK detection, supersedes ROCm, inventory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from adaptcheck.backends import hygon as hygon_mod
from adaptcheck.backends.hygon import HygonBackend, parse_hy_smi, parse_hy_smi_driver
from adaptcheck.backends.registry import discover
from adaptcheck.backends.rocm import RocmBackend
from tests.backends.fakes import install_fake_tool, install_fake_torch

HY = Path(__file__).resolve().parents[1] / "recordings" / "hy-smi"
K100_TABLE = HY / "k100ai_x8_default.txt"
K100_ALL = HY / "k100ai_x8_all_excerpt.txt"
K100_MEMAVAIL = HY / "k100ai_x8_showmemavailable.txt"
BW1000_TABLE = HY / "bw1000_x2_dtk2604_default.txt"


@pytest.fixture
def no_dtk_on_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point every DTK evidence source at places that do not exist."""
    monkeypatch.setattr(hygon_mod, "DTK_GLOBS", (str(tmp_path / "no-dtk"),))
    monkeypatch.setattr(hygon_mod, "HYHAL_DIRS", (str(tmp_path / "no-hyhal"),))
    monkeypatch.setattr(hygon_mod, "VLLM_PLUGIN_MODULE", "adaptcheck_no_such_plugin")
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))


# --- parsing the recordings ---------------------------------------------------------------------
def test_recorded_k100_table_parses_to_exact_values() -> None:
    devices = parse_hy_smi(K100_TABLE.read_text())
    assert [d.index for d in devices] == list(range(8))
    first, last = devices[0], devices[7]
    assert (first.name, first.vendor) == ("Hygon DCU", "Hygon")  # the table carries no product name
    assert (first.temperature_c, first.power_w, first.utilization_pct) == (59.0, 114.0, 0.0)
    assert first.extra == {"vram_used_pct": 91.0, "power_cap_w": 400.0, "performance_level": "auto",
                           "mode": "Normal"}
    assert (last.temperature_c, last.power_w, last.extra["vram_used_pct"]) == (58.0, 116.0, 90.0)
    assert first.memory_total_mib is None and first.memory_used_mib is None


def test_table_plus_key_value_lines_merge_per_dcu() -> None:
    text = "\n".join(p.read_text() for p in (K100_TABLE, K100_ALL, K100_MEMAVAIL))
    devices = parse_hy_smi(text)
    assert len(devices) == 8
    assert {d.name for d in devices} == {"K100_AI"}
    assert devices[3].extra["card_vendor"] == "Chengdu C-3000 IC Design Co., Ltd."
    assert devices[3].extra["available_memory_mib"] == 65438.0
    assert devices[3].temperature_c == 59.0  # from the table


def test_dtk_2604_table_with_codec_columns() -> None:
    # DTK 26.04 inserted Dec% and Enc% before Mode: columns come from the header, not positions.
    devices = parse_hy_smi(BW1000_TABLE.read_text())
    assert [(d.index, d.temperature_c, d.power_w, d.utilization_pct) for d in devices] == [
        (0, 50.0, 80.0, 0.0), (1, 52.0, 89.0, 0.0)]
    assert devices[1].extra["power_cap_w"] == 1000.0 and devices[1].extra["mode"] == "Normal"


def test_vram_lines_give_totals_and_used() -> None:
    # Line shape of `hy-smi --showmeminfo vram` as on the recordings' HCU[i] lines.
    text = K100_TABLE.read_text() + "\nHCU[0]          : vram Total Memory (MiB): 65520\n" \
                                    "HCU[0]          : vram Total Used Memory (MiB): 51920\nDriver Version: 6.3.13\n"
    dev = parse_hy_smi(text)[0]
    assert (dev.memory_total_mib, dev.memory_used_mib, dev.driver_version) == (65520.0, 51920.0, "6.3.13")
    # Without the used line, the table's VRAM% of the total stands in.
    text = text.replace("HCU[0]          : vram Total Used Memory (MiB): 51920\n", "")
    assert parse_hy_smi(text)[0].memory_used_mib == round(65520 * 0.91, 1)


def test_driver_line() -> None:
    assert parse_hy_smi_driver("Driver Version: 6.3.13-V1.5.0a\n") == "6.3.13-V1.5.0a"
    assert parse_hy_smi_driver(K100_TABLE.read_text()) is None


@pytest.mark.parametrize("bad", ["", "hy-smi: error while loading shared libraries", K100_TABLE.read_text()[:300]])
def test_parser_rejects_output_without_dcus(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_hy_smi(bad)


# --- inventory end to end -----------------------------------------------------------------------
def test_inventory_combines_both_calls(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "hy-smi",
                      body=f'if [ -z "$1" ]; then cat \'{K100_TABLE}\'; else cat \'{K100_ALL}\'; fi')
    devices, note = HygonBackend().inventory()
    assert note == "from hy-smi + hy-smi --showproductname --showmeminfo vram --showdriverversion"
    assert len(devices) == 8 and devices[0].name == "K100_AI" and devices[0].power_w == 114.0


def test_inventory_with_garbage_falls_back_with_note(fake_bin: Path) -> None:
    install_fake_tool(fake_bin, "hy-smi", body="echo 'Segmentation fault'")
    devices, note = HygonBackend().inventory()
    assert devices == []
    assert "hy-smi output not understood: ValueError" in note and note.endswith("from torch")


def test_hanging_hy_smi_is_cut_off(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_tool(fake_bin, "hy-smi", body="exec sleep 30")
    monkeypatch.setattr(HygonBackend, "tool_timeout_s", 0.5)
    devices, note = HygonBackend().inventory()
    assert devices == [] and "hy-smi did not answer within 0.5 s" in note


def test_missing_tool_is_reported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hygon_mod, "HYHAL_DIRS", (str(tmp_path / "no-hyhal"),))
    monkeypatch.setenv("PATH", str(tmp_path))
    _, note = HygonBackend().inventory()
    assert note == "hy-smi not found on PATH; from torch"


# --- probe ----------------------------------------------------------------------------------------
def test_probe_on_this_cpu_machine_is_unavailable_with_reason() -> None:
    import torch

    if torch.version.hip:
        pytest.skip("this torch is a HIP build")
    result = HygonBackend().probe()
    assert result.available is False and "is not a ROCm/HIP build" in result.reason


@pytest.mark.usefixtures("no_dtk_on_host")
def test_amd_hip_build_is_not_taken_for_dtk(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, "2.5.1+rocm6.2", hip="6.2.41133")
    result = HygonBackend().probe()
    assert result.available is False
    assert "nothing marks it as Hygon DTK" in result.reason
    assert RocmBackend().probe().available is True  # the same host is plain ROCm


@pytest.mark.usefixtures("no_dtk_on_host")
@pytest.mark.parametrize("evidence", ["torch_tag", "dtk_dir", "rocm_path", "hyhal", "hy_smi"])
def test_each_kind_of_dtk_evidence_is_enough(evidence: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            fake_bin: Path) -> None:
    version = "2.4.1+das.opt1.dtk25041" if evidence == "torch_tag" else "2.4.1"
    install_fake_torch(monkeypatch, version, hip="6.3.24335", count=8)
    if evidence == "dtk_dir":
        (tmp_path / "dtk-25.04").mkdir()
        monkeypatch.setattr(hygon_mod, "DTK_GLOBS", (str(tmp_path / "dtk-*"),))
    elif evidence == "rocm_path":
        monkeypatch.setenv("ROCM_PATH", "/opt/dtk-25.04")
    elif evidence == "hyhal":
        (tmp_path / "hyhal").mkdir()
        monkeypatch.setattr(hygon_mod, "HYHAL_DIRS", (str(tmp_path / "hyhal"),))
    elif evidence == "hy_smi":
        install_fake_tool(fake_bin, "hy-smi", body="true")
        monkeypatch.setenv("PATH", str(fake_bin))  # no_dtk_on_host emptied PATH: only the fake tool is on it
    assert HygonBackend.dtk_evidence(sys.modules["torch"])
    result = HygonBackend().probe()
    assert (result.available, result.device_count) == (True, 8)


def test_runtime_versions_read_dtk_version_and_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     fake_bin: Path) -> None:
    dtk = tmp_path / "dtk-24.04.2"
    (dtk / ".info").mkdir(parents=True)
    (dtk / ".info" / "version").write_text("24.04.2\n")
    monkeypatch.setattr(hygon_mod, "DTK_GLOBS", (str(tmp_path / "dtk-*"),))
    monkeypatch.delenv("ROCM_PATH", raising=False)
    install_fake_tool(fake_bin, "hy-smi", body="echo 'Driver Version: 6.3.13'")
    versions = HygonBackend().runtime_versions()
    assert versions["dtk"] == "24.04.2" and versions["dcu_driver"] == "6.3.13"
    assert set(versions) == set(HygonBackend.runtime_names)


def test_dtk_release_comes_from_rocm_version_before_the_rocm_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   fake_bin: Path) -> None:
    """A DTK 26.04 tree (layout per HYGON-AI/vllm-plugin-das setup.py): .info/rocm_version holds
    the DTK release that DAS wheels are tagged with (dtk2604), .info/version the ROCm base."""
    dtk = tmp_path / "dtk-26.04"
    (dtk / ".info").mkdir(parents=True)
    (dtk / ".info" / "rocm_version").write_text("26.04\n")
    (dtk / ".info" / "version").write_text("6.3.26113\n")
    monkeypatch.setattr(hygon_mod, "DTK_GLOBS", (str(tmp_path / "dtk-*"),))
    monkeypatch.delenv("ROCM_PATH", raising=False)
    install_fake_tool(fake_bin, "hy-smi", body="echo 'Driver Version: 6.3.27-V1.2.5'")
    versions = HygonBackend().runtime_versions()
    assert versions["dtk"] == "26.04"


# --- declarations -------------------------------------------------------------------------------
def test_supersedes_rocm() -> None:
    assert HygonBackend.supersedes == ("rocm",)
    assert issubclass(HygonBackend, RocmBackend)


def test_describe_declares_dcu_capabilities() -> None:
    assert HygonBackend().describe() == {
        "name": "hygon", "display_name": "Hygon DCU (DTK)", "device_type": "cuda", "torch_module": "torch.cuda",
        "extension_module": None, "dist_backend": "nccl", "collective_library": "rccl", "smi_tool": "hy-smi",
        "dtypes": ["fp32", "fp16", "bf16", "int8"], "fp8_flavour": None, "has_streams": True,
        "supersedes": ["rocm"],
    }


def test_registered_under_its_entry_point() -> None:
    assert discover()["hygon"].cls is HygonBackend
