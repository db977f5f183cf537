"""``adaptcheck env``: print the captured compatibility matrix of this machine."""

from __future__ import annotations

import typer

from adaptcheck.backends.registry import select_backend
from adaptcheck.cli.output import Format, Output


def env(
    device: str | None = typer.Option(None, "--device", "-d", help="Backend to describe (default: auto-selected)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml."),
) -> None:
    """Capture and print the compatibility matrix (secrets redacted)."""
    from adaptcheck.steps.matrix.capture import (
        capture_environment,  # imports torch: only when asked
    )

    out = Output(fmt)
    backend, _ = select_backend(device)
    environment = capture_environment(backend, None)
    data = environment.model_dump(mode="json")
    if out.machine:
        out.data(data)
        return
    scalar = [[k, "not present" + (f" ({environment.notes[k]})" if k in environment.notes else "") if v is None else v]
              for k, v in data.items() if not isinstance(v, (dict, list))]
    out.table("Machine", ["field", "value"], scalar)
    out.table("Accelerators", ["#", "name", "memory MiB", "driver", "firmware", "bus"],
              [[d.index, d.name, f"{d.memory_total_mib:.0f}" if d.memory_total_mib else None, d.driver_version,
                d.firmware_version, d.bus_id] for d in environment.accelerators])
    for key in ("runtimes", "torch_device_extension", "packages", "tools", "env_vars", "notes"):
        mapping = data.get(key) or {}
        if mapping:
            out.table(key, ["name", "value"], [[k, "not present" if v is None else v] for k, v in mapping.items()])
    if environment.vllm_plugins:
        out.table("vLLM plugins", ["group", "name", "distribution", "version", "allowed"],
                  [[p.group, p.name, p.distribution, p.distribution_version, p.allowed] for p in environment.vllm_plugins])
