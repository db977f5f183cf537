"""Real results of two same-machine runs (tests/compare/data/README.md) and ways to plant changes in them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adaptcheck.base.integrity import DIGEST_FIELD, compute_digest
from adaptcheck.base.schemas.results import CheckResult, RunResults

DATA = Path(__file__).resolve().parent / "data"
BASELINE = DATA / "baseline.json"
RERUN = DATA / "rerun.json"
GEMM_ROW = ("perf.gemm", "prefill m=2048 n=4096 k=4096", "bf16")
SERVING_LEVEL = ("perf.serving.concurrent_short", 4)


def load_pair() -> tuple[RunResults, RunResults]:
    """(baseline, rerun), fresh objects each call so a test may change them freely."""
    return RunResults.load(BASELINE), RunResults.load(RERUN)


def sealed_text(source: Path | RunResults | dict[str, Any]) -> str:
    """The JSON text of a results file, file object or parsed dict, carrying a digest that
    matches its content — what a run (schema 1.1+) writes. The data files above are real
    schema-1.0 files without one, which compare, grade and run --baseline refuse unless
    --allow-unverified; tests that are not about integrity use sealed copies."""
    if isinstance(source, Path):
        data = json.loads(source.read_text(encoding="utf-8"))
    elif isinstance(source, RunResults):
        data = json.loads(source.model_dump_json())
    else:
        data = dict(source)
    data.pop(DIGEST_FIELD, None)
    data[DIGEST_FIELD] = compute_digest(data)
    return json.dumps(data, indent=2)


def write_sealed(source: Path | RunResults | dict[str, Any], dest: Path) -> Path:
    """:func:`sealed_text` written to ``dest``; returns ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(sealed_text(source), encoding="utf-8")
    return dest


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
