"""``adaptcheck frameworks``: the inference framework adapters of step 4, and whether each is usable here."""

from __future__ import annotations

from typing import TypedDict

import typer

from adaptcheck.cli.output import Format, Output
from adaptcheck.frameworks.registry import framework_class, framework_names


class _AdapterRow(TypedDict):
    """One adapter as listed (the JSON/YAML document is a list of these)."""

    name: str
    display_name: str
    available: bool
    version: str | None
    reason: str
    capabilities: list[str]


def frameworks(fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml.")) -> None:
    """List framework adapters (built-in and plugins), whether each is available here, and why not."""
    out = Output(fmt)
    data: list[_AdapterRow] = []
    for name in framework_names():
        try:
            cls = framework_class(name)
            avail = cls.availability()
            data.append({"name": name, "display_name": cls.display_name, "available": avail.available,
                         "version": avail.version, "reason": avail.reason,
                         "capabilities": [c for c in ("supports_stream", "supports_prefix_caching",
                                                      "supports_compile_toggle", "supports_tensor_parallel")
                                          if getattr(cls, c, False)]})
        except Exception as exc:  # noqa: BLE001 - a broken plugin is listed, not fatal
            data.append({"name": name, "display_name": "?", "available": False, "version": None,
                         "reason": f"failed to load: {exc}", "capabilities": []})
    out.table("Frameworks", ["name", "framework", "available", "version", "reason"],
              [[d["name"], d["display_name"], "yes" if d["available"] else "no", d["version"] or "", d["reason"]]
               for d in data], styles={2: {"yes": "green", "no": "dim"}})
    out.data(data)
