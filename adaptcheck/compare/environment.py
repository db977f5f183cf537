"""Environment changes: which package, driver, runtime, device or ladder differs between two runs;
live readings and tool paths are left out (docs/compare.md, "Environment changes").
"""

from __future__ import annotations

from typing import Any, Literal

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compare.model import EnvChange

# Environment fields compared as one value each (the dict-valued ones are expanded below).
_SCALARS = ("hostname", "os", "kernel", "arch", "cpu_model", "cpu_count", "memory_total_gib", "python",
            "python_executable", "torch", "driver_version", "firmware_version", "vllm_plugins_filter")
_MAPPINGS = ("runtimes", "torch_device_extension", "packages", "env_vars")
# Per accelerator: its identity and the software on it, not its live readings.
_DEVICE_FIELDS = ("name", "memory_total_mib", "driver_version", "firmware_version")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _environment(env: Environment) -> dict[str, str | None]:
    flat: dict[str, str | None] = {name: _text(getattr(env, name)) for name in _SCALARS}
    for name in _MAPPINGS:
        for key, value in getattr(env, name).items():
            flat[f"{name}.{key}"] = _text(value)
    flat["accelerators (count)"] = str(len(env.accelerators))
    for dev in env.accelerators:
        for name in _DEVICE_FIELDS:
            flat[f"accelerators[{dev.index}].{name}"] = _text(getattr(dev, name))
    for plugin in env.vllm_plugins:
        version = f"{plugin.distribution or '?'} {plugin.distribution_version or '?'}"
        flat[f"vllm_plugins.{plugin.group}:{plugin.name}"] = version + ("" if plugin.allowed else " (not allowed)")
    return flat


def flatten(results: RunResults, stack: bool = True) -> dict[str, str | None]:
    """Everything about a run's stack that a comparison reports changes of; ``stack=False``
    leaves out the captured environment's fields (compared only when both runs have one)."""
    flat: dict[str, str | None] = {
        "adaptcheck": results.adaptcheck_version,
        "ladder": f"{results.ladder.id} {results.ladder.version}",
        "ladder sha256": results.ladder.sha256,
        "model": results.model.name,
        "model precision": results.model.precision,
        "model revision": results.model.revision,
        "model context_length": str(results.model.context_length),
        "seed": str(results.seed),
        "device backend": results.device.backend,
        "device name": results.device.device_name,
        "device count": str(results.device.device_count),
        "environment": "captured" if results.environment is not None else None,
    }
    if stack and results.environment is not None:
        flat.update(_environment(results.environment))
    return flat


def compare_environment(baseline: RunResults, new: RunResults) -> list[EnvChange]:
    """Every difference, in the order the keys first appear (run facts, then the stack)."""
    # One run without a captured environment (step 1 not run): say so once, instead of
    # listing every package as added or removed.
    both = baseline.environment is not None and new.environment is not None
    a, b = flatten(baseline, both), flatten(new, both)
    changes: list[EnvChange] = []
    for key in dict.fromkeys([*a, *b]):
        before, after = a.get(key), b.get(key)
        if before == after:
            continue
        kind: Literal["changed", "added", "removed"] = (
            "added" if before is None else "removed" if after is None else "changed")
        changes.append(EnvChange(what=key, before=before, after=after, change=kind))
    return changes
