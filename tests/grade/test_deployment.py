"""The grade's view of the deployment under test (issue 38): the features table marks the features
the --serve deployment turns on (``deployed``), never changing a status; adaptcheck's own deployment
and files older than schema 1.7 deploy none; ``adaptcheck grade`` names the deployment on one line
and carries it in ``--format json`` (in process, tests/inprocess.py)."""

from __future__ import annotations

import json
from pathlib import Path

from adaptcheck.base.features import FeatureStatus
from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.base.schemas.upgrade import upgrade_results
from adaptcheck.grade import compute_features
from adaptcheck.runfolder import regrade
from tests.inprocess import invoke
from tests.report.factory import make_deployment, make_results, own_deployment

TP_CHECK = CheckResult(step=4, id="framework.vllm.tp", kind="framework.tensor_parallel", status=Status.FAIL,
                       tags=["feature:tensor_parallel"], message="answers differ on 2 ranks", duration_s=1.0)
TP_PLANNED = PlannedCheck(id="framework.vllm.tp", step=4, kind="framework.tensor_parallel",
                          tags=["feature:tensor_parallel"], timeout_s=60)


def _rows(deployment: Deployment | None) -> dict[str, tuple[FeatureStatus, bool]]:
    rows = compute_features([TP_PLANNED], [TP_CHECK], [4], deployment)
    return {r.name: (r.status, r.deployed) for r in rows}


def test_deployed_rows_follow_the_deployment_and_keep_their_status() -> None:
    rows = _rows(make_deployment())  # TP 2, fp8 KV cache, compiled
    assert {name for name, (_, deployed) in rows.items() if deployed} == {"tensor_parallel", "fp8_kv_cache",
                                                                          "graph_capture"}
    # Deployed says what the deployment runs; the status is still the checks': failed, not tested.
    assert rows["tensor_parallel"] == (FeatureStatus.FAILED, True)
    assert rows["fp8_kv_cache"] == (FeatureStatus.NOT_TESTED, True)
    assert rows["prefix_caching"] == (FeatureStatus.NOT_TESTED, False)
    eager = make_deployment(compile_mode="eager", engine_args={"enforce_eager": True, "tensor_parallel_size": 1},
                            tensor_parallel_size=1)
    assert {n for n, (_, d) in _rows(eager).items() if d} == {"fp8_kv_cache"}


def test_without_a_given_deployment_no_row_is_deployed() -> None:
    for deployment in (None, own_deployment(), own_deployment().model_copy(update={"features": ["prefix_caching"]})):
        assert not any(d for _, d in _rows(deployment).values()), deployment


def test_regrade_reads_the_file_s_deployment() -> None:
    stale = make_results().model_copy(update={"deployment": make_deployment(features=["prefix_caching"])})
    assert not any(f.deployed for f in stale.features)  # as written without it
    regraded = regrade(stale)
    assert [f.name for f in regraded.features if f.deployed] == ["prefix_caching"]
    assert regraded.deployment == stale.deployment


def test_a_1_6_file_loads_without_deployment_and_nothing_deployed() -> None:
    raw = json.loads(make_results().model_dump_json())
    raw["schema_version"] = "1.6"
    raw.pop("deployment")
    for row in raw["features"]:
        row.pop("deployed")
    upgraded = upgrade_results(raw, "1.7")
    assert upgraded["deployment"] is None and all(row["deployed"] is False for row in upgraded["features"])
    assert "deployment" not in raw  # the caller's dict is left alone
    results = RunResults.model_validate(raw)
    assert results.schema_version == "1.7" and results.deployment is None


# ------------------------------------------------------------------------ adaptcheck grade


def test_grade_names_the_deployment_in_the_table_and_in_json(tmp_path: Path) -> None:
    d = make_deployment()
    path = tmp_path / "results.json"
    make_results().model_copy(update={"deployment": d}).save(path)
    done = invoke(["grade", str(path), "--format", "json"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["deployment"] == json.loads(d.model_dump_json())
    assert data["features"]["tensor_parallel"]["status"] == "not tested"
    lines = [line for line in done.stderr.splitlines() if line.startswith("Deployment: ")]
    assert lines == [f"Deployment: {d.summary()}"]
    assert d.digest[:12] in lines[0] and "--tensor-parallel-size 2" in lines[0]


def test_grade_of_a_file_without_deployment_says_adaptcheck_s_own(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    make_results().save(path)
    done = invoke(["grade", str(path), "--format", "json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deployment"] is None
    assert ("Deployment: adaptcheck's own deployment: embedded:tiny-llama at adaptcheck's settings; each check chose "
            "its own engine arguments. Give --serve to certify the command you deploy.") in done.stderr
