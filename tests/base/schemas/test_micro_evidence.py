"""The step-5 micro-benchmark evidence models read real details back to the identical dict.

``data/micro_details.json`` holds excerpts of stored results (schema 1.1, 1.2 and 1.3: the
first rows of each micro-benchmark check of a quick and a standard ladder run).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adaptcheck.base.schemas.micro_evidence import MicroEvidence, MicroRow, PeakRecord, RankRecord, RowExtra
from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.perf.micro import make_row, not_run_row
from adaptcheck.perf.peaks import Peak
from adaptcheck.perf.timing import summarize
from adaptcheck.report.perf import build_perf

DATA = json.loads((Path(__file__).parent / "data" / "micro_details.json").read_text(encoding="utf-8"))
ROW_KEYS = ["name", "dtype", "params", "flops", "bytes", "time_s", "achieved", "efficiency",
            "arithmetic_intensity", "ridge_point", "bound", "status", "reason", "extra"]


@pytest.mark.parametrize("label", sorted(DATA))
def test_real_details_round_trip_to_the_identical_dict(label: str) -> None:
    details = DATA[label]
    evidence = MicroEvidence.parse(details)
    dumped = evidence.dump()
    assert dumped == details
    assert json.dumps(dumped) == json.dumps(details)  # the key order too (the report lists extras in order)


def test_old_time_stats_stay_without_ci_fields() -> None:
    row = MicroEvidence.parse(DATA["1.1 perf.gemm"]).rows[0]
    assert row.time_s is not None and row.time_s.median_ci is None
    assert "median_ci" not in row.dump()["time_s"]


def test_rows_built_by_the_benchmarks_have_every_contract_key() -> None:
    peak = Peak(device="x", entry="e", source="s", verified=True, flops={"fp32": 1e11}, memory_bw=1e10)
    row = make_row("x", "fp32", {"m": 1}, 5e10, 1.0, summarize([0.5, 0.5, 0.5]), peak).dump()
    assert list(row) == ROW_KEYS and row["extra"] == {"inner_calls": 1}
    assert row["time_s"]["median_ci"] == [0.5, 0.5] and row["efficiency"] == pytest.approx(1.0)
    skipped = not_run_row("y", None, {"bytes": 4}, "why", raised=True).dump()
    assert list(skipped) == ROW_KEYS and skipped["extra"] == {"raised": True} and skipped["time_s"] is None
    assert MicroRow.parse(row).dump() == row


def test_non_finite_timings_stay_floats() -> None:
    row = make_row("x", "fp32", {}, 1.0, 1.0, summarize([0.0, 0.0]), None).dump()
    assert math.isinf(row["time_s"]["spread"]) and row["achieved"] == {"flops_per_s": None, "bytes_per_s": None}


def test_peak_record_is_what_the_verdict_stores() -> None:
    peak = Peak(device="d", entry="e", source="s", verified=False, flops={"bf16": 2e12}, derivation=("a",))
    assert peak.record().dump() == {"device": "d", "entry": "e", "source": "s", "verified": False, "flops": {"bf16": 2e12},
                              "memory_bw": None, "host_link_bw": None, "interconnect_bw": None,
                              "derivation": ["a"], "memory_bw_basis": "spec", "notes": ""}
    assert PeakRecord.parse(peak.record().dump()).flops_for("bf16") == 2e12
    assert PeakRecord.parse(peak.record().dump()).flops_for(None) is None


def test_unknown_extra_keys_are_kept_after_the_known_ones() -> None:
    extra = RowExtra.parse({"inner_calls": 3, "plugin_fact": "x"})
    assert extra.dump() == {"inner_calls": 3, "plugin_fact": "x"} and extra.extras == {"plugin_fact": "x"}


def test_rank_records_validate_the_wire() -> None:
    rec = RankRecord.parse({"event": "bench", "key": "all_reduce/fp32/16", "status": "ok", "samples": [0.1],
                            "inner": 2, "t": 1.5})
    assert rec.samples == [0.1] and rec.inner == 2
    with pytest.raises(Exception, match="samples"):
        RankRecord.parse({"event": "bench", "samples": "fast"})


def _results(details: dict[str, object]) -> RunResults:
    from tests.report.factory import make_results

    check = CheckResult(step=5, id="perf.gemm", kind="perf.gemm", status=Status.PASS, message="m",
                        details=details)
    return make_results(steps=[5], checks=[check])


def test_malformed_details_read_as_none_and_the_report_still_renders() -> None:
    bad = CheckResult(step=5, id="perf.gemm", kind="perf.gemm", status=Status.PASS, message="m",
                      details={"benchmark": "gemm", "rows": "not a list"})
    assert bad.evidence(MicroEvidence) is None
    view = build_perf(_results(bad.details), {})
    (micro,) = view.micro
    assert micro.rows == [] and micro.title == "GEMM (matrix multiply)"
    assert micro.no_rows_note == "no measurements recorded"


def test_a_row_without_a_status_never_reads_as_ok() -> None:
    view = build_perf(_results({"benchmark": "gemm", "rows": [{"name": "r"}]}), {})
    assert view.micro[0].rows[0].status.label == "unknown"


def test_row_label_is_name_and_dtype() -> None:
    assert MicroRow(name="copy 16 MiB").label == "copy 16 MiB"
    assert MicroRow(name="decode", dtype="bf16").label == "decode bf16"


def test_rank_lines_are_validated_and_torn_or_foreign_lines_dropped(tmp_path: Path) -> None:
    from adaptcheck.collectives.launch import read_records

    path = tmp_path / "rank0.jsonl"
    path.write_text('{"event": "start", "rank": 0, "pid": 7, "device": "cpu", "t": 1.0}\n'
                    '{"event": "op", "key": "all_reduce/fp32/8", "status": "ok", "mismatches": 0}\n'
                    '{"no event": true}\n'
                    '{"event": "bench", "samples": [0.1, 0.2', encoding="utf-8")
    records = read_records(path)
    assert [r.event for r in records] == ["start", "op"] and records[0].pid == 7
    assert read_records(tmp_path / "missing.jsonl") == []


def test_the_step_4_config_mapping_is_validated_as_a_worker_config() -> None:
    from adaptcheck.collectives.launch import BenchSettings, WorkerConfig

    config = WorkerConfig.model_validate({"backend": "cpu", "backend_class": "m:C", "ops": ["all_reduce"],
                                          "dtypes": ["fp32"], "elements": [1], "impl": None, "timeout_s": 90})
    assert config.mode is None and config.bench == BenchSettings()
    again = WorkerConfig.model_validate_json(config.model_copy(update={"results": "r.jsonl"}).model_dump_json())
    assert again.results == "r.jsonl" and again.ops == ["all_reduce"]
    with pytest.raises(Exception, match="timeout_s"):
        WorkerConfig.model_validate({"backend": "cpu"})
