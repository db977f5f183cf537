"""Grade computation: highest level whose conditions all hold; a check that did not run never counts."""

from __future__ import annotations

from adaptcheck.base.schemas.ladder import GradeSpec
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, Status
from adaptcheck.grade import compute_features, compute_grade, level_at_least
from adaptcheck.ladder.loader import load_ladder

RULES = GradeSpec.model_validate({"levels": [
    {"level": "L1", "name": "device usable", "conditions": [
        {"id": "visible", "description": "device visible", "checks": ["smoke.visible"]},
        {"id": "smoke", "description": "step 2 passes", "steps": [2]}]},
    {"level": "L2", "name": "model runs", "conditions": [
        {"id": "ops", "description": "model ops", "tags": ["model_ops"]},
        {"id": "single", "description": "single request", "checks": ["fw.single"]}]},
    {"level": "L3", "name": "service usable", "conditions": [
        {"id": "coll", "description": "collectives", "checks": ["fw.coll"], "when": "multi_device"},
        {"id": "rules", "description": "compatible", "checks": ["matrix.rules"]}]},
]})

PLANNED = [
    PlannedCheck(id="matrix.rules", step=1, kind="k", timeout_s=1),
    PlannedCheck(id="smoke.visible", step=2, kind="k", timeout_s=1),
    PlannedCheck(id="smoke.streams", step=2, kind="k", timeout_s=1),
    PlannedCheck(id="ops.gemm", step=3, kind="k", tags=["model_ops"], timeout_s=1),
    PlannedCheck(id="fw.single", step=4, kind="k", timeout_s=1),
    PlannedCheck(id="fw.coll", step=4, kind="k", timeout_s=1),
]


def r(id_: str, step: int, status: Status = Status.PASS, applicable: bool = True, tags: list[str] | None = None) -> CheckResult:
    return CheckResult(id=id_, step=step, kind="k", status=status, applicable=applicable, tags=tags or [])


def all_pass() -> list[CheckResult]:
    return [r("matrix.rules.cuda", 1), r("matrix.rules.vllm_torch", 1, Status.SKIP, applicable=False),
            r("smoke.visible", 2), r("smoke.streams", 2, Status.SKIP, applicable=False),
            r("ops.gemm", 3, tags=["model_ops"]), r("fw.single", 4), r("fw.coll", 4)]


def test_everything_passing_reaches_the_top_level() -> None:
    g = compute_grade(RULES, PLANNED, all_pass(), [1, 2, 3, 4], device_count=1)
    assert g.level == "L3" and g.blockers == []


def test_non_applicable_skip_does_not_block_but_plain_skip_does() -> None:
    results = all_pass()
    results[3] = r("smoke.streams", 2, Status.SKIP, applicable=True)
    g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=1)
    assert g.level == "L0"
    assert any("smoke.streams skip" in b for b in g.blockers)


def test_step_not_run_never_counts_and_is_named() -> None:
    results = [x for x in all_pass() if x.step != 3]
    g = compute_grade(RULES, PLANNED, results, [1, 2, 4], device_count=1)
    assert g.level == "L1"
    assert g.steps_not_run == [3]
    assert any("ops.gemm not run (step 3 not selected)" in b for b in g.blockers)


def test_missing_result_of_a_selected_step_blocks() -> None:
    results = [x for x in all_pass() if x.id != "fw.single"]
    g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=1)
    assert g.level == "L1"
    assert any("fw.single has no result" in b for b in g.blockers)


def test_error_and_fail_block_with_their_message() -> None:
    for status in (Status.FAIL, Status.ERROR):
        results = all_pass()
        results[2] = CheckResult(id="smoke.visible", step=2, kind="k", status=status, message="died (SIGSEGV)")
        g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=1)
        assert g.level == "L0"
        assert any(f"smoke.visible {status.value}: died (SIGSEGV)" in b for b in g.blockers)


def test_expanded_subresults_count_for_their_parent() -> None:
    results = all_pass()
    results[0] = r("matrix.rules.cuda", 1, Status.FAIL)
    g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=1)
    assert g.level == "L2"
    assert any("matrix.rules.cuda fail" in b for b in g.blockers)


def test_multi_device_condition_only_demanded_with_several_devices() -> None:
    results = [x for x in all_pass() if x.id != "fw.coll"]
    assert compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=1).level == "L3"
    g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=2)
    assert g.level == "L2" and any("fw.coll has no result" in b for b in g.blockers)


def test_higher_level_never_granted_over_a_failed_lower_one() -> None:
    results = all_pass()
    results[2] = r("smoke.visible", 2, Status.FAIL)
    g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], device_count=1)
    assert g.level == "L0"
    assert [lv.holds for lv in g.levels] == [False, True, True]


def test_condition_with_only_not_applicable_checks_does_not_hold() -> None:
    planned = [PlannedCheck(id="smoke.streams", step=2, kind="k", timeout_s=1)]
    rules = GradeSpec.model_validate({"levels": [{"level": "L1", "name": "x", "conditions": [
        {"id": "s", "description": "streams", "checks": ["smoke.streams"]}]}]})
    g = compute_grade(rules, planned, [r("smoke.streams", 2, Status.SKIP, applicable=False)], [2], 1)
    assert g.level == "L0"


def test_where_applicable_condition_holds_when_every_selected_check_is_not_applicable() -> None:
    planned = [PlannedCheck(id="fw.vllm.compile", step=4, kind="k", timeout_s=1),
               PlannedCheck(id="fw.transformers.compile", step=4, kind="k", timeout_s=1)]
    rules = GradeSpec.model_validate({"levels": [{"level": "L1", "name": "x", "conditions": [
        {"id": "c", "description": "compile on/off", "checks": ["fw.*.compile"], "when": "where_applicable"}]}]})
    na = [r("fw.vllm.compile", 4, Status.SKIP, applicable=False),
          r("fw.transformers.compile", 4, Status.SKIP, applicable=False)]
    assert compute_grade(rules, planned, na, [4], 1).level == "L1"
    # ...but an applicable skip (could not run), a failure, or a missing result still blocks it.
    assert compute_grade(rules, planned, [na[0], r("fw.transformers.compile", 4, Status.SKIP)], [4], 1).level == "L0"
    assert compute_grade(rules, planned, [na[0], r("fw.transformers.compile", 4, Status.FAIL)], [4], 1).level == "L0"
    assert compute_grade(rules, planned, na[:1], [4], 1).level == "L0"
    assert compute_grade(rules, planned, [], [1], 1).level == "L0"  # step 4 not run


def _builtin_results(not_applicable: tuple[str, ...] = ()) -> tuple[list[PlannedCheck], list[CheckResult], object]:
    """Every check of the quick ladder passing (ops once per dtype, as they report), and the
    checks whose id starts with one of ``not_applicable`` n/a."""
    spec = load_ladder("quick").spec
    planned = [PlannedCheck(id=c.id, step=c.step, kind=c.kind, tags=c.tags, timeout_s=1) for c in spec.checks]
    results: list[CheckResult] = []
    for c in spec.checks:
        ids = [f"{c.id}.{d}" for d in c.params.get("dtypes", [])] if c.kind == "ops.op" else [c.id]
        for rid in ids:
            if c.id.startswith(not_applicable):
                results.append(CheckResult(id=rid, step=c.step, kind=c.kind, tags=c.tags, status=Status.SKIP, applicable=False,
                                           message="vLLM is not installed"))
            else:
                results.append(CheckResult(id=rid, step=c.step, kind=c.kind, tags=c.tags, status=Status.PASS))
    return planned, results, spec


def test_every_check_passing_gives_l5_and_each_l5_condition_blocks_it() -> None:
    """L5 needs the known-good entry, the soak and the regression comparison; without a
    baseline the comparison skips, which blocks L5 (never a pass), and the grade stays L4."""
    planned, results, spec = _builtin_results()
    assert compute_grade(spec.grade, planned, results, [1, 2, 3, 4, 5], 1).level == "L5"  # type: ignore[attr-defined]
    for broken, status, message in (
            ("perf.regression", Status.SKIP, "no baseline: pass --baseline RESULTS.json"),
            ("perf.regression", Status.FAIL, "1 regression: perf.gemm median time +80%"),
            ("perf.soak", Status.FAIL, "server RSS grows 1600 MiB/min > 10 MiB/min"),
            ("perf.soak", Status.SKIP, "no memory series could be sampled"),
            ("matrix.known_good", Status.FAIL, "no known-good entry matches")):
        changed = [x.model_copy(update={"status": status, "message": message}) if x.id == broken else x
                   for x in results]
        g = compute_grade(spec.grade, planned, changed, [1, 2, 3, 4, 5], 1)  # type: ignore[attr-defined]
        assert g.level == "L4", (broken, status)
        assert any(b.startswith("L5 ") and f"{broken} {status.value}: {message}" in b for b in g.blockers), g.blockers
    # The regression check is the ladder's last: it compares everything that ran before it.
    assert spec.checks[-1].kind == "perf.regression"  # type: ignore[attr-defined]


def test_l4_needs_every_micro_benchmark_and_every_serving_scenario() -> None:
    # Host-device copies do not exist on a CPU (n/a): the other micro-benchmarks carry L4.
    planned, results, spec = _builtin_results(("perf.host_device",))
    assert compute_grade(spec.grade, planned, results, [1, 2, 3, 4, 5], 1).level == "L5"  # type: ignore[attr-defined]
    for broken, status in (("perf.serving.mixed", Status.FAIL), ("perf.gemm", Status.SKIP),
                           ("perf.collectives", Status.ERROR)):
        changed = [r.model_copy(update={"status": status, "message": "spread 40% > 25%"}) if r.id == broken else r
                   for r in results]
        g = compute_grade(spec.grade, planned, changed, [1, 2, 3, 4, 5], 1)  # type: ignore[attr-defined]
        assert g.level == "L3", broken
        assert any(f"{broken} {status.value}: spread" in b for b in g.blockers), g.blockers
    # Step 5 not run: L4 is not granted on missing evidence.
    without = [r for r in results if r.step != 5]
    g = compute_grade(spec.grade, planned, without, [1, 2, 3, 4], 1)  # type: ignore[attr-defined]
    assert g.level == "L3" and any("perf.gemm not run (step 5 not selected)" in b for b in g.blockers)


def test_a_machine_without_vllm_still_reaches_l5_through_transformers() -> None:
    planned, results, spec = _builtin_results(("framework.vllm", "framework.endpoint", "ops.vllm"))
    assert compute_grade(spec.grade, planned, results, [1, 2, 3, 4, 5], 1).level == "L5"  # type: ignore[attr-defined]


def test_a_failing_framework_blocks_l2_even_when_another_passes() -> None:
    planned, results, spec = _builtin_results()
    results = [r.model_copy(update={"status": Status.FAIL, "message": "token 3 is 7 instead of 9"})
               if r.id == "framework.vllm.reference" else r for r in results]
    g = compute_grade(spec.grade, planned, results, [1, 2, 3, 4, 5], 1)  # type: ignore[attr-defined]
    assert g.level == "L1"
    assert any("framework.vllm.reference fail: token 3" in b for b in g.blockers)


def test_level_at_least() -> None:
    assert level_at_least("L3", "L2") and level_at_least("L2", "L2") and not level_at_least("L1", "L2")
    assert not level_at_least("L0", "L1")


def test_precision_placeholder_demands_only_the_model_dtype() -> None:
    rules = GradeSpec.model_validate({"levels": [{"level": "L1", "name": "x", "conditions": [
        {"id": "ops", "description": "ops at model dtype", "checks": ["ops.*.{precision}"]}]}]})
    planned = [PlannedCheck(id="ops.gemm", step=3, kind="ops.op", timeout_s=1)]
    results = [r("ops.gemm.bf16", 3), r("ops.gemm.fp16", 3, Status.FAIL)]
    assert compute_grade(rules, planned, results, [3], 1, precision="bf16").level == "L1"
    g = compute_grade(rules, planned, results, [3], 1, precision="fp16")
    assert g.level == "L0" and any("ops.gemm.fp16 fail" in b for b in g.blockers)
    # Step 3 not run: the planned op check is named as missing evidence.
    g = compute_grade(rules, planned, [], [1, 2], 1, precision="bf16")
    assert any("ops.gemm not run (step 3 not selected)" in b for b in g.blockers)


def _with_status(results: list[CheckResult], rid: str, status: Status) -> list[CheckResult]:
    return [x.model_copy(update={"status": status}) if x.id == rid else x for x in results]


def test_a_broken_int8_gemm_does_not_block_an_unquantized_model_but_blocks_an_int8_one() -> None:
    """Measured on an AVX2 host: vLLM's int8 GEMM fails there, while bf16 models serve correctly."""
    planned, results, spec = _builtin_results()
    broken = _with_status(results, "ops.vllm.int8_w8a8_gemm.bf16", Status.FAIL)
    args = (spec.grade, planned, broken, [1, 2, 3, 4, 5], 1, "bf16")  # type: ignore[attr-defined]
    unquantized = compute_grade(*args)
    assert unquantized.level == "L5", unquantized.blockers
    quant_ids = {"ops.int8_w8a8_gemm", "ops.scaled_int8_quant", "ops.fp8_quantize", "ops.fp8_scaled_gemm",
                 "ops.vllm.int8_w8a8_gemm", "ops.vllm.scaled_int8_quant", "ops.vllm.fp8_quantize"}
    assert set(unquantized.left_out) == quant_ids
    for quantization in ("int8_w8a8", "other"):
        g = compute_grade(*args, quantization=quantization)
        assert g.level == "L1" and "ops.vllm.int8_w8a8_gemm" not in g.left_out, quantization
        assert any("ops.vllm.int8_w8a8_gemm.bf16 fail" in b for b in g.blockers), g.blockers
    fp8 = compute_grade(*args, quantization="fp8")
    assert fp8.level == "L5" and set(fp8.left_out) == {i for i in quant_ids if "int8" in i}
    # An fp8 failure blocks the fp8 model only; a failure at another dtype blocks nobody.
    fp8_broken = _with_status(results, "ops.fp8_scaled_gemm.bf16", Status.FAIL)
    assert compute_grade(spec.grade, planned, fp8_broken, [1, 2, 3, 4, 5], 1, "bf16",  # type: ignore[attr-defined]
                         quantization="fp8").level == "L1"
    assert compute_grade(spec.grade, planned, fp8_broken, [1, 2, 3, 4, 5], 1, "bf16",  # type: ignore[attr-defined]
                         quantization="int8_w8a8").level == "L5"


def test_an_untagged_check_counts_whatever_the_quantization() -> None:
    results = _with_status(all_pass(), "ops.gemm", Status.FAIL)
    for quantization in ("none", "int8_w8a8", "fp8", "other"):
        g = compute_grade(RULES, PLANNED, results, [1, 2, 3, 4], 1, quantization=quantization)
        assert g.level == "L1" and g.left_out == [], quantization


def test_a_failing_feature_check_is_beside_the_level_unless_a_condition_names_it() -> None:
    """An fp8 KV-cache kernel caught by ``ops.*`` or a whole step is not folded into the level;
    a condition that names the check (its id or a tag) still demands it."""
    rules = GradeSpec.model_validate({"levels": [
        {"level": "L1", "name": "ops", "conditions": [
            {"id": "ops", "description": "every op", "checks": ["ops.*"]},
            {"id": "step3", "description": "step 3", "steps": [3]}]},
        {"level": "L2", "name": "named", "conditions": [
            {"id": "named", "description": "named", "checks": ["ops.paged_fp8"]}]},
    ]})
    tags = ["feature:fp8_kv_cache"]
    planned = [PlannedCheck(id="ops.gemm", step=3, kind="k", timeout_s=1),
               PlannedCheck(id="ops.paged_fp8", step=3, kind="k", tags=tags, timeout_s=1)]
    results = [r("ops.gemm", 3), r("ops.paged_fp8.bf16", 3, Status.FAIL, tags=tags)]
    g = compute_grade(rules, planned, results, [3], device_count=1)
    assert g.level == "L1"  # the wildcard and the step left the feature out; the named condition did not
    assert any("ops.paged_fp8" in b for b in g.blockers)
    fp8 = next(f for f in compute_features(planned, results, [3]) if f.name == "fp8_kv_cache")
    assert fp8.status == "failed"
    untagged = [r("ops.gemm", 3), r("ops.paged_fp8.bf16", 3, Status.FAIL)]
    assert compute_grade(rules, [p.model_copy(update={"tags": []}) for p in planned], untagged, [3],
                         device_count=1).level == "L0"  # without the tag, ops.* demands it
