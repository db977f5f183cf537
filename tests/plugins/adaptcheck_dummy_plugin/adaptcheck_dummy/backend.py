"""Dummy backends that run on torch's CPU device but present themselves as accelerators.

They are unavailable unless ``ADAPTCHECK_DUMMY`` lists them (comma-separated), so that
installing the plugin never changes which device a real run picks.
"""

from __future__ import annotations

import os

from adaptcheck.backends.base import Backend, ProbeResult
from adaptcheck.base.schemas.environment import DeviceInfo


def _enabled(name: str) -> bool:
    return name in os.environ.get("ADAPTCHECK_DUMMY", "").split(",")


class DummyBackend(Backend):
    """A pretend accelerator (device type cpu underneath)."""

    name = "dummy"
    display_name = "Dummy Accelerator"
    vendor = "Dummy"
    device_type = "cpu"
    torch_module = "cpu"
    dtypes = ("fp32", "bf16")
    smi_tool = "dummy-smi"
    smi_command = ("dummy-smi", "--list")
    has_streams = False

    def _probe(self) -> ProbeResult:
        if not _enabled(self.name):
            return ProbeResult.no(f"ADAPTCHECK_DUMMY does not list {self.name!r}")
        return ProbeResult(True, "", 2)

    def device_name(self, index: int = 0) -> str:
        return f"Dummy Device {index}"

    def synchronize(self, index: int = 0) -> None:
        """Nothing queued on the CPU."""

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        rows = []
        for line in text.splitlines():
            if line.strip():
                idx, name = line.split(":", 1)
                rows.append(DeviceInfo(index=int(idx), name=name.strip(), vendor="Dummy"))
        return rows


class DummyRefinedBackend(DummyBackend):
    """Refines 'dummy' the way Hygon DCU refines ROCm: wins when both are available."""

    name = "dummy_refined"
    display_name = "Dummy Refined Accelerator"
    supersedes = ("dummy",)


class DummyOtherBackend(DummyBackend):
    """A second, unrelated pretend accelerator: with 'dummy' it makes the choice ambiguous."""

    name = "dummy_other"
    display_name = "Other Dummy Accelerator"
