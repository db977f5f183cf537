"""adaptcheck.perf.peaks and cpu_peak: the shipped peaks file, its validation errors, lookup
by device name, the roofline on known numbers, efficiency against the right dtype's peak,
and the CPU derivation on recorded ``/proc/cpuinfo`` texts (tests/recordings/cpuinfo/)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from adaptcheck.perf.cpu_peak import (
    derive_cpu_peak,
    parse_cpu_facts,
    with_memory_reference,
)
from adaptcheck.perf.peak_lookup import peak_for
from adaptcheck.perf.peaks import (
    Peak,
    PeaksError,
    efficiency,
    find_entry,
    load_peaks,
    parse_peaks,
    roofline,
)

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings" / "cpuinfo"


# --- the shipped file ---------------------------------------------------------------------

def test_shipped_peaks_load_with_sources_and_dense_figures() -> None:
    peaks = load_peaks()
    ids = [e.id for e in peaks.entries]
    assert len(ids) == len(set(ids))
    for e in peaks.entries:
        assert e.source.strip()
        # dense figures throughout: fp8 runs at twice bf16 on every device that has both (a
        # sparse figure mixed with a dense one would break this; the L40S datasheet's own
        # rounding, 733 vs 2 × 362.05, is within 2 %)
        if "bf16" in e.dense_tflops and "fp8_e4m3" in e.dense_tflops:
            assert e.dense_tflops["fp8_e4m3"] == pytest.approx(2 * e.dense_tflops["bf16"], rel=0.02)
    by_id = {e.id: e for e in peaks.entries}
    assert by_id["h100_sxm"].dense_tflops["bf16"] == 989.4 and by_id["h100_sxm"].memory_gbps == 3350
    assert by_id["h100_sxm"].dense_tflops["tf32"] == 494.7 and by_id["h100_sxm"].host_link_gbps == 64
    assert by_id["h200_sxm"].dense_tflops["bf16"] == 989.4 and by_id["h200_sxm"].memory_gbps == 4800
    assert by_id["a100_sxm_80gb"].dense_tflops["bf16"] == 312 and by_id["a100_sxm_80gb"].memory_gbps == 2039
    assert by_id["mi300x"].dense_tflops["bf16"] == 1307.4 and by_id["mi300x"].memory_gbps == 5300
    assert by_id["b200"].dense_tflops["bf16"] == 2250 and by_id["b200"].memory_gbps == 8000
    assert not by_id["ascend_910b"].verified and not by_id["intel_max_1550"].verified


@pytest.mark.parametrize(("backend", "name", "entry"), [
    ("cuda", "NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("cuda", "NVIDIA H100 PCIe", "h100_pcie"),
    ("cuda", "NVIDIA H100 NVL", "h100_nvl"),
    ("cuda", "NVIDIA H200", "h200_sxm"),
    ("cuda", "NVIDIA H200 NVL", "h200_nvl"),
    ("cuda", "NVIDIA GH200 480GB", None),  # Grace Hopper: other clocks and memory
    ("cuda", "NVIDIA A100-SXM4-80GB", "a100_sxm_80gb"),
    ("cuda", "NVIDIA A100-SXM4-40GB", "a100_sxm_40gb"),
    ("cuda", "NVIDIA A100 80GB PCIe", "a100_pcie_80gb"),
    ("cuda", "NVIDIA A100-PCIE-40GB", "a100_pcie_40gb"),
    ("cuda", "NVIDIA L40S", "l40s"),
    ("cuda", "NVIDIA L40", "l40"),
    ("cuda", "NVIDIA B200", "b200"),
    ("cuda", "NVIDIA GeForce RTX 4090", None),
    ("rocm", "AMD Instinct MI300X", "mi300x"),
    ("cuda", "AMD Instinct MI300X", None),  # the backend must match too
    ("ascend", "Ascend910B3", "ascend_910b"),
    ("xpu", "Intel(R) Data Center GPU Max 1550", "intel_max_1550"),
])
def test_lookup_by_device_name(backend: str, name: str, entry: str | None) -> None:
    found = find_entry(load_peaks(), backend, name)
    assert (found.id if found else None) == entry
    peak = peak_for(backend, name)
    assert (peak.entry if peak else None) == entry
    if peak is not None:
        assert peak.device == name


def test_peak_is_in_si_units() -> None:
    peak = peak_for("cuda", "NVIDIA H200")
    assert peak is not None
    assert peak.flops["bf16"] == pytest.approx(9.894e14)
    assert peak.memory_bw == pytest.approx(4.8e12) and peak.host_link_bw == pytest.approx(6.4e10)
    assert peak.network_bw == pytest.approx(4.5e11)
    d = peak.record().dump()
    assert {"device", "entry", "source", "verified", "flops", "memory_bw", "host_link_bw", "derivation"} <= set(d)


# --- validation errors name file:line -------------------------------------------------------

GOOD_ENTRY = """\
  - id: dev
    match: "Dev"
    vendor: V
    backends: [cuda]
    dense_tflops: {bf16: 100}
    memory_gbps: 1000
    source: "a datasheet"
    verified: true
"""


@pytest.mark.parametrize(("text", "line", "words"), [
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace("    verified: true\n", "    verified: true\n    colour: red\n"),
     11, "unknown key"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace('    source: "a datasheet"\n', ""), 3, "source"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace('match: "Dev"', 'match: "Dev("'), 4, "invalid regex"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace("{bf16: 100}", "{bf17: 100}"), 7, "unknown dtype"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace("memory_gbps: 1000", "memory_gbps: -5"), 8, "greater than 0"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY + GOOD_ENTRY, 2, "duplicate entry id"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace("    verified: true\n", ""), 3, "verified"),
    ("schema_version: 1\nentries:\n" + GOOD_ENTRY.replace("  - id: dev\n", "  - id: dev\n    id: dev2\n"), 4,
     "duplicate key"),
])
def test_validation_errors_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(PeaksError) as err:
        parse_peaks(text, "my-peaks.yaml")
    assert str(err.value).startswith(f"my-peaks.yaml:{line}:"), str(err.value)
    assert words in str(err.value)


def test_override_file_is_used(tmp_path: Path) -> None:
    path = tmp_path / "peaks.yaml"
    path.write_text("schema_version: 1\nentries:\n" + GOOD_ENTRY)
    peak = peak_for("cuda", "Dev 9000", path)
    assert peak is not None and peak.entry == "dev" and peak.flops["bf16"] == 1e14
    assert peak_for("cuda", "NVIDIA H100 PCIe", path) is None  # the override replaces the shipped file
    with pytest.raises(PeaksError, match="cannot read"):
        load_peaks(tmp_path / "missing.yaml")


# --- roofline and efficiency on known numbers ---------------------------------------------------

H100 = Peak(device="H100", entry="h100_sxm", source="test", verified=True,
            flops={"bf16": 989.4e12, "fp32": 66.9e12, "tf32": 494.7e12}, memory_bw=3.35e12, host_link_bw=64e9,
            interconnect_bw=450e9)


def test_roofline_square_gemm_is_compute_bound_and_decode_is_memory_bound() -> None:
    n = 4096
    flops, nbytes = 2.0 * n ** 3, 3.0 * n * n * 2  # bf16: A, B read, C written
    ai, ridge, bound = roofline(flops, nbytes, H100, "bf16")
    assert ai == pytest.approx(n / 3)  # 1365.3 FLOP/byte
    assert ridge == pytest.approx(989.4e12 / 3.35e12)  # 295.3 FLOP/byte
    assert bound == "compute"
    m = 8  # decode: weights dominate the traffic, intensity ≈ m
    ai, ridge, bound = roofline(2.0 * m * n * n, (m * n + n * n + m * n) * 2.0, H100, "bf16")
    assert ai is not None and ai < 8.1 and bound == "memory"


def test_roofline_edges() -> None:
    assert roofline(None, 1e9, H100, None) == (None, None, "memory")  # a copy is memory-bound
    assert roofline(1e9, 1e6, None, "bf16") == (1000.0, None, None)  # no peak: intensity only
    assert roofline(1e9, 1e6, H100, "int8") == (1000.0, None, None)  # no figure for the dtype
    at_ridge = 989.4e12 / 3.35e12
    assert roofline(at_ridge * 1e6, 1e6, H100, "bf16")[2] == "compute"


def test_efficiency_uses_the_dtype_and_resource_that_bound() -> None:
    # fp32 at 33.45 TFLOP/s is 50% of the fp32 peak, not 3.4% of the bf16 one
    assert efficiency("compute", H100, "fp32", 33.45e12, None) == pytest.approx(0.5)
    assert efficiency("compute", H100, "bf16", 494.7e12, None) == pytest.approx(0.5)
    assert efficiency("compute", H100, "tf32", 494.7e12, None) == pytest.approx(1.0)
    assert efficiency("memory", H100, "bf16", 1e15, 1.675e12) == pytest.approx(0.5)
    assert efficiency("link", H100, None, None, 32e9) == pytest.approx(0.5)
    assert efficiency("network", H100, "bf16", None, 225e9) == pytest.approx(0.5)
    assert efficiency("compute", H100, "int8", 1e12, None) is None
    assert efficiency(None, H100, "bf16", 1e12, 1e9) is None
    assert efficiency("memory", None, "bf16", 1e12, 1e9) is None


# --- CPU derivation on recorded /proc/cpuinfo --------------------------------------------------

def _facts(name: str, usable: int, maxf: str | None = None) -> object:
    return parse_cpu_facts((RECORDINGS / name).read_text(), usable_logical=usable, max_freq_khz=maxf)


def test_xeon_with_amx_in_a_vm() -> None:
    facts = _facts("xeon_amx_kvm_2vcpu.txt", 2)
    peak = derive_cpu_peak(facts)  # type: ignore[arg-type]
    ghz = 2.599998
    assert peak.entry == "derived:cpu" and not peak.verified
    assert peak.flops["fp32"] == pytest.approx(2 * ghz * 1e9 * 64)  # 16 lanes × 2 FMA × 2
    assert peak.flops["bf16"] == pytest.approx(2 * ghz * 1e9 * 1024)  # AMX TMUL
    assert peak.flops["int8"] == pytest.approx(2 * ghz * 1e9 * 2048)
    assert peak.flops["fp16"] == pytest.approx(2 * ghz * 1e9 * 128)  # avx512_fp16
    assert "fp8_e4m3" not in peak.flops
    text = "\n".join(peak.derivation)
    assert "cpu MHz" in text and "2 cores × 2.600 GHz × 64 = 332.8 GFLOP/s" in text
    assert "AMX" in text and "intel.com" in text
    assert peak.memory_bw is None and "memory:" in text


def test_cpufreq_max_beats_current_mhz() -> None:
    facts = _facts("xeon_amx_kvm_2vcpu.txt", 2, maxf="3800000\n")
    peak = derive_cpu_peak(facts)  # type: ignore[arg-type]
    assert peak.flops["fp32"] == pytest.approx(2 * 3.8e9 * 64)
    assert "cpuinfo_max_freq" in peak.derivation[1]


def test_zen4_epyc_half_rate_avx512_and_vnni() -> None:
    facts = _facts("epyc_9r14_aws_m7a_first_block.txt", 32)
    peak = derive_cpu_peak(facts)  # type: ignore[arg-type]
    rate = 32 * 3.698291e9
    assert peak.flops["fp32"] == pytest.approx(rate * 32)  # 512-bit FMA on 2×256-bit pipes
    assert peak.flops["bf16"] == pytest.approx(rate * 64)  # avx512_bf16: 2 × fp32
    assert peak.flops["fp16"] == pytest.approx(rate * 32)  # no native fp16: fp32 rate
    assert peak.flops["int8"] == pytest.approx(rate * 128)  # avx512_vnni: 4 × fp32
    assert any("Zen 4" in line for line in peak.derivation)


def test_usable_cores_follow_affinity_and_smt() -> None:
    text = (RECORDINGS / "epyc_9r14_aws_m7a_first_block.txt").read_text().replace("siblings\t: 32", "siblings\t: 64")
    facts = parse_cpu_facts(text, usable_logical=16)  # 16 logical CPUs allowed, 2 threads per core
    assert facts.cores == 8
    assert derive_cpu_peak(facts).flops["fp32"] == pytest.approx(8 * 3.698291e9 * 32)


def test_avx2_only_variant() -> None:
    """Derived from the EPYC recording by removing every AVX-512 flag (as a Zen 3 reports)."""
    text = (RECORDINGS / "epyc_9r14_aws_m7a_first_block.txt").read_text()
    text = " ".join(w for w in text.split(" ") if not w.startswith("avx512"))
    peak = derive_cpu_peak(parse_cpu_facts(text, usable_logical=1))
    assert peak.flops["fp32"] == pytest.approx(3.698291e9 * 32)  # 8 lanes × 2 FMA × 2
    assert peak.flops["bf16"] == peak.flops["fp32"]
    assert "int8" not in peak.flops


def test_arm_without_a_clock_derives_no_flops() -> None:
    peak = derive_cpu_peak(parse_cpu_facts((RECORDINGS / "graviton2_c6g_features_excerpt.txt").read_text(),
                                           usable_logical=4))
    assert peak.flops == {}
    assert "clock: unknown" in peak.derivation[1]
    facts = parse_cpu_facts((RECORDINGS / "graviton2_c6g_features_excerpt.txt").read_text(), usable_logical=4,
                            max_freq_khz="2500000")
    peak = derive_cpu_peak(facts)
    assert peak.flops["fp32"] == pytest.approx(4 * 2.5e9 * 16)  # NEON: 4 lanes × 2 pipes × 2
    assert peak.flops["fp16"] == pytest.approx(2 * peak.flops["fp32"])  # asimdhp


def test_memory_reference_is_labelled_and_feeds_the_roofline() -> None:
    facts = _facts("xeon_amx_kvm_2vcpu.txt", 2)
    peak = with_memory_reference(derive_cpu_peak(facts), 20e9, "measured", "copy of 256 MiB")  # type: ignore[arg-type]
    assert peak.memory_bw == 20e9 and peak.memory_bw_basis == "measured" and peak.interconnect_bw == 20e9
    assert any(line.startswith("memory: 20 GB/s (measured)") for line in peak.derivation)
    _ai, ridge, bound = roofline(2.0 * 8 * 4096 * 4096, 2.0 * 4096 * 4096, peak, "bf16")
    assert ridge == pytest.approx(peak.flops["bf16"] / 20e9) and bound == "memory"


def test_cpu_entry_in_a_peaks_file_replaces_derived_figures(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("schema_version: 1\nentries:\n  - id: my_xeon\n    match: 'Xeon'\n    vendor: Intel\n"
                    "    backends: [cpu]\n    memory_gbps: 307.2\n    source: 'DDR5-4800 × 8 channels'\n"
                    "    verified: true\n")
    facts = _facts("xeon_amx_kvm_2vcpu.txt", 2)
    peak = peak_for("cpu", "Intel(R) Xeon(R) Processor", path, cpu_facts=facts)
    assert peak is not None
    assert peak.memory_bw == pytest.approx(307.2e9) and peak.memory_bw_basis == "spec"
    assert peak.entry == "derived:cpu+my_xeon" and math.isclose(peak.flops["bf16"], 2 * 2.599998e9 * 1024)
