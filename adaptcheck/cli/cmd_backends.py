"""``adaptcheck backends``: every backend (built-in and plugin) with its probe result."""

from __future__ import annotations

import typer

from adaptcheck.backends.registry import probe_all
from adaptcheck.cli.output import Format, Output


def backends(fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml.")) -> None:
    """List backends, whether each is available here, and why not."""
    out = Output(fmt)
    rows, data = [], []
    for info, probe in probe_all():
        declared = info.cls().describe() if info.cls is not None else {}
        data.append({"name": info.name, "source": info.source, "available": probe.available,
                     "device_count": probe.device_count, "reason": probe.reason, "load_error": info.load_error or None,
                     **declared})
        rows.append([info.name, declared.get("display_name", "?"), info.source,
                     "yes" if probe.available else "no", probe.device_count if probe.available else "-",
                     probe.reason or ""])
    out.table("Backends", ["name", "backend", "from", "available", "devices", "reason"], rows,
              styles={3: {"yes": "green", "no": "dim"}})
    out.data(data)
