"""The deployment under test in the report and JUnit (issue 38): the first screen names the --serve
command (escaped), its engine, TP/PP, context length, KV-cache dtype, mode and digest, and the
features it deploys, which the features table marks; without a deployment it says in one sentence
that the grade is for adaptcheck's own settings. Every verdict whose evidence records the engine's
mode says it: "(eager)" or "(compiled)" on the check's row, its entry on the details page and the
features and families tables' cells."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import xmlschema

from adaptcheck.base.schemas.certificate import OWN_DEPLOYMENT
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.report.junit import GRADE_SUITE, junit_xml
from adaptcheck.report.mode import check_mode
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view
from adaptcheck.runfolder import regrade

from .factory import PLANNED, XSS_SCRIPT, make_deployment, make_results, own_deployment
from .test_render import _parse

SCHEMA = xmlschema.XMLSchema11(Path(__file__).parent / "data" / "junit.xsd")
EAGER_VLLM: dict[str, Any] = {"name": "vllm", "loaded": True, "display_name": "vLLM", "enforce_eager": True}
COMPILED_VLLM: dict[str, Any] = {**EAGER_VLLM, "enforce_eager": False}
DEFAULT_VLLM: dict[str, Any] = {**EAGER_VLLM, "enforce_eager": None}  # compile left to the engine's default


def _step4(cid: str, kind: str, framework: dict[str, Any], *, tags: list[str] | None = None,
           feature: dict[str, Any] | None = None, status: Status = Status.PASS) -> CheckResult:
    details: dict[str, Any] = {"framework": dict(framework)}
    if feature is not None:
        details["feature"] = feature
    return CheckResult(step=4, id=cid, kind=kind, status=status, message="", duration_s=1.0, tags=tags or [],
                       details=details)


MODE_CHECKS = [
    _step4("framework.vllm.load", "framework.load", EAGER_VLLM),
    # framework.compile's plain instance is eager; the verdict is about the compiled one it read back.
    _step4("framework.vllm.compile", "framework.compile", EAGER_VLLM, tags=["feature:graph_capture"],
           feature={"feature": "graph_capture", "active": True,
                    "engine": {"enforce_eager": False, "compilation_mode": "VLLM_COMPILE"}}),
    _step4("framework.vllm.kv_cache", "framework.kv_cache", EAGER_VLLM, tags=["feature:prefix_caching"]),
    # A served engine read back from its log: the compilation mode alone says it.
    _step4("framework.vllm_serve.spec", "framework.spec_decode", {"name": "vllm_serve", "loaded": True},
           tags=["feature:spec_decode"],
           feature={"feature": "spec_decode", "active": True, "engine": {"compilation_mode": "NONE"}}),
    # Nothing read back: not known, even though its plain instance says eager.
    _step4("framework.vllm.tp", "framework.tensor_parallel", EAGER_VLLM, tags=["feature:tensor_parallel"],
           feature={"feature": "tensor_parallel", "active": True, "engine": {}}),
    _step4("framework.vllm.moe", "framework.reference", COMPILED_VLLM, tags=["family:moe"]),
    _step4("framework.vllm.default", "framework.single_request", DEFAULT_VLLM),
    _step4("framework.transformers.load", "framework.load", {"name": "transformers", "loaded": True}),
]


def _with_mode_checks(deployment: Any = None) -> RunResults:
    base = make_results()
    planned = PLANNED + [PlannedCheck(id=c.id, step=4, kind=c.kind, tags=c.tags, timeout_s=60) for c in MODE_CHECKS]
    checks = [c for c in base.checks if c.step != 4] + MODE_CHECKS
    return regrade(base.model_copy(update={"planned": planned, "checks": checks, "deployment": deployment}))


def _first_screen(page: str) -> str:
    """The grade section up to the blockers: what the page shows before anything else."""
    start = page.index('<section id="grade"')
    return page[start:page.index('class="blockers"', start)]


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).replace("&#39;", "'")


# ------------------------------------------------------------------------ the first screen


def test_first_screen_names_the_command_its_facts_and_digest_under_the_grade() -> None:
    d = make_deployment()
    page = render(build_view(_with_mode_checks(d)))
    screen = _first_screen(page)
    assert screen.index('class="grade') < screen.index('id="deployment"')
    text = _text(screen[screen.index('id="deployment"'):])
    assert "vllm serve /models/qwen --tensor-parallel-size 2 --max-model-len 32768 --kv-cache-dtype fp8" in text
    for fact in ("engine vllm 0.32.0", "TP / PP 2 / 1", "max_model_len 32768", "KV cache fp8",
                 "mode compiled", f"digest {d.digest[:12]}"):
        assert fact in text, fact
    assert d.digest[12:] not in text  # the short digest is shown, the whole one is its title
    assert f'title="{d.digest}"' in screen
    assert "Deployed features: tensor_parallel, fp8_kv_cache, graph_capture" in text
    assert OWN_DEPLOYMENT.split(":")[0] not in screen


def test_the_command_is_user_text_and_is_escaped() -> None:
    page = render(build_view(_with_mode_checks(make_deployment())))
    assert XSS_SCRIPT not in page
    assert "--served-model-name &#39;&lt;script&gt;alert(1)&lt;/script&gt;&#39;" in _first_screen(page)
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    assert parsed.tags.count("script") == 1  # the print helper only


def test_a_file_without_deployment_says_it_is_adaptcheck_s_own_in_one_sentence() -> None:
    results = make_results()
    assert results.deployment is None
    screen = _first_screen(render(build_view(results)))
    own = OWN_DEPLOYMENT.format(model=results.model.name)
    assert own in _text(screen)
    assert "Deployed features" not in screen and "<pre" not in screen


def test_adaptcheck_s_own_deployment_names_its_model() -> None:
    results = make_results().model_copy(update={"deployment": own_deployment("pretrained:auto")})
    view = build_view(results)
    assert not view.deployment.given and view.deployment.facts == []
    assert view.deployment.own == ("adaptcheck's own deployment: pretrained:auto at adaptcheck's settings; each check "
                                   "chose its own engine arguments. Give --serve to certify the command you deploy.")


def test_features_table_marks_the_deployed_rows() -> None:
    view = build_view(_with_mode_checks(make_deployment()))
    deployed = {f.name for f in view.features if f.deployed}
    assert deployed == {"tensor_parallel", "fp8_kv_cache", "graph_capture"}
    page = render(view)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr[^>]*><th scope=\"row\"><code>(\w+)</code>.*?</tr>", page)}
    assert 'class="badge">deployed<' in rows["graph_capture"] and 'class="deployed"' in rows["graph_capture"]
    assert "deployed" not in rows["prefix_caching"]  # tested, not deployed
    # Without a deployment no row is.
    assert not any(f.deployed for f in build_view(_with_mode_checks(own_deployment())).features)


# ------------------------------------------------------------------------ the mode each verdict holds for


def test_check_mode_is_read_from_the_evidence() -> None:
    modes = {c.id: check_mode(c) for c in MODE_CHECKS}
    assert modes == {
        "framework.vllm.load": "eager",
        "framework.vllm.compile": "compiled",  # the feature instance, not the plain eager one
        "framework.vllm.kv_cache": "eager",
        "framework.vllm_serve.spec": "eager",  # compilation mode NONE
        "framework.vllm.tp": None,  # its feature instance records nothing: never guessed from the plain one
        "framework.vllm.moe": "compiled",
        "framework.vllm.default": None,  # enforce_eager left to the engine: the evidence does not say
        "framework.transformers.load": None,
    }


def test_rows_and_table_cells_say_the_mode_their_verdict_holds_for() -> None:
    view = build_view(_with_mode_checks(make_deployment()))
    rows = {r.id: r.mode for b in view.framework.frameworks for r in b.checks}
    assert rows["framework.vllm.load"] == "eager" and rows["framework.vllm.compile"] == "compiled"
    assert rows["framework.vllm.tp"] == "" and rows["framework.transformers.load"] == ""
    features = {f.name: f.mode for f in view.features}
    assert features["graph_capture"] == "compiled" and features["prefix_caching"] == "eager"
    assert features["tensor_parallel"] == "" and features["long_context"] == ""
    families = {f.name: f.mode for f in view.families}
    assert families["moe"] == "compiled"
    entries = {c.id: c.mode for g in view.check_groups for c in g.checks}
    assert entries["framework.vllm.kv_cache"] == "eager" and entries["smoke.matmul"] == ""

    page = render(view)
    assert re.search(r"certified</span> <span class=\"mode\">\(compiled\)</span>", page)
    assert re.search(r"certified</span> <span class=\"mode\">\(eager\)</span>", page)
    details = render(view, page="details")
    entry = details[details.index('id="check-framework.vllm.kv_cache"'):]
    assert '<span class="mode">(eager)</span>' in entry[:entry.index("</div>")]


def test_a_failed_row_names_the_mode_of_the_failure() -> None:
    checks = list(MODE_CHECKS)
    checks[2] = checks[2].model_copy(update={"status": Status.FAIL, "message": "prefix hit differs"})
    # A compiled pass beside it: the row failed, and it failed eager.
    checks.append(_step4("framework.vllm.kv_cache_compiled", "framework.kv_cache", COMPILED_VLLM,
                         tags=["feature:prefix_caching"]))
    base = _with_mode_checks()
    results = regrade(base.model_copy(update={"checks": [c for c in base.checks if c.step != 4] + checks}))
    row = next(f for f in build_view(results).features if f.name == "prefix_caching")
    assert (row.status.label, row.mode) == ("failed", "eager")


# ------------------------------------------------------------------------ JUnit


def _grade_suite(xml: str) -> tuple[dict[str, str], list[str]]:
    SCHEMA.validate(xml)
    suite = next(s for s in ET.fromstring(xml) if s.get("name") == GRADE_SUITE)
    props = {p.get("name", ""): p.get("value", "") for p in suite.iter("property")}
    out = suite.find("testcase/system-out")
    assert out is not None and out.text is not None
    return props, out.text.splitlines()


def test_junit_grade_suite_carries_the_deployment_as_properties() -> None:
    d = make_deployment()
    props, lines = _grade_suite(junit_xml(_with_mode_checks(d), "L1"))
    assert props["adaptcheck.deployment.source"] == "user"
    assert props["adaptcheck.deployment.command"] == (
        "vllm serve /models/qwen --tensor-parallel-size 2 --max-model-len 32768 --kv-cache-dtype fp8 "
        f"--served-model-name '{XSS_SCRIPT}'")
    assert props["adaptcheck.deployment.digest"] == d.digest
    assert (props["adaptcheck.deployment.engine"], props["adaptcheck.deployment.engine_version"]) == ("vllm", "0.32.0")
    assert props["adaptcheck.deployment.tensor_parallel_size"] == "2"
    assert props["adaptcheck.deployment.pipeline_parallel_size"] == "1"
    assert props["adaptcheck.deployment.max_model_len"] == "32768"
    assert props["adaptcheck.deployment.kv_cache_dtype"] == "fp8"
    assert props["adaptcheck.deployment.compile_mode"] == "compiled"
    assert props["adaptcheck.deployment"] == d.summary()
    assert f"deployment: {d.summary()}" in lines


def test_junit_without_deployment_says_so() -> None:
    props, lines = _grade_suite(junit_xml(make_results()))
    assert props["adaptcheck.deployment.source"] == "none"
    assert props["adaptcheck.deployment"] == OWN_DEPLOYMENT.format(model="embedded:tiny-llama")
    assert f"deployment: {OWN_DEPLOYMENT.format(model='embedded:tiny-llama')}" in lines
    assert "adaptcheck.deployment.digest" not in props
    props, _ = _grade_suite(junit_xml(make_results().model_copy(update={"deployment": own_deployment()})))
    assert props["adaptcheck.deployment.source"] == "adaptcheck"
    assert props["adaptcheck.deployment"].startswith("adaptcheck's own deployment: embedded:tiny-llama")


def test_the_run_report_s_comparison_names_a_baseline_of_another_deployment() -> None:
    """The perf.regression result's comparison, rendered in the run report: the skip says why, and the
    section lists what differs."""
    from adaptcheck.compare import ComparePolicy, compare_results
    from adaptcheck.steps.perf.regression import verdict
    from tests.compare.helpers import load_pair

    baseline, rerun = load_pair()
    baseline.deployment = make_deployment(engine_args={"tensor_parallel_size": 1}, tensor_parallel_size=1)
    rerun.deployment = make_deployment()
    out = verdict(compare_results(baseline, rerun, ComparePolicy()), require_perf=True)
    check = CheckResult(step=5, id="perf.regression", kind="perf.regression", status=out.status,
                        applicable=out.applicable, message=out.message, details=out.details, duration_s=0.1)
    results = rerun.model_copy(update={"checks": [*rerun.checks, check]})
    page = render(build_view(results))
    section = page[page.index('<section id="compare"'):]
    section = section[:section.index("</section>")]
    assert "Not comparable." in section and "the baseline certified another deployment" in section
    table = section[section.index("Deployment changes"):section.index("Improvements")]
    assert "<code>tensor_parallel_size</code></td><td><code>1</code></td><td><code>2</code>" in table
    assert XSS_SCRIPT not in page
