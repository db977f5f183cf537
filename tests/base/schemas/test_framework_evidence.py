"""The step-4 evidence models: real details round-trip unchanged, the step code builds the same
JSON through them, and details that do not fit read as None (the report still renders).

``data/framework_details.json`` holds details of real runs (a standard ladder with vLLM, a
quick run with and without vLLM, as the loader brings them to the current schema), trimmed to
a few prompts and rows per list.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.schemas.framework_evidence import (
    AdapterFacts,
    BoundVerdict,
    CollectivesEvidence,
    CollectivesMetrics,
    ComparingEvidence,
    Distribution,
    FrameworkCheckEvidence,
    FrameworkMetrics,
    LoadEvidence,
    Localisation,
    ReferenceEvidence,
    TeacherForced,
    lifecycle_evidence_model,
)
from adaptcheck.base.schemas.numerics import Rule
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.frameworks.base import Generation, Scored
from adaptcheck.steps.frameworks import agreement, localise, teacher
from adaptcheck.steps.frameworks.bounds import load_numerics

DATA = json.loads((Path(__file__).parent / "data" / "framework_details.json").read_text(encoding="utf-8"))
SAMPLES: list[dict[str, Any]] = [{**s, "file": f} for f, rows in DATA.items() for s in rows]
LIFECYCLE = [s for s in SAMPLES if s["kind"] != "framework.collectives"]


def _sample(cid: str) -> dict[str, Any]:
    return next(s for s in SAMPLES if s["id"] == cid)


def _result(kind: str, details: dict[str, Any], metrics: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult(step=4, id=f"x.{kind}", kind=kind, status=Status.PASS, details=details, metrics=metrics or {})


# ---------------------------------------------------------------- real details round-trip


@pytest.mark.parametrize("sample", LIFECYCLE, ids=lambda s: s["id"])
def test_each_kind_round_trips_real_details_unchanged(sample: dict[str, Any]) -> None:
    model = lifecycle_evidence_model(sample["kind"])
    evidence = model.parse(sample["details"])
    dumped = evidence.dump()
    assert dumped == sample["details"]
    if sample["file"] != "std.json":  # written by this schema (std.json is 1.2, upgraded on load)
        # Same keys in the same order (the stored text, not only the value).
        assert json.dumps(dumped) == json.dumps(sample["details"])


def test_the_nested_records_are_typed_not_extras() -> None:
    ref = ReferenceEvidence.parse(_sample("framework.vllm.reference")["details"])
    tf = ref.teacher_forced
    assert tf is not None and tf.method == "teacher_forced" and not tf.extras
    assert tf.device is not None and tf.device.positions == tf.positions and tf.device.kl_mean is not None
    assert tf.bounds is not None and set(tf.bounds) == {"kl_mean", "kl_p99"} and tf.bounds["kl_mean"].ok is True
    assert tf.histogram is not None and len(tf.histogram.edges) == len(tf.histogram.device) + 1
    assert tf.greedy is not None and tf.greedy.comparison[0].index == 0 and not tf.greedy.comparison[0].extras
    conc = ComparingEvidence.parse(_sample("framework.vllm.concurrent")["details"])
    assert conc.distribution is not None and conc.distribution.vs_reference is not None
    assert conc.distribution.vs_reference.alone is not None and not conc.distribution.extras
    load = LoadEvidence.parse(_sample("framework.vllm.load")["details"])
    assert load.weights_audit is not None and load.weights_audit.refused is False
    assert load.weights_audit.extras["checkpoint_tensors"] > 0  # the audit's counts stay as they were
    moe = ReferenceEvidence.parse(_sample("framework.vllm.moe.reference")["details"])
    assert moe.model is not None and moe.model.synthetic is not None and moe.model.synthetic.name == "tiny-moe"


def test_metrics_adapter_facts_and_collectives_read_typed() -> None:
    ref = _sample("framework.vllm.reference")
    m = FrameworkMetrics.parse(ref["metrics"])
    assert m.sequences == ref["metrics"]["sequences"] and m.top_n == 5 and "tf_kl_mean" in m.extras
    fw = FrameworkCheckEvidence.parse(_sample("framework.vllm.load")["details"]).framework
    facts = AdapterFacts.parse(fw.extras)
    assert facts.platform_plugins and facts.platform == fw.extras["platform"]
    coll = _sample("framework.collectives")
    ev = CollectivesEvidence.parse(coll["details"])
    assert ev.table and ev.table[0].status == "ok" and ev.ranks[0].rank == 0
    assert CollectivesMetrics.parse(coll["metrics"]).world_size == coll["metrics"]["world_size"]


# ---------------------------------------------------------------- malformed details


@pytest.mark.parametrize("bad", [
    {"teacher_forced": {"method": "teacher_forced", "bounds": "garbage"}},
    {"teacher_forced": {"device": {"kl_mean": "n/a"}}},
    {"teacher_forced": {"bounds": {"kl_mean": {"bound": 1.0, "ok": "yes"}}}},  # never a pass by coercion
    {"comparison": [{"index": 0, "ok": 1}]},
    {"distribution": {"ok": "true"}},
    {"subchecks": [{"name": "odd", "ok": "yes"}]},
])
def test_details_that_do_not_fit_read_as_none(bad: dict[str, Any]) -> None:
    details = {**_sample("framework.vllm.reference")["details"], **bad}
    assert _result("framework.reference", details).evidence(ReferenceEvidence) is None


def test_a_figure_stored_as_null_reads_as_unknown() -> None:
    # JSON has no NaN: the lifecycle's dump turns a non-finite figure inside the details into null.
    tf = TeacherForced.model_validate({"method": "teacher_forced", "device": {"kl_mean": None, "positions": 3}})
    assert tf.device is not None and tf.device.kl_mean is None and tf.device.recorded() == {"kl_mean": None,
                                                                                             "positions": 3.0}


def test_a_non_finite_figure_is_stored_as_null_as_before() -> None:
    record = Distribution.model_validate({"kl_mean": math.nan, "kl_max": math.inf, "ok": None}).dump()
    assert math.isnan(record["kl_mean"]) and record["kl_max"] == math.inf  # typed floats stay floats in the step
    stored = FrameworkCheckEvidence.model_validate({"framework": {"name": "t"}, "distribution": record}).dump()
    assert stored["distribution"]["kl_mean"] is None and stored["distribution"]["kl_max"] is None
    assert Distribution.model_validate(stored["distribution"]).kl_mean is None


# ---------------------------------------------------------------- the step code builds the same JSON


def test_greedy_fallback_json() -> None:
    assert teacher.greedy_fallback("no prompt_logprobs") == {
        "method": "greedy_fallback", "fallback_reason": "no prompt_logprobs", "localisation": None}


def _scores(*rows: dict[int, float]) -> list[Scored]:
    return [Scored([max(r.values()) for r in rows], list(rows))]


def test_same_framework_and_batched_vs_alone_json_keep_their_keys() -> None:
    policy = load_numerics()
    a = _scores({1: -0.1, 2: -2.5}, {3: -0.2, 4: -1.9})
    b = _scores({1: -0.11, 2: -2.4}, {3: -0.21, 4: -1.8})
    summ = teacher.control_summary(teacher.Control(dtype="bf16", attention=None, alone=b),
                                   teacher.TeacherData("fp64", "sdpa", [], [], a))
    row, dist = teacher.same_framework_row("same", a, b, summ, policy, "bf16")
    assert list(row) == ["name", "ok", "detail"] and row["ok"] in (True, False)
    assert list(dist) == ["positions", "kl_mean", "kl_p99", "kl_max", "dlogprob_mean", "dlogprob_max",
                          "same_top_rate", "bounds", "ok"]
    assert set(dist["bounds"]) == set(policy.same_framework)
    assert list(dist["bounds"]["kl_mean"]) == ["value", "bound", "multiple", "floor", "control", "ok"]
    _, none = teacher.same_framework_row("same", a, b, None, policy, "bf16")
    assert none["ok"] is None and "bounds" not in none
    row, vs = teacher.batched_vs_alone_row("vs", a, b, b, policy, "bf16")
    assert list(vs) == ["alone", "batched", "bounds", "ok"] and vs["ok"] is True
    # The probe then puts both together; the result reads back as the distribution record.
    dist["vs_reference"] = vs
    assert Distribution.model_validate(dist).dump() == dist


def test_comparison_details_are_the_verdicts_as_they_were() -> None:
    a = [Generation(token_ids=[1, 2, 3], text="abc", finish_reason="length",
                    top_logprobs=[{1: -0.1, 9: -2.0}, {2: -0.1, 8: -0.2}, {3: -0.1}])]
    b = [Generation(token_ids=[1, 8, 3], text="axc", finish_reason="length",
                    top_logprobs=[{1: -0.1}, {8: -0.1, 2: -0.15}, {3: -0.1}])]
    cmp = agreement.compare(a, b, mode="top_n", top_n=2)
    assert cmp.details() == [asdict(p) for p in cmp.pairs]
    assert [v.divergence for v in cmp.verdicts()] == [1]


class _Tensor:
    """What localise's error measure needs of a tensor: shape, norm, subtraction."""

    def __init__(self, value: float) -> None:
        self.value, self.shape = value, (1,)

    def norm(self) -> float:
        return abs(self.value)

    def __sub__(self, other: _Tensor) -> _Tensor:
        return _Tensor(self.value - other.value)


def test_localisation_json() -> None:
    rule = Rule(multiple=2.0, floor={"fp32": 0.0, "fp16": 0.0, "bf16": 0.01}, reason="unit test of the formula")
    ev = localise.Event
    ref = [ev("a", "output", _Tensor(1.0)), ev("b", "output", _Tensor(1.0))]
    ctl = [ev("a", "output", _Tensor(1.001)), ev("b", "output", _Tensor(1.001))]
    dev = [ev("a", "output", _Tensor(1.001)), ev("b", "output", _Tensor(1.5))]
    found = localise.first_departure(dev, ref, ctl, rule, "bf16")
    assert found.module == "b" and found.departs is True and [r.module for r in found.table] == ["a", "b"]
    assert list(found.dump()) == ["module", "where", "error", "control", "bound", "departs", "reason", "table"]
    assert localise.describe(found).startswith("b output: normalized error 0.5")
    none = localise.first_departure(dev[:1], ref, ctl, rule, "bf16")
    assert none.dump()["module"] is None and "departs" not in none.dump() and localise.describe(none) == none.reason
    assert Localisation.model_validate(found.dump()).dump() == found.dump()


def test_bound_verdict_floats_stay_as_written() -> None:
    b = BoundVerdict(value=0.1, bound=0.2, multiple=4.0, floor=0.001, control=0.05, ok=True)
    assert b.dump() == {"value": 0.1, "bound": 0.2, "multiple": 4.0, "floor": 0.001, "control": 0.05, "ok": True}
