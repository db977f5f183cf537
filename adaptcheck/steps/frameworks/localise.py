"""Name the first module whose output departs from the float64 reference (forward hooks).

When an in-process framework fails the teacher-forced comparison, one token sequence is run
on the device framework, the float64 reference and the CPU control with hooks on every named
module, and the first tensor whose error exceeds its bound relative to the control's is the
localisation (method: docs/step4-numerics.md, "Localisation").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from adaptcheck.base.schemas.framework_evidence import Localisation, ModuleError
from adaptcheck.base.schemas.numerics import Rule
from adaptcheck.frameworks.base import Framework, ScoreRequest

MAX_TABLE = 40
"""Rows of the per-module table kept in the results (the first departure is among them)."""


@dataclass
class Event:
    """One recorded tensor: module name, 'input' or 'output', and its value (float64, CPU)."""

    module: str
    where: str
    value: Any


def _first_tensor(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        return next((t for t in (_first_tensor(v) for v in x) if t is not None), None)
    if hasattr(x, "to_tuple"):  # transformers ModelOutput
        return _first_tensor(x.to_tuple())
    return None


@contextlib.contextmanager
def recording(model: Any) -> Iterator[list[Event]]:
    """Record every named module's first input and output while the block runs."""
    events: list[Event] = []
    handles = []

    def grab(name: str, where: str, value: Any) -> None:
        t = _first_tensor(value)
        if t is not None and t.is_floating_point():
            events.append(Event(name, where, t.detach().to("cpu").double()))

    for name, module in model.named_modules():
        if not name:
            continue  # the whole model: its output is the logits, already compared
        handles.append(module.register_forward_pre_hook(lambda m, a, n=name: grab(n, "input", a)))
        handles.append(module.register_forward_hook(lambda m, a, o, n=name: grab(n, "output", o)))
    try:
        yield events
    finally:
        for h in handles:
            h.remove()


def trace(fw: Framework, seq: ScoreRequest) -> list[Event]:
    """The module events of one teacher-forced pass of ``fw`` over ``seq``."""
    model = fw.torch_model()
    if model is None:
        raise ValueError(f"{fw.display_name} runs no model in this process")
    with recording(model) as events:
        fw.score([seq])
    return events


def _error(a: Any, ref: Any) -> float | None:
    if a.shape != ref.shape:
        return None
    denom = float(ref.norm())
    return float((a - ref).norm()) / denom if denom > 0 else float((a - ref).norm())


def _keyed(events: list[Event]) -> dict[tuple[str, str, int], Event]:
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for e in events:
        k = (e.module, e.where)
        seen[k] = seen.get(k, 0) + 1
        out[(e.module, e.where, seen[k])] = e
    return out


def first_departure(device: list[Event], reference: list[Event], control: list[Event], rule: Rule,
                    dtype: str) -> Localisation:
    """Compare the three recordings; the first device tensor beyond its bound, and a table."""
    ref, ctl = _keyed(reference), _keyed(control)
    table: list[ModuleError] = []
    found: ModuleError | None = None
    seen: dict[tuple[str, str], int] = {}
    for e in device:
        k = (e.module, e.where)
        seen[k] = seen.get(k, 0) + 1
        key = (e.module, e.where, seen[k])
        if key not in ref or key not in ctl:
            continue
        err, cerr = _error(e.value, ref[key].value), _error(ctl[key].value, ref[key].value)
        if err is None or cerr is None:
            continue
        bound = rule.bound(cerr, dtype)
        row = ModuleError(module=e.module, where=e.where, error=err, control=cerr, bound=bound, departs=err > bound)
        if row.departs and found is None:
            found = row
        table.append(row)
    if found is None:
        return Localisation(module=None, reason="no module's hidden state departs beyond its bound: the difference "
                            "builds up gradually or lies in the final projection", table=table[:MAX_TABLE])
    # Keep the rows that lead up to the departure and a few after it.
    at = table.index(found)
    return Localisation(**found.model_dump(), reason=None, table=table[max(0, at - MAX_TABLE + 6): at + 6])


def describe(found: Localisation) -> str:
    """One line: 'model.layers.0.mlp.act_fn output: normalized error 0.071, control 0.004 (bound 0.032)'."""
    if found.module is None:
        return str(found.reason or "not localised")
    return (f"{found.module} {found.where}: normalized error {found.error:.3g}, control {found.control:.3g} "
            f"(bound {found.bound:.3g})")
