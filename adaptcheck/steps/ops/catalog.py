"""Every operator step 3 knows, collected from the family modules: the documented list of op
names and signatures providers implement (``adaptcheck ops`` prints it; docs/ops.md), with
"did you mean …" for unknown names.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from functools import lru_cache
from types import ModuleType

from adaptcheck.base.errors import UnknownNameError, did_you_mean
from adaptcheck.steps.ops.opdef import OpDef

FAMILIES = ("gemm", "norms", "activations", "rope", "attention", "moe", "quant", "sampling", "embedding",
            "mla", "mamba", "vision", "quant_weight")
"""Modules under adaptcheck.steps.ops.families, each exporting ``OPS: list[OpDef]``."""


def family_modules(package: str) -> Iterator[ModuleType]:
    """The module of each family under ``package``, skipping absent ones."""
    for family in FAMILIES:
        name = f"{package}.{family}"
        try:
            yield importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a missing dependency inside the module is a real error
                raise


@lru_cache(maxsize=1)
def all_ops() -> dict[str, OpDef]:
    """Name → OpDef for every family that is present."""
    ops: dict[str, OpDef] = {}
    for module in family_modules("adaptcheck.steps.ops.families"):
        for op in module.OPS:
            if op.name in ops:
                raise ValueError(f"op {op.name!r} defined twice")
            ops[op.name] = op
    return ops


def get_op(name: str) -> OpDef:
    """The OpDef of ``name`` or UnknownNameError with suggestions."""
    ops = all_ops()
    if name not in ops:
        raise UnknownNameError(f"unknown op {name!r}", hint=did_you_mean(name, list(ops)))
    return ops[name]
