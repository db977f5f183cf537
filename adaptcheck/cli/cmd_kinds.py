"""``adaptcheck kinds``: the registered check kinds usable in ladder YAML."""

from __future__ import annotations

from typing import Any

import typer

from adaptcheck.cli.output import Format, Output
from adaptcheck.ladder.registry import get_check_class, kind_names


def kinds(fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml.")) -> None:
    """List check kinds with their step and parameters."""
    out = Output(fmt)
    data: list[dict[str, Any]] = []
    for name in kind_names():
        try:
            cls = get_check_class(name)
            data.append({"kind": name, "step": cls.step or "any", "description": cls.description,
                         "params": sorted(cls.params_model.model_fields)})
        except Exception as exc:  # noqa: BLE001 - a broken plugin kind is listed, not fatal
            data.append({"kind": name, "step": "?", "description": f"failed to load: {exc}", "params": []})
    out.table("Check kinds", ["kind", "step", "params", "description"],
              [[d["kind"], d["step"], ", ".join(d["params"]), d["description"]] for d in data])
    out.data(data)
