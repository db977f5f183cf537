"""``adaptcheck env``: print the captured compatibility matrix of this machine, and with
``--check`` every compatibility rule's verdict and what to change (exit 1 when a rule finds
the stack incompatible)."""

from __future__ import annotations

from collections.abc import Mapping

import typer

from adaptcheck.backends.registry import select_backend
from adaptcheck.base.schemas.environment import Environment
from adaptcheck.cli.output import Format, Output
from adaptcheck.compat.assess import Assessment


def env(
    device: str | None = typer.Option(None, "--device", "-d", help="Backend to describe (default: auto-selected)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml."),
    check: bool = typer.Option(False, "--check", help="Also check the stack against matrices/ (rules and known-good "
                               "stacks, $ADAPTCHECK_KNOWN_GOOD included) and print what to change; exit 1 when a "
                               "rule finds it incompatible."),
) -> None:
    """Capture and print the compatibility matrix (secrets redacted)."""
    from adaptcheck.compat.assess import assess
    from adaptcheck.steps.matrix.capture import (
        capture_environment,  # imports torch: only when asked
    )

    out = Output(fmt)
    backend, _ = select_backend(device)
    environment = capture_environment(backend, None)
    assessment = assess(environment) if check else None
    if out.machine:
        data = environment.model_dump(mode="json")
        out.data({**data, "assessment": assessment.report().dump()} if assessment else data)
    else:
        _tables(out, environment)
    if assessment is not None:
        if not out.machine:
            _assessment(out, assessment)
        if assessment.incompatible:
            raise typer.Exit(1)


def _tables(out: Output, environment: Environment) -> None:
    scalar = [[k, "not present" + (f" ({environment.notes[k]})" if k in environment.notes else "") if v is None else v]
              for k, v in environment.model_dump(mode="json").items() if not isinstance(v, (dict, list))]
    out.table("Machine", ["field", "value"], scalar)
    out.table("Accelerators", ["#", "name", "memory MiB", "driver", "firmware", "bus"],
              [[d.index, d.name, f"{d.memory_total_mib:.0f}" if d.memory_total_mib else None, d.driver_version,
                d.firmware_version, d.bus_id] for d in environment.accelerators])
    mappings: tuple[tuple[str, Mapping[str, str | None]], ...] = (
        ("runtimes", environment.runtimes), ("torch_device_extension", environment.torch_device_extension),
        ("packages", environment.packages), ("tools", environment.tools), ("env_vars", environment.env_vars),
        ("notes", environment.notes))
    for key, mapping in mappings:
        if mapping:
            out.table(key, ["name", "value"], [[k, "not present" if v is None else v] for k, v in mapping.items()])
    if environment.vllm_plugins:
        out.table("vLLM plugins", ["group", "name", "distribution", "version", "allowed"],
                  [[p.group, p.name, p.distribution, p.distribution_version, p.allowed] for p in environment.vllm_plugins])


def _assessment(out: Output, a: Assessment) -> None:
    out.table("Compatibility rules", ["rule", "verdict", "message"],
              [[v.rule_id, "error" if v.error else v.verdict, v.message] for v in a.verdicts
               if v.verdict != "not_applicable" or v.error])
    kg = a.known_good
    if kg.matched and kg.entry is not None:
        out.info(f"known-good: matches {kg.entry.id!r} ({kg.entry.basis}, {kg.entry.date}; {kg.entry.source})")
    for line in a.advice():
        out.info(f"to fix: {line}")
