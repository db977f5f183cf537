"""The Backend contract, in the spirit of vLLM's ``Platform``: declarations, probes that never
raise, and :func:`run_tool` for vendor tools whose output pure ``parse_*`` functions turn into
:class:`~adaptcheck.base.schemas.environment.DeviceInfo`.

The contract, member by member: docs/backends.md (generated from this module).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from abc import ABC
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from adaptcheck.base.schemas.environment import DeviceInfo

if TYPE_CHECKING:  # torch is imported lazily: `adaptcheck backends` must work without importing it
    import torch


@dataclass(frozen=True)
class ProbeResult:
    """Whether a backend can be used here, and why not."""

    available: bool
    reason: str = ""
    device_count: int = 0

    @classmethod
    def no(cls, reason: str) -> ProbeResult:
        return cls(False, reason, 0)


@dataclass(frozen=True)
class ToolOutput:
    """Result of running a vendor tool. ``ok`` is False when it is missing, failed or hung."""

    command: tuple[str, ...]
    ok: bool
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    error: str = ""
    duration_s: float = 0.0


def run_tool(command: list[str] | tuple[str, ...], timeout_s: float = 20.0) -> ToolOutput:
    """Run a vendor tool and capture its output. Never raises.

    SMI tools on fresh hardware hang (driver stuck) or print to stderr and exit non-zero;
    every such case comes back as ``ok=False`` with the reason in ``error``.
    """
    cmd = tuple(command)
    exe = shutil.which(cmd[0]) if cmd else None
    if exe is None:
        return ToolOutput(cmd, False, error=f"{cmd[0] if cmd else '(empty)'} not found on PATH")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [exe, *cmd[1:]],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return ToolOutput(cmd, False, error=f"{cmd[0]} did not answer within {timeout_s:g} s", duration_s=timeout_s)
    except OSError as exc:
        return ToolOutput(cmd, False, error=f"{cmd[0]} could not be started: {exc}")
    took = time.perf_counter() - start
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()[:1]
        return ToolOutput(
            cmd, False, proc.stdout, proc.stderr, proc.returncode,
            error=f"{cmd[0]} exited with {proc.returncode}" + (f": {first[0]}" if first else ""),
            duration_s=took,
        )
    return ToolOutput(cmd, True, proc.stdout, proc.stderr, 0, duration_s=took)


def module_version(name: str) -> str | None:
    """Version of an importable module from its distribution's metadata, without importing it
    (importing torch_npu or IPEX can initialise a device). The module → distribution map is
    the installed metadata's own (``torch_npu`` → ``torch-npu``), so no vendor list lives here."""
    from importlib import metadata

    for dist in _distributions_of(name) or [name]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


@lru_cache(maxsize=1)
def _module_distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return dict(metadata.packages_distributions())


def _distributions_of(module: str) -> list[str]:
    return _module_distributions().get(module.split(".")[0], [])


class Backend(ABC):
    """Base of every backend. Subclasses set the class attributes and override hooks."""

    # --- declarations -------------------------------------------------------------
    name: ClassVar[str]
    """Short registry name (entry-point name), e.g. 'cuda'."""
    display_name: ClassVar[str]
    """Human name, e.g. 'NVIDIA CUDA'."""
    vendor: ClassVar[str]
    """Vendor label used in DeviceInfo."""
    device_type: ClassVar[str]
    """torch device type: 'cuda', 'npu', 'xpu', 'mlu', 'musa', 'cpu'."""
    torch_module: ClassVar[str]
    """Attribute of torch holding the device API, e.g. 'cuda' for torch.cuda ('cpu' for CPU)."""
    extension_module: ClassVar[str | None] = None
    """Python module that must be imported to register the device with torch (torch_npu …)."""
    dist_backend: ClassVar[str] = "gloo"
    """torch.distributed backend name for collectives."""
    collective_library: ClassVar[str] = "gloo"
    """Vendor collective library (nccl, rccl, hccl, cncl, mccl, xccl, gloo)."""
    smi_tool: ClassVar[str | None] = None
    """Vendor SMI / info tool."""
    tools: ClassVar[tuple[str, ...]] = ()
    """Further vendor tools step 1 locates on PATH beside ``smi_tool`` (rocm-smi beside amd-smi)."""
    extension_distributions: ClassVar[dict[str, str]] = {}
    """PyTorch device extensions of this vendor, module → PyPI distribution (torch_npu →
    torch-npu); step 1 records their versions and ``matrices/rules.yaml`` pins them to torch."""
    env_prefixes: ClassVar[tuple[str, ...]] = ()
    """Prefixes of the environment variables that change how this vendor's stack behaves
    (ASCEND_, HCCL_ …); step 1 records them, secrets redacted."""
    peaks_file: ClassVar[str | None] = None
    """A peaks YAML (``matrices/peaks.yaml``'s schema) the backend's package ships, relative to
    its module's folder; its entries are looked up after the shipped ones."""
    rules_file: ClassVar[str | None] = None
    """A rules YAML (``matrices/rules.yaml``'s schema) the backend's package ships, relative to
    its module's folder; step 1 evaluates its rules beside the shipped ones."""

    @classmethod
    def data_path(cls, relative: str) -> Path:
        """A file shipped beside the backend's module (``peaks_file``, ``rules_file``)."""
        module = sys.modules[cls.__module__]
        return Path(module.__file__ or ".").resolve().parent / relative
    dtypes: ClassVar[tuple[str, ...]] = ("fp32",)
    """Dtypes the backend claims to support (subset of ``adaptcheck.base.dtypes.ALL_DTYPES``); the smoke probe holds it to that."""
    fp8_flavour: ClassVar[str | None] = None
    """'e4m3fn' (OCP), 'e4m3fnuz' (MI300) or None."""
    has_streams: ClassVar[bool] = False
    """Whether streams/events exist on this device."""
    is_accelerator: ClassVar[bool] = True
    """False for CPU: auto-selection prefers any available accelerator."""
    supersedes: ClassVar[tuple[str, ...]] = ()
    """Backends this one refines (Hygon DCU over ROCm, MetaX over CUDA): when both probe
    available, this one wins."""
    runtime_names: ClassVar[tuple[str, ...]] = ()
    """Runtime names reported by runtime_versions(), e.g. ('cuda',)."""

    # --- probes (never raise) -----------------------------------------------------
    def probe(self) -> ProbeResult:
        """Available-or-reason. Never raises, whatever the hook does."""
        try:
            return self._probe()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            return ProbeResult.no(f"probe raised {type(exc).__name__}: {exc}")

    install_hint: ClassVar[str] = ""
    """How to install the extension module, appended to "<ext> is not installed"."""
    import_hint: ClassVar[str] = ""
    """The usual fix when the extension is installed but fails to import (library path …)."""
    visible_devices_env: ClassVar[str | None] = None
    """Environment variable that hides devices (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES …)."""

    def import_failure_hint(self, exc: BaseException) -> str:
        """Advice for an extension that is installed but fails to import; override to refine."""
        return f" ({self.import_hint})" if self.import_hint else ""

    def _probe(self) -> ProbeResult:
        """Default probe: import the extension, then ask ``torch.<module>.is_available()``.

        "Not installed" and "installed but broken" (vendor libraries missing from the loader
        path, torch/extension mismatch) need different fixes, so they get different reasons.
        """
        ext = self.extension_module
        if ext:
            if importlib.util.find_spec(ext) is None:
                return ProbeResult.no(f"{ext} is not installed" + (f" ({self.install_hint})" if self.install_hint else ""))
            try:
                importlib.import_module(ext)
            except Exception as exc:  # noqa: BLE001 - any import failure is a reason, never a crash
                return ProbeResult.no(f"{ext} is installed but failed to import: {type(exc).__name__}: {exc}"
                                      + self.import_failure_hint(exc))
        try:
            import torch
        except ImportError as exc:
            return ProbeResult.no(f"torch is not importable: {exc}")
        api = f"torch.{self.torch_module}"
        mod = getattr(torch, self.torch_module, None)
        if mod is None or not hasattr(mod, "is_available"):
            return ProbeResult.no(f"{ext} imported but {api} is missing (torch / {ext} version mismatch?)" if ext
                                  else f"torch has no {api} device API")
        if not mod.is_available():
            found = f": {ext} {module_version(ext) or '?'} found no device" if ext else ""
            checks = [c for c in (f"'{self.smi_tool}'" if self.smi_tool else "", "the driver", self.visible_devices_env) if c]
            return ProbeResult.no(f"{api}.is_available() is False{found} (check {', '.join(checks)})")
        count = int(mod.device_count())
        if count < 1:
            hides = f" ({self.visible_devices_env} hides every device?)" if self.visible_devices_env else ""
            return ProbeResult.no(f"{api}.device_count() is 0{hides}")
        return ProbeResult(True, "", count)

    # --- torch hooks ----------------------------------------------------------------
    def torch_api(self) -> Any:
        """The torch device module (torch.cuda, torch.npu, …)."""
        import torch

        if self.extension_module:
            importlib.import_module(self.extension_module)
        return getattr(torch, self.torch_module)

    def torch_device(self, index: int = 0) -> torch.device:
        """The torch device of device ``index`` (``cuda:0``, ``npu:0`` …)."""
        import torch

        return torch.device(self.device_type, index)

    def device_name(self, index: int = 0) -> str:
        """Product name as torch reports it."""
        api = self.torch_api()
        getter = getattr(api, "get_device_name", None)
        return str(getter(index)) if getter else self.display_name

    def synchronize(self, index: int = 0) -> None:
        """Wait for all queued work on the device."""
        self.torch_api().synchronize(index)

    def memory_stats(self, index: int = 0) -> dict[str, float]:
        """Allocator statistics in bytes where the backend reports them."""
        api = self.torch_api()
        out: dict[str, float] = {}
        for key in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
            fn = getattr(api, key, None)
            if fn is not None:
                try:
                    out[key] = float(fn(index))
                except Exception:  # noqa: BLE001 - stats are best effort
                    pass
        mem_get_info = getattr(api, "mem_get_info", None)
        if mem_get_info is not None:
            try:
                free, total = mem_get_info(index)
                out["free"], out["total"] = float(free), float(total)
            except Exception:  # noqa: BLE001
                pass
        return out

    def free_memory_bytes(self, index: int = 0) -> int | None:
        """Free device memory, for sizing work; None when unknown."""
        stats = self.memory_stats(index)
        return int(stats["free"]) if "free" in stats else None

    def empty_cache(self) -> None:
        """Return cached device memory to the driver (between benchmark rows); a no-op where there is none."""
        fn = getattr(self.torch_api(), "empty_cache", None)
        if fn is not None:
            fn()

    # --- vendor tool ----------------------------------------------------------------
    smi_command: ClassVar[tuple[str, ...]] = ()
    """Command whose output :meth:`parse_smi` understands."""
    tool_timeout_s: ClassVar[float] = 20.0
    """How long a vendor tool may take before it counts as hung."""

    @staticmethod
    def parse_smi(text: str) -> list[DeviceInfo]:
        """Turn the vendor tool's output into DeviceInfo rows. Pure; tested on recordings."""
        return []

    def inventory(self) -> tuple[list[DeviceInfo], str]:
        """Devices from the vendor tool (falling back to torch), and a note on where they came from."""
        note = ""
        if self.smi_command:
            out = run_tool(self.smi_command, self.tool_timeout_s)
            if out.ok:
                try:
                    devices = self.parse_smi(out.stdout)
                except Exception as exc:  # noqa: BLE001 - unknown output formats must not crash capture
                    devices, note = [], f"{self.smi_command[0]} output not understood: {type(exc).__name__}: {exc}"
                if devices:
                    return devices, f"from {' '.join(self.smi_command)}"
                note = note or f"{self.smi_command[0]} reported no devices"
            else:
                note = out.error
        return self._torch_inventory(), (note + "; " if note else "") + "from torch"

    def _torch_inventory(self) -> list[DeviceInfo]:
        """Minimal inventory from torch alone, used when the vendor tool is absent."""
        probe = self.probe()
        rows: list[DeviceInfo] = []
        for i in range(probe.device_count):
            try:
                props = self.torch_api().get_device_properties(i)
                mem = getattr(props, "total_memory", None)
                rows.append(DeviceInfo(index=i, name=str(getattr(props, "name", self.device_name(i))),
                                       vendor=self.vendor,
                                       memory_total_mib=(mem / 2**20) if mem else None))
            except Exception:  # noqa: BLE001
                rows.append(DeviceInfo(index=i, name=self.display_name, vendor=self.vendor))
        return rows

    def runtime_versions(self) -> dict[str, str | None]:
        """Versions of the vendor runtime(s) this torch was built against / finds installed."""
        return {}

    def build_archs(self) -> tuple[str | None, list[str]]:
        """The first device's architecture and those the torch build ships kernels for, in
        ``get_arch_list()`` form (``sm_90`` / ``gfx942``), read by the ``arch_supported`` rule;
        ``(None, [])`` where the backend has no such notion. May raise (the capture notes it)."""
        return None, []

    telemetry_extra: ClassVar[tuple[str, ...]] = ()
    """Numeric keys of ``DeviceInfo.extra`` that are live readings (clocks, error counters):
    :meth:`telemetry_sample` reports them beside the four common fields."""

    def telemetry_sample(self, index: int = 0) -> dict[str, float]:
        """One sample of device telemetry (memory, utilisation, temperature, power, and the
        backend's :attr:`telemetry_extra`) where readable."""
        devices, _ = self.inventory()
        for d in devices:
            if d.index == index:
                extra = {k: float(v) for k in self.telemetry_extra
                         if isinstance(v := d.extra.get(k), (int, float)) and not isinstance(v, bool)}
                return {k: v for k, v in {
                    "memory_used_mib": d.memory_used_mib, "temperature_c": d.temperature_c,
                    "power_w": d.power_w, "utilization_pct": d.utilization_pct}.items() if v is not None} | extra
        return {}

    def describe(self) -> dict[str, Any]:
        """Declared capabilities as plain data (``adaptcheck backends --format json``)."""
        return {
            "name": self.name, "display_name": self.display_name, "device_type": self.device_type,
            "torch_module": f"torch.{self.torch_module}", "extension_module": self.extension_module,
            "dist_backend": self.dist_backend, "collective_library": self.collective_library,
            "smi_tool": self.smi_tool, "dtypes": list(self.dtypes), "fp8_flavour": self.fp8_flavour,
            "has_streams": self.has_streams, "supersedes": list(self.supersedes),
        }


def env_flag(name: str) -> str | None:
    """Environment variable or None (small helper so probes read uniformly)."""
    value = os.environ.get(name)
    return value if value else None


@dataclass
class BackendInfo:
    """A discovered backend: the class (or why it failed to load) and where it came from."""

    name: str
    source: str
    cls: type[Backend] | None = None
    load_error: str = ""
