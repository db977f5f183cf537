"""Real results of two same-machine runs (tests/compare/data/README.md) and ways to plant changes in them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptcheck.models.results import CheckResult, RunResults

DATA = Path(__file__).resolve().parent / "data"
BASELINE = DATA / "baseline.json"
RERUN = DATA / "rerun.json"
GEMM_ROW = ("perf.gemm", "prefill m=2048 n=4096 k=4096", "bf16")
SERVING_LEVEL = ("perf.serving.concurrent_short", 4)


def load_pair() -> tuple[RunResults, RunResults]:
    """(baseline, rerun), fresh objects each call so a test may change them freely."""
    return RunResults.load(BASELINE), RunResults.load(RERUN)


def check(results: RunResults, check_id: str) -> CheckResult:
    return next(c for c in results.checks if c.id == check_id)


def gemm_row(results: RunResults) -> dict[str, Any]:
    cid, name, dtype = GEMM_ROW
    return next(r for r in check(results, cid).details["rows"] if r["name"] == name and r["dtype"] == dtype)


def scale_row_time(row: dict[str, Any], factor: float) -> None:
    """Every time statistic of a micro row × factor (the relative spread stays what it was)."""
    for key in ("median", "min", "p10", "p90", "mean"):
        row["time_s"][key] *= factor


def serving_level(results: RunResults, check_id: str = SERVING_LEVEL[0], level: float = SERVING_LEVEL[1]) -> dict[str, Any]:
    return next(lv for lv in check(results, check_id).details["levels"] if lv["level"] == level)


def scale_serving(level: dict[str, Any], metric: str, factor: float) -> None:
    """One figure of every run of a level × factor: 'ttft_ms' / 'tpot_ms' (their median) or 'output_throughput'."""
    for run in level["runs"]:
        if metric == "output_throughput":
            run[metric] *= factor
        else:
            run[metric]["median"] *= factor


def max_spread(level: dict[str, Any], get: Any) -> float:
    """(max − min)/median over the runs of one level, the larger of two levels' taken by the caller."""
    import statistics

    values = [get(r) for r in level["runs"]]
    return (max(values) - min(values)) / statistics.median(values)
