"""The ACME backend: every vendor fact declared on the class, nothing edited in adaptcheck."""

from __future__ import annotations

import os
from typing import ClassVar

from adaptcheck.backends.base import Backend, ProbeResult
from adaptcheck.base.schemas.environment import DeviceInfo


class AcmeBackend(Backend):
    """A pretend NPU (torch's CPU device underneath), available when ``ADAPTCHECK_ACME=1``."""

    name = "acme"
    display_name = "ACME NPU"
    vendor = "ACME"
    device_type = "cpu"
    torch_module = "cpu"
    dtypes = ("fp32", "bf16")
    smi_tool = "acme-smi"
    smi_command = ("acme-smi", "--list")
    extension_distributions: ClassVar[dict[str, str]] = {"torch_acme": "torch-acme"}
    env_prefixes = ("ACME_",)
    visible_devices_env = "ACME_VISIBLE_DEVICES"
    peaks_file = "peaks.yaml"
    rules_file = "rules.yaml"

    def _probe(self) -> ProbeResult:
        if os.environ.get("ADAPTCHECK_ACME") != "1":
            return ProbeResult.no("ADAPTCHECK_ACME is not 1 (a test-only vendor)")
        return ProbeResult(True, "", 1)

    def device_name(self, index: int = 0) -> str:
        return f"ACME NPU {index}"

    def synchronize(self, index: int = 0) -> None:
        """Nothing queued on the CPU."""

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        """``acme-smi --list`` lines: ``<index> <name> driver <version>``."""
        rows = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0].isdigit() and "driver" in parts:
                at = parts.index("driver")
                rows.append(DeviceInfo(index=int(parts[0]), name=" ".join(parts[1:at]), vendor="ACME",
                                       driver_version=parts[at + 1] if at + 1 < len(parts) else None))
        return rows
