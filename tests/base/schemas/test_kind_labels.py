"""Results 1.4: a check records its kind's report label and what it compares; older files get them on load.

The report has no table of kinds: a stored 1.3 file (``data/results-1.3.json``, cut from a real
vLLM run) and the stored 1.1 quick-ladder file show the labels they always showed, through the
upgrade (``base.schemas.upgrade``), and a fresh result carries what its kind class declares.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from adaptcheck.base.schemas.ladder import CheckSpec
from adaptcheck.base.schemas.results import SCHEMA_VERSION, RunResults
from adaptcheck.base.schemas.upgrade import COMPARES_1_3, KIND_LABELS_1_3
from adaptcheck.grade import compute_grade
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.ladder.runner import error_results
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view

DATA = Path(__file__).parent / "data"
STORED_1_3 = DATA / "results-1.3.json"
STORED_1_1 = Path(__file__).parents[2] / "report" / "data" / "quick-run.results.json.gz"

# What the report showed for these kinds before 1.4 (its KIND_NAMES and DISTRIBUTION_PAIRS tables).
SHOWN = {
    "framework.transformers.load": "load",
    "framework.transformers.concurrent": "alone vs batched",
    "framework.transformers.kv_cache": "KV cache",
    "framework.vllm.tensor_parallel": "tensor parallel vs one device",
    "framework.transformers.compile": "compile on vs off",  # planned, not run: the not-run row
}


def _rows(results: RunResults) -> dict[str, str]:
    return {r.id: r.what for b in build_view(results).framework.frameworks for r in b.checks}


def test_a_1_3_file_loads_grades_and_renders_with_the_labels_it_always_had() -> None:
    raw = json.loads(STORED_1_3.read_text(encoding="utf-8"))
    assert raw["schema_version"] == "1.3" and "kind_label" not in raw["checks"][0]
    results = RunResults.load(STORED_1_3)
    assert results.schema_version == SCHEMA_VERSION == "1.7"
    by_id = {c.id: c for c in results.checks}
    assert by_id["framework.transformers.concurrent"].compares == "batched vs alone"
    assert by_id["framework.transformers.kv_cache"].compares == "prefix-cache hit vs recompute"
    assert by_id["framework.transformers.load"].compares is None
    assert by_id["framework.collectives"].kind_label == "collectives"
    # Grades as stored (the grade reads statuses, not labels).
    grade = compute_grade(results.grade_rules, results.planned, results.checks, results.steps,
                          results.device.device_count, results.model.precision, results.model.quantization)
    assert grade == results.grade
    assert {k: v for k, v in _rows(results).items() if k in SHOWN} == SHOWN
    page = render(build_view(results), "main")
    assert "teacher-forced, batched vs alone: KL mean" in page
    assert "teacher-forced, prefix-cache hit vs recompute: KL mean" in page


def test_the_stored_1_1_file_keeps_its_labels() -> None:
    results = RunResults.model_validate(json.loads(gzip.decompress(STORED_1_1.read_bytes())))
    rows = _rows(results)
    kinds = {c.id: c.kind for c in results.checks}
    assert rows and all(what == KIND_LABELS_1_3[kinds[cid]] for cid, what in rows.items() if cid in kinds)
    assert {c.compares for c in results.checks if c.kind in COMPARES_1_3} <= set(COMPARES_1_3.values())


def test_the_frozen_tables_match_what_the_kinds_declare_today() -> None:
    # The upgrade describes the past; today's kinds declared the same, so old and new files read alike.
    for kind, label in KIND_LABELS_1_3.items():
        cls = get_check_class(kind)
        assert cls.label == label
        assert cls.compares == COMPARES_1_3.get(kind)


def test_a_result_records_its_kinds_label_and_comparison() -> None:
    spec = CheckSpec(id="framework.transformers.concurrent", step=4, kind="framework.concurrent",
                     params={"framework": "transformers"})
    [result] = error_results(spec, "worker died")
    assert (result.kind_label, result.compares) == ("alone vs batched", "batched vs alone")
    # A kind without a label records none, and the report shows its kind.
    [plain] = error_results(CheckSpec(id="smoke.matmul", step=2, kind="smoke.matmul"), "worker died")
    assert plain.kind_label is None and plain.compares is None
