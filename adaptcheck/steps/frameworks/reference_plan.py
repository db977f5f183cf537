"""How the CPU reference runs within its memory budget: in memory, streamed a layer at a time,
or not at all; and whether it can afford to generate (docs/reference-at-scale.md).

The budget is ``--reference-memory`` (``CheckContext.reference_memory``), by default half of the
host's free memory. The reference is float64 wherever it can be: in memory when the whole model
fits the budget in float64; else streamed (:mod:`adaptcheck.steps.frameworks.streaming`) in
float64 when the always-resident parts plus one layer fit, else in float32; else
:class:`ReferenceUnavailable` with the size it needs. Where greedy generation on the CPU would
take longer than :data:`GENERATE_BUDGET_S`, the device generates and the reference scores the
device's sequences instead (``framework.reference``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from adaptcheck.base.dtypes import ITEMSIZE, itemsize
from adaptcheck.base.errors import exception_line
from adaptcheck.frameworks.base import FrameworkError, GenRequest
from adaptcheck.frameworks.modelsrc import ResolvedModel

BYTES_PER_PARAM = {dtype: ITEMSIZE[dtype] for dtype in ("fp64", "fp32", "bf16", "fp16")}
MEMORY_FRACTION = 0.5
"""Share of available host memory the reference may take by default (activations, the device
framework and the OS need the rest)."""
REFERENCE_DTYPES = ("fp64", "fp32")
"""The reference's dtypes, best first."""
REFERENCE_BYTES_PER_S = 5.0e9
"""Weight bytes (at the reference's dtype) a decode step of the CPU reference reads per second
from memory: float64 GEMV is memory-bound. benchmarks/streamed_reference.py measured 10-11.5e9
on a 2-core EPYC (SmolLM2-135M in memory); half of it, so the estimate errs towards slow."""
STREAM_BYTES_PER_S = 1.5e9
"""Bytes of streamed layers (at the reference's dtype) loaded per second: read from the
safetensors file and converted. The same benchmark measured ~2.1e9 all in (27 MiB per SmolLM2
layer in ~14 ms, from the page cache); a cold disk is slower."""
GENERATE_BUDGET_S = 600.0
"""Longest the reference may spend generating greedily (estimated); past it the device
generates and the reference scores the device's sequences, one forward pass each."""

GenerationMode = Literal["reference generates", "device generates, reference scores"]


class ReferenceUnavailable(FrameworkError):
    """No CPU reference can be computed here (the model does not fit the reference's memory)."""


def parameter_count(model: ResolvedModel) -> int:
    """Parameters, from the synthetic metadata or from the weights' size and stored dtype."""
    if model.synthetic and model.synthetic.get("num_params"):
        return int(model.synthetic["num_params"])
    return int(model.weights_bytes / (itemsize(str(model.torch_dtype)) or 2))  # unknown: a 16-bit checkpoint


def _available_bytes() -> float | None:
    """Host memory available now: the CPU backend's own reading (the reference runs there)."""
    from adaptcheck.backends.cpu import CpuBackend

    return CpuBackend().memory_stats().get("free")


def memory_budget(reference_memory: int | None) -> int | None:
    """Bytes the reference may hold: ``--reference-memory``, else half of the free memory (None: unknown)."""
    if reference_memory is not None:
        return int(reference_memory)
    free = _available_bytes()
    return None if free is None else int(MEMORY_FRACTION * free)


def gib(n: float) -> str:
    """Bytes in words: MiB below a GiB, GiB above."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _flag(n: int) -> str:
    """A ``--reference-memory`` value of at least ``n`` bytes."""
    return f"--reference-memory {math.ceil(n / 2**20)}M"


@dataclass(frozen=True)
class Layout:
    """Parameter counts of a model as transformers builds it: outside the layers and per layer."""

    resident_params: int
    layer_params: tuple[int, ...]
    layer_stored_bytes: tuple[int, ...]
    """Checkpoint bytes of each layer (what one load reads from disk)."""
    layer_merged_params: tuple[int, ...] = ()
    """Elements of each layer built by merging checkpoint tensors (fused MoE experts)."""

    def total(self, dtype: str) -> int:
        return (self.resident_params + sum(self.layer_params)) * BYTES_PER_PARAM[dtype]

    def resident(self, dtype: str) -> int:
        return self.resident_params * BYTES_PER_PARAM[dtype]

    def layer(self, dtype: str) -> int:
        return max(self.layer_params, default=0) * BYTES_PER_PARAM[dtype]

    def transient(self, dtype: str) -> int:
        """Bytes a layer's load holds beside the layer itself, at most: its tensors as read from
        disk (the loader reads them all before converting) and, where experts are merged, the
        converted parts beside the merged copy."""
        merged = self.layer_merged_params or (0,) * len(self.layer_stored_bytes)
        return max((s + m * BYTES_PER_PARAM[dtype] for s, m in zip(self.layer_stored_bytes, merged, strict=True)),
                   default=0)


@functools.lru_cache(maxsize=16)
def _layout(folder: str) -> Layout:
    from adaptcheck.steps.frameworks import streaming as st

    index: st.CheckpointIndex | None = None
    try:
        index = st.CheckpointIndex(Path(folder))
        meta = st.build_meta(Path(folder), "fp32", index)
        stored = tuple(sum(index.stored_bytes(k) for k in keys) for keys in meta.layer_keys)
    except st.StreamUnsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable weights, an architecture transformers cannot build on meta
        raise st.StreamUnsupported(f"cannot lay it out for streaming: {exception_line(exc)}") from None
    finally:
        if index is not None:
            index.close()
    # from_pretrained ties the tied weights (lm_head to the embeddings) after loading; tie them
    # here so a tied tensor is counted once.
    with contextlib.suppress(Exception):
        meta.model.tie_weights()
    layers = tuple(st.weight_count(layer) for layer in meta.layers)
    return Layout(resident_params=st.weight_count(meta.model) - sum(layers), layer_params=layers,
                  layer_stored_bytes=stored, layer_merged_params=tuple(meta.layer_merged))


def model_layout(folder: Path) -> Layout:
    """The model's :class:`Layout` (cached per folder); StreamUnsupported when it cannot stream."""
    from adaptcheck.steps.frameworks import streaming as st

    layout = _layout(str(folder))
    if not layout.layer_params:
        raise st.StreamUnsupported("no decoder layers found")
    return layout


@dataclass(frozen=True)
class Plan:
    """How the reference (or the control) will run."""

    mode: Literal["in_memory", "streamed"]
    dtype: str
    budget: int | None
    need: int
    """Weight bytes it will hold at most (streamed: resident parts + held layers + one layer's load)."""
    layers: int | None = None
    held_layers: int | None = None
    """Streamed: layers held at once."""
    weights: int = 0
    """Bytes of the whole model at ``dtype`` (what one forward touches)."""
    layer_bytes: int = 0
    """Streamed: bytes of the largest layer at ``dtype`` (what one load converts)."""
    note: str = ""

    def describe(self) -> str:
        if self.mode == "in_memory":
            return f"{self.dtype} in memory ({gib(self.need)})"
        return (f"{self.dtype} streamed a layer at a time ({self.held_layers} of {self.layers} layers held, "
                f"at most {gib(self.need)} of a {gib(self.budget or 0)} budget)")


def plan_for(folder: Path, params: int, budget: int | None, dtypes: tuple[str, ...]) -> Plan:
    """The first of ``dtypes`` that runs within ``budget``: in memory if the whole model fits at
    the first dtype, else streamed at the first dtype one layer of which fits; ReferenceUnavailable
    when none does."""
    from adaptcheck.steps.frameworks.streaming import StreamUnsupported

    def whole(dtype: str) -> int:
        return params * BYTES_PER_PARAM[dtype]

    # No model inspection when the whole model fits: today's in-memory path, at no extra cost.
    if budget is None or whole(dtypes[0]) <= budget:
        return Plan("in_memory", dtypes[0], budget, whole(dtypes[0]), weights=whole(dtypes[0]))
    try:
        layout = model_layout(folder)
    except StreamUnsupported as exc:
        # Not streamable here: today's rule, the first dtype whose whole model fits.
        for dtype in dtypes[1:]:
            if whole(dtype) <= budget:
                return Plan("in_memory", dtype, budget, whole(dtype), weights=whole(dtype), note=str(exc))
        raise ReferenceUnavailable(f"the {dtypes[-1]} CPU reference needs {gib(whole(dtypes[-1]))} in memory and "
                                   f"cannot stream ({exc}); it may hold {gib(budget)}: pass "
                                   f"{_flag(whole(dtypes[-1]))}") from None
    total = layout.total
    if total(dtypes[0]) <= budget:  # the size estimate from the files was high: the exact count fits
        return Plan("in_memory", dtypes[0], budget, total(dtypes[0]), weights=total(dtypes[0]))
    n = len(layout.layer_params)
    for dtype in dtypes:
        resident, layer, transient = layout.resident(dtype), layout.layer(dtype), layout.transient(dtype)
        if resident + layer + transient <= budget:
            held = min(n, (budget - resident - transient) // max(1, layer))
            need = resident + held * layer + transient
            return Plan("streamed", dtype, budget, need, layers=n, held_layers=held, weights=total(dtype),
                        layer_bytes=layer)
    last = dtypes[-1]
    need = layout.resident(last) + layout.layer(last) + layout.transient(last)
    raise ReferenceUnavailable(
        f"a streamed {last} CPU reference needs {gib(need)} ({gib(layout.resident(last))} always held + one layer "
        f"of {gib(layout.layer(last))} + {gib(layout.transient(last))} while it loads); it may hold {gib(budget)}: "
        f"pass {_flag(need)} or more")


def reference_plan(model: ResolvedModel, reference_memory: int | None, dtypes: tuple[str, ...] = REFERENCE_DTYPES,
                   folder: Path | None = None) -> Plan:
    """The reference's plan for ``model`` under ``--reference-memory`` (None: the default budget)."""
    return plan_for(folder or reference_path(model), parameter_count(model), memory_budget(reference_memory), dtypes)


@dataclass(frozen=True)
class GenerationEstimate:
    """Whether the reference generates, and the estimate that decided it."""

    mode: GenerationMode
    seconds: float
    tokens: int
    bytes_per_token: int
    """Weight bytes one decode step reads from memory."""
    streamed_per_token: int
    """Bytes of layers one decode step loads from the checkpoint (streamed only)."""

    def describe(self) -> str:
        streamed = f" + {gib(self.streamed_per_token)} loaded" if self.streamed_per_token else ""
        return (f"{self.mode}: generating {self.tokens} tokens on the CPU reference would take ~{self.seconds:.0f} s "
                f"({gib(self.bytes_per_token)} read{streamed} per token; budget {GENERATE_BUDGET_S:g} s)")


def generation_estimate(plan: Plan, requests: list[GenRequest]) -> GenerationEstimate:
    """CPU greedy generation's time: per generated token, every weight read once at
    :data:`REFERENCE_BYTES_PER_S` and, streamed, every layer not held loaded at
    :data:`STREAM_BYTES_PER_S`; times the tokens to generate (the requests' ``max_tokens``)."""
    streamed = 0
    if plan.mode == "streamed" and plan.layers:
        held = plan.held_layers or 1
        streamed = (plan.layers - (held - 1 if held < plan.layers else plan.layers)) * plan.layer_bytes
    tokens = sum(r.max_tokens for r in requests)
    seconds = tokens * (plan.weights / REFERENCE_BYTES_PER_S + streamed / STREAM_BYTES_PER_S)
    mode: GenerationMode = ("reference generates" if seconds <= GENERATE_BUDGET_S
                            else "device generates, reference scores")
    return GenerationEstimate(mode=mode, seconds=seconds, tokens=tokens, bytes_per_token=plan.weights,
                              streamed_per_token=streamed)


def reference_path(model: ResolvedModel) -> Path:
    """The folder the reference loads: the model's own, or for a quantized embedded variant the
    subfolder with its exact dequantized weights (``reference_folder`` in its metadata)."""
    sub = model.synthetic.get("reference_folder") if model.synthetic else None
    return model.path / sub if isinstance(sub, str) and sub else model.path
