"""Collective bandwidths as nccl-tests define them (algbw over the full tensor, busbw with the
per-op bus factor, ``t`` the slowest rank's median) and the micro-benchmark rows they become.
Definitions: docs/cluster.md ("How collectives are checked and timed", Timing).
"""

from __future__ import annotations

from adaptcheck.base.schemas.micro_evidence import MicroRow
from adaptcheck.perf.micro import make_row
from adaptcheck.perf.peaks import Peak, efficiency
from adaptcheck.perf.timing import Timing

BUS_FACTOR_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor."""
    n = world_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; valid: {', '.join(BUS_FACTOR_OPS)}")


def chunks_in_full_tensor(op: str, world_size: int) -> int:
    """How many per-rank chunks make up ``S``: the full tensor is ``world_size`` chunks for
    all-gather (output), reduce-scatter (input) and all-to-all; one for the others."""
    return world_size if op in ("all_gather", "reduce_scatter", "all_to_all") else 1


def elements_for_bytes(op: str, world_size: int, size_bytes: int, itemsize: int) -> int:
    """Per-rank chunk size (elements) whose full tensor is at most ``size_bytes`` (≥ 1)."""
    return max(1, size_bytes // (itemsize * chunks_in_full_tensor(op, world_size)))


def full_tensor_bytes(op: str, world_size: int, elements: int, itemsize: int) -> int:
    """``S`` of nccl-tests for a per-rank chunk of ``elements``."""
    return elements * itemsize * chunks_in_full_tensor(op, world_size)


def collective_row(op: str, dtype: str, world_size: int, elements: int, itemsize: int, timing: Timing,
                   peak: Peak | None, *, rank_medians: list[float] | None = None) -> MicroRow:
    """One contract row: ``bytes`` = S, ``achieved.bytes_per_s`` = algbw, efficiency = busbw /
    the interconnect, bound ``network``; ``extra`` holds algbw, busbw, world size and op."""
    size = full_tensor_bytes(op, world_size, elements, itemsize)
    row = make_row(f"{op} {size / (1 << 20):g} MiB" if size >= 1 << 20 else f"{op} {size} B", dtype,
                   {"op": op, "world_size": world_size, "elements_per_rank": elements, "bytes": size},
                   None, float(size), timing, peak, bound="network")
    algbw = row.achieved.bytes_per_s
    busbw = algbw * busbw_factor(op, world_size) if algbw is not None else None
    row.efficiency = efficiency("network", peak, dtype, None, busbw)
    row.ridge_point = None  # a FLOP/byte ridge means nothing for a transfer
    extra = row.extra
    extra.algbw, extra.busbw, extra.world_size, extra.op = algbw, busbw, world_size, op
    extra.busbw_factor = busbw_factor(op, world_size)
    if rank_medians is not None:
        extra.rank_median_s = rank_medians
    return row
