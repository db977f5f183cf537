"""Every operator step 3 knows, collected from the family modules.

Unknown names are answered with "did you mean …". The catalog is also the documented list
of op names and signatures that providers implement (``adaptcheck ops`` prints it).
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from adaptcheck.errors import UnknownNameError, did_you_mean
from adaptcheck.steps.ops.opdef import OpDef

FAMILIES = ("gemm", "norms", "activations", "rope", "attention", "moe", "quant", "sampling", "embedding")
"""Modules under adaptcheck.steps.ops.families, each exporting ``OPS: list[OpDef]``."""


@lru_cache(maxsize=1)
def all_ops() -> dict[str, OpDef]:
    """Name → OpDef for every family that is present."""
    ops: dict[str, OpDef] = {}
    for family in FAMILIES:
        try:
            module = importlib.import_module(f"adaptcheck.steps.ops.families.{family}")
        except ModuleNotFoundError as exc:
            if exc.name == f"adaptcheck.steps.ops.families.{family}":
                continue
            raise
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
