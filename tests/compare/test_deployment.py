"""A change of the deployment under test between two runs (issue 38): the comparison names it, fact
by fact (``tensor_parallel_size 1 → 2``, ``command digest … → …``), in its document, the text of
``adaptcheck compare`` and its HTML page, and the runs are then not comparable — ``perf.regression``
skips with "the baseline certified another deployment (…)", never a pass nor a failure. The same
command under another engine version is the same deployment (docs/compare.md, "Different
deployments")."""

from __future__ import annotations

import json
from pathlib import Path

from adaptcheck.base.schemas.deployment import Deployment
from adaptcheck.base.schemas.results import RunResults, Status
from adaptcheck.compare import ComparePolicy, Comparison, compare_results
from adaptcheck.compare.deployment import ANOTHER_DEPLOYMENT
from adaptcheck.ladder.check import CheckContext
from adaptcheck.report.comparison import build_compare_view
from adaptcheck.report.render import write_compare_report
from adaptcheck.runfolder import BASELINE, JOURNAL, LADDER_SNAPSHOT, RUN_META, RunMeta
from adaptcheck.steps.perf.regression import RegressionCheck, RegressionParams, verdict
from tests.compare.helpers import load_pair, sealed_text, write_sealed
from tests.conftest import ladder_text
from tests.inprocess import invoke
from tests.report.factory import make_deployment, own_deployment

POLICY = ComparePolicy()
TP1 = make_deployment(engine_args={"tensor_parallel_size": 1}, tensor_parallel_size=1)
TP2 = make_deployment()  # the same command at TP 2


def _pair(before: Deployment | None, after: Deployment | None) -> tuple[RunResults, RunResults]:
    baseline, rerun = load_pair()
    baseline.deployment, rerun.deployment = before, after
    return baseline, rerun


def _changes(c: Comparison) -> dict[str, tuple[str | None, str | None]]:
    assert c.deployment is not None
    return {e.what: (e.before, e.after) for e in c.deployment.changes}


def test_a_tp_change_is_named_and_makes_the_runs_not_comparable() -> None:
    c = compare_results(*_pair(TP1, TP2), POLICY)
    changes = _changes(c)
    assert changes["tensor_parallel_size"] == ("1", "2")
    assert changes["command digest"] == (TP1.digest[:12] + "…", TP2.digest[:12] + "…")
    assert changes["features"] == ("fp8_kv_cache,graph_capture", "tensor_parallel,fp8_kv_cache,graph_capture")
    # An argument the deployment has as a field of its own is not listed twice.
    assert "engine_args.tensor_parallel_size" not in changes and "engine" not in changes
    assert c.deployment is not None and c.deployment.line.startswith(
        f"{ANOTHER_DEPLOYMENT} (tensor_parallel_size 1 → 2; ")
    assert (c.deployment.before_digest, c.deployment.after_digest) == (TP1.digest, TP2.digest)
    assert not c.comparable and c.not_comparable_reason.startswith(c.deployment.line)
    assert c.verdict.startswith("NOT COMPARABLE (another deployment); ")
    assert c.counts.deployment_changes == len(c.deployment.changes) and c.counts.perf_compared >= 40  # still compared
    assert c.environment == compare_results(*_pair(None, None), POLICY).environment  # not an environment change


def test_an_engine_argument_change_is_named_by_its_name() -> None:
    chunked = make_deployment(engine_args={"enable_chunked_prefill": False, "max_num_seqs": 64})
    changes = _changes(compare_results(*_pair(TP2, chunked), POLICY))
    assert changes["engine_args.enable_chunked_prefill"] == (None, "false")
    assert changes["engine_args.max_num_seqs"] == (None, "64")


def test_the_same_command_is_the_same_deployment_even_on_another_engine_version() -> None:
    upgraded = TP2.model_copy(update={"engine_version": "0.33.0", "command": [*TP2.command, "--port", "8001"]})
    c = compare_results(*_pair(TP2, upgraded), POLICY)
    assert c.deployment is None and c.comparable and c.counts.deployment_changes == 0
    assert c.new.deployment == upgraded.summary() and c.baseline.deployment == TP2.summary()


def test_given_against_none_is_a_change_and_own_against_none_is_not() -> None:
    c = compare_results(*_pair(None, TP2), POLICY)
    changes = _changes(c)
    assert list(changes) == ["deployment", "command digest"]
    assert changes["deployment"][0] == "adaptcheck's own" and changes["deployment"][1].startswith("vllm serve")
    assert changes["command digest"] == (None, TP2.digest[:12] + "…")
    assert not c.comparable
    back = _changes(compare_results(*_pair(TP2, own_deployment()), POLICY))
    assert back["deployment"] == (changes["deployment"][1], "adaptcheck's own")
    assert back["command digest"] == (TP2.digest[:12] + "…", None)
    # adaptcheck's own deployment, recorded or not (a file older than 1.7): the same.
    for before, after in ((None, own_deployment()), (own_deployment(), None), (None, None)):
        c = compare_results(*_pair(before, after), POLICY)
        assert c.deployment is None and c.comparable


def test_the_document_round_trips_and_the_html_page_shows_the_table(tmp_path: Path) -> None:
    c = compare_results(*_pair(TP1, TP2), POLICY)
    path = tmp_path / "comparison.json"
    c.save(path)
    assert Comparison.load(path) == c
    view = build_compare_view(c)
    assert ("tensor_parallel_size", "1", "2", "changed") in {(e.what, e.before, e.after, e.change)
                                                            for e in view.deployment}
    page = tmp_path / "compare.html"
    write_compare_report(c, page)
    html = page.read_text(encoding="utf-8")
    table = html[html.index("Deployment changes"):html.index("Improvements")]
    assert "<code>tensor_parallel_size</code>" in table and "<code>command digest</code>" in table
    assert "&lt;script&gt;" in html and "<script>alert" not in html  # the commands' hostile word, escaped
    assert "Not comparable." in html and ANOTHER_DEPLOYMENT in html
    # The same deployment: the page says which one both certified.
    same = build_compare_view(compare_results(*_pair(TP2, TP2), POLICY))
    assert same.deployment == [] and same.deployment_same == TP2.summary()


def test_compare_prints_the_change_and_carries_it_in_json(tmp_path: Path) -> None:
    baseline, rerun = _pair(TP1, TP2)
    a, b = write_sealed(baseline, tmp_path / "a.json"), write_sealed(rerun, tmp_path / "b.json")
    done = invoke(["compare", str(a), str(b), "--format", "json"])
    data = json.loads(done.stdout)
    assert data["comparable"] is False and data["deployment"]["changes"][0]["what"] == "tensor_parallel_size"
    warning = next(line for line in done.stderr.splitlines() if line.startswith("WARNING: not comparable"))
    assert "tensor_parallel_size 1 → 2" in warning and "command digest" in warning
    assert "NOT COMPARABLE (another deployment)" in done.stderr


# ------------------------------------------------------------------------ perf.regression


def test_perf_regression_skips_a_baseline_of_another_deployment() -> None:
    out = verdict(compare_results(*_pair(TP1, TP2), POLICY), require_perf=True)
    assert (out.status, out.applicable) == (Status.SKIP, True)  # blocks L5, never a pass
    assert out.message.startswith(f"{ANOTHER_DEPLOYMENT} (tensor_parallel_size 1 → 2; ")
    # Against the same deployment it judges the figures as before.
    assert verdict(compare_results(*_pair(TP2, TP2), POLICY), require_perf=True).status is Status.PASS


def test_perf_regression_with_a_planted_regression_still_skips_another_deployment() -> None:
    baseline, rerun = _pair(TP1, TP2)
    next(c for c in rerun.checks if c.id == "ops.gemm.bf16").metrics["ratio_to_tolerance"] *= 3
    out = verdict(compare_results(baseline, rerun, POLICY), require_perf=True)
    assert out.status is Status.SKIP and ANOTHER_DEPLOYMENT in out.message


def test_perf_regression_in_a_run_folder_names_the_baseline_s_deployment(tmp_path: Path) -> None:
    """The check as a run calls it: the baseline was given --serve, this run was not."""
    baseline, rerun = _pair(TP2, None)
    meta = RunMeta(run_id="20261130-000000-cpu-test", started_at=rerun.started_at, command=["adaptcheck", "run"],
                   ladder=rerun.ladder, seed=0, steps=[1, 2, 3, 4, 5], device=rerun.device)
    (tmp_path / RUN_META).write_text(meta.model_dump_json())
    (tmp_path / LADDER_SNAPSHOT).write_text(ladder_text([{"id": "recorded", "step": 5, "kind": "dummy.skip"},
                                                         {"id": "perf.regression", "step": 5,
                                                          "kind": "perf.regression"}]))
    from adaptcheck.ladder.runner import JournalWriter

    JournalWriter(tmp_path / JOURNAL).append("recorded", [c for c in rerun.checks if c.kind != "perf.regression"])
    (tmp_path / BASELINE).write_text(sealed_text(baseline))
    from adaptcheck.backends.cpu import CpuBackend
    from adaptcheck.base.schemas.ladder import ModelSpec

    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec(),
                       check_id="perf.regression")
    out = RegressionCheck().run(ctx, RegressionParams())
    assert not isinstance(out, list)
    assert (out.status, out.applicable) == (Status.SKIP, True)
    assert out.message.startswith(f"{ANOTHER_DEPLOYMENT} (deployment vllm serve /models/qwen ")
    assert "→ adaptcheck's own" in out.message
    assert Comparison.from_data(out.details, "details").deployment is not None
