"""Version-mixing stories, one per vendor, replayed against the shipped rules and stacks.

Each story is an environment as step 1 would capture it. Where the capture reads a vendor's file
or tool, the value is parsed here by adaptcheck's own parser from text in the vendor's recorded
format (the origin of each format is cited beside it); package versions are written as
``pip list`` / ``importlib.metadata`` report them. No recording of a whole machine exists for
these stacks, so the environments are synthesised in those formats: each test says which.

A story asserts the rule that must fire, its verdict, and that the advice names the versions
to change to; the healthy stacks next to them must match their known-good entry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.backends.ascend import parse_cann_version_cfg, parse_driver_version_info
from adaptcheck.backends.hygon import parse_hy_smi_driver
from adaptcheck.backends.musa import parse_musa_version_json
from adaptcheck.base.schemas.environment import DeviceInfo, Environment
from adaptcheck.base.schemas.matrix_evidence import BackendsCompared
from adaptcheck.compat.assess import Assessment, assess
from adaptcheck.compat.known_good import load_known_good
from adaptcheck.compat.rules import load_rules
from tests.steps.matrix.factories import make_env

NO_SITE_FILES: list[Path] = []


def env_for(backend: str, device: str, **fields: Any) -> Environment:
    """A machine of ``backend`` with one ``device``; every package not named is absent."""
    packages = fields.pop("packages", {})
    return make_env(backend=backend, accelerators=[DeviceInfo(index=0, name=device, vendor=backend)],
                    packages={"vllm": None, "transformers": None, **packages}, **fields)


def judged(env: Environment) -> Assessment:
    # A site's $ADAPTCHECK_KNOWN_GOOD must not change what the shipped data says.
    return assess(env, extra_known_good=NO_SITE_FILES)


def verdict(a: Assessment, rule_id: str) -> Any:
    return next(v for v in a.verdicts if v.rule_id == rule_id)


# --------------------------------------------------------------------------- Ascend
# version.cfg line format: vllm-project/vllm-ascend#451 ("current environment"); version.info:
# the same issue; ascend_toolkit_install.info: vllm-project/vllm-ascend#5606.
CANN_8_3_RC2_CFG = "# version: 1.0\nruntime_running_version=[7.7.0.1.238:8.3.RC2]\ntoolkit_running_version=[7.7.0.1.238:8.3.RC2]\n"
CANN_8_1_RC1_CFG = "# version: 1.0\nruntime_running_version=[7.7.0.1.101:8.1.RC1]\n"
DRIVER_25_2_INFO = "Version=25.2.2\nascendhal_version=7.35.23\npackage_version=25.2.2\n"


def ascend_env(cfg: str, packages: dict[str, str], torch: str, python: str = "3.11.13") -> Environment:
    return env_for("ascend", "Ascend910B4-1", arch="aarch64", torch=torch, python=python,
                   driver_version=parse_driver_version_info(DRIVER_25_2_INFO),
                   runtimes={"cann": parse_cann_version_cfg(cfg), "ascend_driver": parse_driver_version_info(DRIVER_25_2_INFO)},
                   torch_device_extension={"torch_npu": packages.pop("torch-npu")}, packages=packages)


def test_torch_npu_built_for_another_torch() -> None:
    """Synthesised in the recorded formats above: torch 2.8.0 installed under torch_npu 2.7.1.post1."""
    env = ascend_env(CANN_8_3_RC2_CFG, {"torch-npu": "2.7.1.post1", "vllm": "0.11.0", "vllm-ascend": "0.11.0"},
                     torch="2.8.0+cpu")
    a = judged(env)
    ext = verdict(a, "torch_npu_torch")
    assert ext.verdict == "incompatible" and "2.7.1" in ext.message and "2.8.0" in ext.message
    pin = verdict(a, "vllm_ascend_torch")
    assert pin.verdict == "incompatible"
    assert "torch 2.8.0+cpu → 2.7.1" in pin.advice
    assert a.known_good.entry is not None and a.known_good.entry.id == "ascend-vllm-ascend-0.11.0"
    assert a.known_good.changes == ["torch 2.8.0+cpu → 2.7.1"]


def test_vllm_ascend_on_a_cann_it_does_not_support() -> None:
    """Synthesised: vllm-ascend 0.10.0rc1 (needs CANN >= 8.2.RC1) on a CANN 8.1.RC1 toolkit."""
    env = ascend_env(CANN_8_1_RC1_CFG, {"torch-npu": "2.7.1.dev20250724", "vllm": "0.10.0",
                                        "vllm-ascend": "0.10.0rc1"}, torch="2.7.1+cpu", python="3.10.12")
    assert env.runtimes["cann"] == "8.1.RC1"
    a = judged(env)
    floor = verdict(a, "vllm_ascend_cann_minimum")
    assert floor.verdict == "incompatible"
    assert floor.advice[0] == "cann 8.1.RC1 → >=8.2.RC1"
    # The other way out: the release whose row accepts this CANN.
    assert "or vllm-ascend 0.10.0rc1 → 0.9.2rc1" in floor.advice
    assert verdict(a, "vllm_ascend_cann_tested").verdict == "warn"


def test_healthy_ascend_stack_matches_its_entry() -> None:
    env = ascend_env(CANN_8_3_RC2_CFG, {"torch-npu": "2.7.1.post1", "vllm": "0.11.0", "vllm-ascend": "0.11.0"},
                     torch="2.7.1+cpu")
    a = judged(env)
    assert a.known_good.matched and a.known_good.entry is not None
    assert a.known_good.entry.id == "ascend-vllm-ascend-0.11.0"
    # The generic rules read this test venv's own metadata; every Ascend rule must hold.
    ascend = [v for v in a.verdicts if v.verdict in ("incompatible", "warn") and not isinstance(v.compared, BackendsCompared)
              and v.rule_id.startswith(("vllm_ascend", "torch_npu", "cann_"))]
    assert not ascend, [v.message for v in ascend]


# --------------------------------------------------------------------------- NVIDIA
def cuda_machine(device: str, capability: str, torch: str, cuda: str, archs: list[str], driver: str,
                 **packages: str) -> Environment:
    return env_for("cuda", device, torch=torch, driver_version=driver, device_arch=capability, torch_archs=archs,
                   runtimes={"cuda": cuda, "nvidia_driver": driver}, packages=packages)


# torch 2.6.0+cu124's get_arch_list() (PyTorch CUDA support matrix; pytorch#157517).
ARCHS_2_6_CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def test_cuda_torch_without_the_gpus_sm() -> None:
    """Synthesised: an RTX 5090 (sm_120) under torch 2.6.0+cu124, whose build stops at sm_90."""
    env = cuda_machine("NVIDIA GeForce RTX 5090", "sm_120", "2.6.0+cu124", "12.4", ARCHS_2_6_CU124, "570.124.06")
    a = judged(env)
    arch = verdict(a, "cuda_arch_in_torch_build")
    assert arch.verdict == "incompatible" and "sm_120" in arch.message
    assert any("torch 2.7.*" in line and "cuda 12.8" in line for line in arch.advice), arch.advice
    assert verdict(a, "cuda_driver").verdict == "ok"


def test_cuda_arch_binary_compatibility_and_ptx() -> None:
    """An sm_86 card runs sm_80 cubins (same major); an sm_121 card runs only compute_120 PTX."""
    a = judged(cuda_machine("NVIDIA A10", "sm_86", "2.7.0+cu128", "12.8", ["sm_80", "sm_90"], "570.26"))
    assert verdict(a, "cuda_arch_in_torch_build").verdict == "ok"
    a = judged(cuda_machine("NVIDIA DGX Spark", "sm_121", "2.9.0+cu130", "13.0",
                            ["sm_75", "sm_80", "sm_90", "sm_100", "sm_120a", "compute_120"], "580.65.06"))
    assert verdict(a, "cuda_arch_in_torch_build").verdict == "warn"


def test_arch_list_not_captured_falls_back_to_the_published_build() -> None:
    env = cuda_machine("NVIDIA B200", "sm_100", "2.6.0+cu126", "12.6", [], "570.124.06")
    arch = verdict(judged(env), "cuda_arch_in_torch_build")
    assert arch.verdict == "incompatible" and "published arch list" in arch.message


def test_healthy_cuda_stack_matches_its_entry() -> None:
    env = cuda_machine("NVIDIA H100 80GB HBM3", "sm_90", "2.7.0+cu128", "12.8",
                       ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"], "570.124.06",
                       vllm="0.9.0")
    a = judged(env)
    assert a.known_good.matched and a.known_good.entry is not None
    assert a.known_good.entry.id == "nvidia-vllm-0.9.0-cu128"
    assert verdict(a, "vllm_cuda_torch_pin").verdict == "ok"


# --------------------------------------------------------------------------- ROCm
def test_rocm_torch_built_for_a_newer_rocm_than_the_driver() -> None:
    """Synthesised: torch 2.7.0+rocm6.3 (HIP 6.3.42131, torch.version.hip format of the ROCm
    matrix) on a host whose amdgpu / ROCm install is 6.0.2 (/opt/rocm/.info/version)."""
    env = env_for("rocm", "AMD Instinct MI300X", torch="2.7.0+rocm6.3", device_arch="gfx942",
                  torch_archs=["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100"],
                  runtimes={"hip": "6.3.42131-fa1d09cbd", "rocm": "6.0.2-115"})
    a = judged(env)
    window = verdict(a, "rocm_kmd_userspace_window")
    assert window.verdict == "warn"
    assert "or rocm 6.0.2-115 → 6.3.*" in window.advice
    assert verdict(a, "rocm_arch_in_torch_build").verdict == "ok"
    assert verdict(a, "rocm_torch_wheel_vs_hip").verdict == "ok"


def test_rocm_gfx_missing_from_the_build_is_incompatible() -> None:
    env = env_for("rocm", "AMD Instinct MI355X", torch="2.9.1+rocm6.4", device_arch="gfx950",
                  torch_archs=["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1100"],
                  runtimes={"hip": "6.4.43482", "rocm": "6.4.1"})
    assert verdict(judged(env), "rocm_arch_in_torch_build").verdict == "incompatible"


# --------------------------------------------------------------------------- Intel XPU
def xpu_env(torch: str, ipex: str) -> Environment:
    return env_for("xpu", "Intel(R) Arc(TM) B580 Graphics", torch=torch,
                   torch_device_extension={"intel_extension_for_pytorch": ipex}, runtimes={"xpu": None, "oneapi": None})


def test_ipex_for_another_torch() -> None:
    """Synthesised (pip list format): IPEX 2.8.10+xpu under torch 2.7.1+xpu; IPEX itself exits 127 at import."""
    a = judged(xpu_env("2.7.1+xpu", "2.8.10+xpu"))
    assert verdict(a, "ipex_torch").verdict == "incompatible"
    table = verdict(a, "ipex_xpu_torch")
    assert table.verdict == "incompatible"
    assert table.advice[0] == "torch 2.7.1+xpu → 2.8.0"
    assert a.known_good.entry is not None and a.known_good.entry.id.startswith("xpu-ipex-")


def test_healthy_xpu_stack_matches_its_entry() -> None:
    env = xpu_env("2.8.0+xpu", "2.8.10+xpu").model_copy(update={"python": "3.11.9"})
    a = judged(env)
    assert a.known_good.matched and a.known_good.entry is not None and a.known_good.entry.id == "xpu-ipex-2.8.10"


# --------------------------------------------------------------------------- Hygon DCU
# hy-smi --showdriverversion line: HYGON-AI/hcu-dcgm recordings ("Driver Version: 6.3.27-V1.2.5").
def test_dcu_plugin_for_another_vllm() -> None:
    """The vendor's own recorded case (vllm-plugin-das docs/hy4_v0251_clean_validation.md):
    vllm-hcu 0.28.1rc1 installed beside the DAS vLLM 0.25.1."""
    env = env_for("hygon", "K100_AI", torch="2.11.0+das.opt1.dtk2604",
                  runtimes={"hip": "6.3.26113", "dtk": "26.04",
                            "dcu_driver": parse_hy_smi_driver("Driver Version: 6.3.30-V1.3.0\n")},
                  packages={"vllm": "0.25.1+das185.dtk2604.torch2110", "vllm-hcu": "0.28.1rc1.dev491+das.0e8d794.dtk2604"})
    a = judged(env)
    series = verdict(a, "hygon_vllm_hcu_series")
    assert series.verdict == "incompatible"
    assert series.advice[0] == "vllm 0.25.1+das185.dtk2604.torch2110 → 0.28.*"
    assert "or vllm-hcu 0.28.1rc1.dev491+das.0e8d794.dtk2604 → 0.25.*" in series.advice
    assert verdict(a, "hygon_driver_dtk").verdict == "ok"
    assert verdict(a, "hygon_das_torch_dtk_tag").verdict == "ok"


def test_dcu_driver_ahead_of_its_dtk_warns() -> None:
    driver = parse_hy_smi_driver("Driver Version: 6.3.27-V1.2.5\n")
    env = env_for("hygon", "K100_AI", torch="2.1.0+das.opt2.dtk24043",
                  runtimes={"dtk": "24.04.3", "dcu_driver": driver})
    a = judged(env)
    assert verdict(a, "hygon_driver_dtk").verdict == "warn"       # 6.3.27 is the 6.3.8 tier: DTK 25.04
    assert verdict(a, "hygon_das_torch_dtk_tag").verdict == "ok"


# --------------------------------------------------------------------------- Cambricon, MUSA, MetaX
def test_torch_mlu_built_for_another_torch() -> None:
    """Synthesised: torch_mlu 1.23.0+torch2.3.0 (its local label names torch 2.3.0) under torch 2.4.0."""
    env = env_for("cambricon", "MLU370-X8", torch="2.4.0+cpu",
                  torch_device_extension={"torch_mlu": "1.23.0+torch2.3.0"}, runtimes={"neuware": "3.13.5"})
    rule = verdict(judged(env), "torch_mlu_torch")
    assert rule.verdict == "incompatible" and "torch 2.3.0" in rule.message
    ok = env_for("cambricon", "MLU370-X8", torch="2.4.0+cpu", python="3.10.14", driver_version="v6.2.29",
                 torch_device_extension={"torch_mlu": "1.22.2+torch2.4.0"}, runtimes={"neuware": "3.13.5"})
    a = judged(ok)
    assert verdict(a, "torch_mlu_torch").verdict == "ok"
    assert verdict(a, "torch_mlu_driver").verdict == "ok"          # "v6.2.29" compares as 6.2.29
    assert a.known_good.matched and a.known_good.entry is not None
    assert a.known_good.entry.id == "cambricon-torch_mlu-1.22-torch2.4"


def test_torch_musa_sdk_too_old() -> None:
    """/usr/local/musa/version.json in the toolkit's format (MooreThreads docs): SDK 4.3.6 under torch_musa 2.9.1."""
    sdk = parse_musa_version_json(json.dumps({"musa_toolkits": {"version": "4.3.6", "git branch": "rc4.3.6"}}))
    env = env_for("musa", "MTT S4000", torch="2.9.0+musa5.2.0", torch_device_extension={"torch_musa": "2.9.1"},
                  runtimes={"musa": sdk.get("musa_toolkits")})
    rule = verdict(judged(env), "torch_musa_sdk")
    assert rule.verdict == "incompatible" and rule.advice[0] == "musa 4.3.6 → >=5.1.0"


def test_old_torch_musa_is_judged_by_its_table_not_its_number() -> None:
    env = env_for("musa", "MTT S4000", torch="2.5.0", torch_device_extension={"torch_musa": "2.1.0"},
                  runtimes={"musa": "4.2.0"})
    assert verdict(judged(env), "torch_musa_torch").verdict == "ok"


def test_metax_plugin_on_another_vllm_and_torch() -> None:
    """Synthesised: vllm-metax 0.29.0 beside vLLM 0.28.0 on a MetaX torch for MACA 3.5.3."""
    env = env_for("metax", "MetaX C500", torch="2.8.0+metax3.5.3.9",
                  runtimes={"maca": "3.5.3.20", "maca_torch_tag": "metax3.5.3.9"},
                  packages={"vllm": "0.28.0", "vllm-metax": "0.29.0", "mcoplib": "0.4.12"})
    a = judged(env)
    assert verdict(a, "vllm_metax_vllm").verdict == "incompatible"
    assert verdict(a, "vllm_metax_torch").verdict == "incompatible"
    assert verdict(a, "mcoplib_maca_minimum").verdict == "incompatible"
    assert verdict(a, "vllm_metax_maca").verdict == "warn"
    assert a.known_good.entry is not None and a.known_good.entry.id == "metax-vllm-metax-0.29.0"
    assert "vllm 0.28.0 → 0.29.0" in a.known_good.changes


@pytest.mark.parametrize("backend", ["cuda", "rocm", "hygon", "ascend", "xpu", "cambricon", "musa", "metax"])
def test_every_accelerator_backend_has_sourced_rules_and_stacks(backend: str) -> None:
    rules = [r for r in load_rules().rules if r.backends and backend in r.backends]
    stacks = [e for e in load_known_good().entries if e.backend == backend]
    assert len(rules) >= 3, [r.id for r in rules]
    assert len(stacks) >= 2, [e.id for e in stacks]
    assert all(r.source.strip() for r in rules) and all(e.source.strip() and e.date for e in stacks)


@pytest.mark.parametrize(("entry", "env"), [
    ("rocm-vllm-0.8.5-rocm6.3.1", lambda: env_for(
        "rocm", "AMD Instinct MI300X", torch="2.7.0+gitf717b2a", device_arch="gfx942", torch_archs=["gfx90a", "gfx942"],
        runtimes={"hip": "6.3.42133-1b9c17779", "rocm": "6.3.1-48"}, packages={"vllm": "0.8.5.dev429+g6a0c5cd7f.rocm631"})),
    ("hygon-vllm-0.21-dtk2604", lambda: env_for(
        "hygon", "BW1100", torch="2.9.0+das.opt1.dtk2604", python="3.10.12",
        runtimes={"dtk": "26.04", "dcu_driver": "6.3.30"}, packages={"vllm": "0.21.0+das.opt1.dtk2604"})),
    ("musa-torch_musa-2.1.1-musa4.2", lambda: env_for(
        "musa", "MTT S4000", torch="2.5.0", torch_device_extension={"torch_musa": "2.1.1"}, runtimes={"musa": "4.2.0"})),
    ("metax-vllm-metax-0.29.0", lambda: env_for(
        "metax", "MetaX C550", torch="2.10.0+metax3.8.2.2", python="3.12.3",
        runtimes={"maca": "3.8.2.2", "maca_torch_tag": "metax3.8.2.2"},
        packages={"vllm": "0.29.0", "vllm-metax": "0.29.0", "mcoplib": "0.4.11+g0cb4f49.maca3.8.2.6.torch2.10"})),
])
def test_healthy_vendor_stacks_match_their_entries(entry: str, env: Any) -> None:
    """Synthesised in each vendor's version formats (ROCm and DAS wheel labels, version.json, MetaX
    torch tags): a stack the vendor published matches its entry and fires no rule of its backend."""
    a = judged(env())
    assert a.known_good.matched, a.known_good.differences
    assert a.known_good.entry is not None and a.known_good.entry.id == entry
    backend = a.known_good.entry.backend
    own = {r.id for r in load_rules().rules if r.backends and backend in r.backends}
    fired = [v.message for v in a.verdicts if v.rule_id in own and v.verdict == "incompatible"]
    assert not fired, fired
