"""``adaptcheck ops``: the step-3 operators, their provider signatures, and which providers have them."""

from __future__ import annotations

from typing import TypedDict

import typer

from adaptcheck.cli.output import Format, Output
from adaptcheck.steps.ops.catalog import all_ops
from adaptcheck.steps.ops.providers.base import OpProvider
from adaptcheck.steps.ops.providers.registry import load_provider, provider_names


class OpListing(TypedDict):
    """One operator as ``adaptcheck ops --format json`` lists it."""

    op: str
    family: str
    signature: str
    dtypes: list[str]
    outputs: list[str]
    tolerance: list[str]
    providers: dict[str, bool]


def ops(fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml.")) -> None:
    """List operators with the signature providers implement and each provider's coverage."""
    out = Output(fmt)
    providers: dict[str, tuple[OpProvider | None, bool, str]] = {}
    for name in provider_names():
        try:
            provider = load_provider(name)
            ok, why = provider.available()
            providers[name] = (provider, ok, why)
        except Exception as exc:  # noqa: BLE001 - a broken provider is listed, not fatal
            providers[name] = (None, False, f"failed to load: {exc}")
    data: list[OpListing] = []
    for op in all_ops().values():
        have = {n: bool(p is not None and ok and p.get(op.name) is not None) for n, (p, ok, _) in providers.items()}
        data.append({"op": op.name, "family": op.family, "signature": op.signature, "dtypes": list(op.dtypes),
                     "outputs": list(op.outputs), "tolerance": list(op.tolerance), "providers": have})
    out.table("Operators", ["op", "family", "signature", *providers],
              [[d["op"], d["family"], d["signature"], *("yes" if d["providers"][n] else "-" for n in providers)]
               for d in data])
    for name, (_, ok, why) in providers.items():
        if not ok:
            out.info(f"provider {name}: not available ({why})")
    out.data(data)
