"""Exact collectives: what rank *r* of *n* puts in and exactly what it must get back, for
all-reduce, all-gather, reduce-scatter, all-to-all and broadcast — integer values sized per
dtype so every sum is exact and encoding source rank and index, compared with ``==``. Why this
catches every dropped, doubled, swapped or unwritten element: docs/cluster.md ("How
collectives are checked and timed", Exact values).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from adaptcheck.base.dtypes import CollectiveDtype, torch_dtype

if TYPE_CHECKING:
    import torch

# --- pure per-op arithmetic ---------------------------------------------------------------

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
"""The collectives checked, in the order they run (vLLM uses all five for TP/EP/PP)."""

EXACT_LIMIT: dict[str, int] = {
    # Largest L such that every integer in [0, L] is exactly representable: 2^(mantissa+1)
    # for floats, the positive maximum for signed integers.
    "fp32": 2**24,
    "bf16": 2**8,
    "fp16": 2**11,
    "int8": 2**7 - 1,
    "int32": 2**31 - 1,
    "int64": 2**63 - 1,
}

DEFAULT_DTYPES: tuple[CollectiveDtype, ...] = ("fp32", "bf16", "int32")
"""fp32 (integer-valued, exact below 2^24), bf16 (what vLLM all-reduces activations in), int32
(an integer path: libraries implement integer reductions with separate kernels)."""

SENTINEL = -1
"""Initial value of every output buffer: inputs are >= 1, so an unwritten element shows."""


def value_scale(dtype: str, world_size: int) -> int:
    """Distinct values per rank (K) such that the sum over all ranks stays exactly representable.

    Rank r holds ``r*K + (i mod K) + 1``; the largest possible sum over ranks is
    ``K * n(n+1)/2``, so ``K = floor(limit / (n(n+1)/2))``. 0 means the dtype cannot hold an
    exact n-rank sum of rank-distinct values (e.g. bf16 with 23+ ranks).
    """
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    return EXACT_LIMIT[dtype] // (world_size * (world_size + 1) // 2)


def broadcast_source(world_size: int) -> int:
    """The broadcast root: the last rank, so an implementation that ignores ``src`` (and
    sends rank 0's data) is caught — with root 0 that bug would pass."""
    return world_size - 1


def buffer_sizes(op: str, world_size: int, elements: int) -> tuple[int, int]:
    """(input numel, output numel) per rank. ``elements`` is the per-rank chunk size.

    all_reduce/broadcast work in place on ``elements``; all_gather turns ``elements`` into
    ``world_size*elements``; reduce_scatter the reverse; all_to_all sends one chunk of
    ``elements`` to each rank.
    """
    n = world_size * elements
    sizes = {"all_reduce": (elements, elements), "broadcast": (elements, elements),
             "all_gather": (elements, n), "reduce_scatter": (n, elements), "all_to_all": (n, n)}
    if op not in sizes:
        raise ValueError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
    return sizes[op]


def _pattern(rank: int, start: int, count: int, scale: int) -> torch.Tensor:
    """Elements ``[start, start+count)`` of rank ``rank``'s input, int64 on the CPU:
    ``rank*K + (i mod K) + 1`` (all >= 1, distinct per rank)."""
    import torch

    return rank * scale + torch.arange(start, start + count, dtype=torch.int64) % scale + 1


def _scale_or_raise(dtype: str, world_size: int) -> int:
    scale = value_scale(dtype, world_size)
    if scale < 1:
        raise ValueError(f"{dtype} cannot hold an exact {world_size}-rank sum of rank-distinct integers")
    return scale


def build_input(op: str, world_size: int, rank: int, elements: int, dtype: str) -> torch.Tensor:
    """Rank ``rank``'s input tensor for ``op`` (CPU; the caller moves it to the device)."""
    numel, _ = buffer_sizes(op, world_size, elements)
    return _pattern(rank, 0, numel, _scale_or_raise(dtype, world_size)).to(torch_dtype(dtype))


def expected_output(op: str, world_size: int, rank: int, elements: int, dtype: str) -> torch.Tensor:
    """Exactly what rank ``rank`` must hold after ``op`` (CPU), computed in int64 from the
    definition of the op — never by calling a collective.

    Only the slices of the other ranks' inputs that reach this rank are generated, so the
    memory is that of the output (all-to-all on 8 ranks would otherwise build 8 full inputs).
    """
    import torch

    buffer_sizes(op, world_size, elements)  # refuses unknown names
    scale = _scale_or_raise(dtype, world_size)
    ranks = range(world_size)
    mine = rank * elements  # where this rank's chunk starts in a world_size*elements buffer
    if op == "all_reduce":
        out = torch.zeros(elements, dtype=torch.int64)
        for r in ranks:
            out += _pattern(r, 0, elements, scale)
    elif op == "broadcast":
        out = _pattern(broadcast_source(world_size), 0, elements, scale)
    elif op == "all_gather":  # chunk r of the output is rank r's input
        out = torch.cat([_pattern(r, 0, elements, scale) for r in ranks])
    elif op == "reduce_scatter":  # the sum over ranks of chunk `rank` of their inputs
        out = torch.zeros(elements, dtype=torch.int64)
        for r in ranks:
            out += _pattern(r, mine, elements, scale)
    else:  # all_to_all: chunk r of the output is chunk `rank` of rank r's input
        out = torch.cat([_pattern(r, mine, elements, scale) for r in ranks])
    return out.to(torch_dtype(dtype))


def output_buffer(op: str, world_size: int, elements: int, dtype: str, device: Any = "cpu") -> torch.Tensor:
    """A fresh output buffer filled with :data:`SENTINEL`."""
    import torch

    _, numel = buffer_sizes(op, world_size, elements)
    return torch.full((numel,), SENTINEL, dtype=torch_dtype(dtype), device=device)


class Mismatch(TypedDict):
    """What :func:`compare` found: how many elements differ, the first of them and its values."""

    mismatches: int
    first_index: int | None
    got: int | float | str | None
    expected: int | float | str | None


def compare(got: torch.Tensor, expected: torch.Tensor) -> Mismatch:
    """Exact comparison: mismatch count, first wrong index and the values there.

    NaN never equals anything, so a NaN counts as wrong. A size or dtype difference is a
    mismatch of every element (reported, not raised: a collective that returns the wrong
    shape is a wrong result).
    """
    import torch

    if got.shape != expected.shape or got.dtype != expected.dtype:
        return {"mismatches": int(expected.numel()), "first_index": 0,
                "got": f"{tuple(got.shape)} {got.dtype}", "expected": f"{tuple(expected.shape)} {expected.dtype}"}
    wrong = (got.detach().cpu() != expected).reshape(-1)
    count = int(wrong.sum())
    if count == 0:
        return {"mismatches": 0, "first_index": None, "got": None, "expected": None}
    first = int(torch.nonzero(wrong)[0, 0])
    return {"mismatches": count, "first_index": first, "got": got.reshape(-1)[first].item(),
            "expected": expected.reshape(-1)[first].item()}


_UNSUPPORTED_RE = re.compile(r"not (yet )?(supported|implemented)|does not support|doesn't support|unsupported",
                             re.IGNORECASE)


def classify_exception(exc: BaseException) -> Literal["unsupported", "raised"]:
    """``unsupported`` when the library says it lacks the op/dtype, else ``raised``."""
    if isinstance(exc, NotImplementedError) or _UNSUPPORTED_RE.search(str(exc)):
        return "unsupported"
    return "raised"
