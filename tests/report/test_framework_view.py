"""The step-4 section: one block per framework, numbers in words, sub-checks, platform, collectives.

``data/vllm-results.json`` is the results file of a real run of vLLM 0.32 (CPU platform) on
the embedded tiny-llama: the shapes the section reads are the ones the checks write.
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from adaptcheck.base.errors import UnknownNameError
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.ladder.check import Check
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.report.framework import (
    MAX_DIVERGENCES,
    FrameworkBlock,
    FrameworkView,
    FwCheckRow,
    build_framework,
    framework_of,
)
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view

from .factory import PLANNED, XSS_ATTR, XSS_SCRIPT, make_results
from .test_render import _parse

REAL = Path(__file__).parent / "data" / "vllm-results.json"


def _real() -> RunResults:
    return RunResults.load(REAL)


def _real_raw() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(REAL.read_text(encoding="utf-8"))
    return raw


def _block(view: FrameworkView, name: str) -> FrameworkBlock:
    return next(b for b in view.frameworks if b.name == name)


def _row(view: FrameworkView, cid: str) -> FwCheckRow:
    return next(r for b in view.frameworks for r in b.checks if r.id == cid)


def _text(html: str) -> str:
    """Visible text with tags dropped and whitespace collapsed (what a reader sees)."""
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", html)))


def _section(page: str) -> str:
    return page[page.index('<section id="framework"'):page.index('<section id="reproduce"')]


def _fw(name: str, **extra: Any) -> dict[str, Any]:
    """``details.framework`` of a loaded instance (schema 1.3: FrameworkInfo with describe()'s facts)."""
    return {"name": name, "loaded": True, "display_name": f"{name} (test)", "load_s": 3.5,
            "loaded_by": f"framework.{name}.load", "framework": name, **extra}


def _not_loaded(name: str) -> dict[str, Any]:
    """``details.framework`` of an instance that did not load: the same shape, the name only."""
    return {"name": name, "loaded": False}


def _step4(cid: str, kind: str, status: Status = Status.PASS, *, details: dict[str, Any] | None = None,
           metrics: dict[str, Any] | None = None, message: str = "", applicable: bool = True) -> CheckResult:
    """A step-4 result as the runner records it: with its kind's label and what it compares."""
    try:
        cls: type[Check] | None = get_check_class(kind)
    except UnknownNameError:
        cls = None
    return CheckResult(step=4, id=cid, kind=kind, status=status, applicable=applicable, message=message,
                       kind_label=cls.label if cls else None, compares=cls.compares if cls else None,
                       details=details or {}, metrics=metrics or {}, duration_s=1.0)


def _results(checks: list[CheckResult], **kw: Any) -> RunResults:
    base = [c for c in make_results().checks if c.step != 4]
    return make_results(checks=base + checks, **kw)


def _view(results: RunResults) -> FrameworkView:
    return build_view(results).framework


# ---------------------------------------------------------------- the real vLLM run


def test_real_run_gives_one_vllm_block_with_facts_model_and_load() -> None:
    view = _view(_real())
    assert view.ran and [b.name for b in view.frameworks] == ["vllm"] and view.collectives == []
    b = view.frameworks[0]
    assert b.display_name == "vLLM (offline LLM API, in process)" and b.anchor == "fw-vllm" and b.loaded
    assert b.load_time == "44.2 s"
    assert b.loaded_by is not None and (b.loaded_by.id, b.loaded_by.anchor) == ("fw.vllm.load", "check-fw.vllm.load")
    facts = {f.label: f.value for f in b.facts}
    assert facts["vLLM version"] == "0.32.0" and facts["dtype"] == "bf16" and facts["tensor parallel size"] == "1"
    assert facts["prefix caching"] == "not set"  # None: left to vLLM's default, not 'false'
    model = {f.label: f.value for f in b.model}
    assert model["model"] == "embedded:tiny-llama" and model["architecture"] == "LlamaForCausalLM (llama)"
    assert model["shape"] == "2 layers, head_dim 64, vocab 1024"
    assert model["weights sha256"].startswith("9c37530b")
    assert [r.id for r in b.checks] == ["fw.vllm.load", "fw.vllm.single", "fw.vllm.ref", "fw.vllm.conc", "fw.vllm.kv"]
    assert [(c.status.key, c.count) for c in b.counts] == [("pass", 5)]


def test_real_run_numbers_in_words() -> None:
    view = _view(_real())
    assert _row(view, "fw.vllm.ref").summary[0] == \
        "9 prompts: 5 identical, 4 diverged within top-5, 0 failed; token agreement 61.8%"
    assert "reference fp64 on CPU" in _row(view, "fw.vllm.ref").summary[1]
    # The concurrent check compares with a near-tie margin, not top-N: the words say so.
    assert _row(view, "fw.vllm.conc").summary[0] == \
        "8 prompts: 8 identical, 0 diverged within the tie margin 0.5, 0 failed; token agreement 100.0%"
    assert _row(view, "fw.vllm.load").summary == ["loaded in 44.2 s; model generated in 22.7 s"]
    assert _row(view, "fw.vllm.kv").summary == ["4 rounds of 6 requests; KV-cache usage 0 → 0; resident memory grew 0.1 MiB"]
    assert _row(view, "fw.vllm.single").summary == ["7 requests"]


def test_real_run_diverging_prompts_are_listed_with_why() -> None:
    ref = _row(_view(_real()), "fw.vllm.ref")
    assert [d.prompt for d in ref.divergences] == ["0", "1", "4", "7"]  # the identical ones are left out
    assert all(d.status.key == "pass" for d in ref.divergences)
    assert ref.divergences[0].text == ("same first 8 tokens, then token 548 vs 358 (each in the other's top-5, "
                                       "logprob gap 0.0035); lengths 12 vs 32")
    assert _row(_view(_real()), "fw.vllm.conc").divergences == []


def test_real_run_subchecks_and_not_run_row() -> None:
    conc = _row(_view(_real()), "fw.vllm.conc")
    assert [(s.name, s.status.key) for s in conc.subchecks] == [
        ("alone vs in a batch of 8", "pass"), ("usage counts in the batch", "pass"), ("stream vs non-stream", "notrun")]
    stream = conc.subchecks[2]
    assert stream.status.label == "not run" and stream.status.glyph != "✓"
    assert stream.detail == "vLLM (offline LLM API, in process) has no streaming API"
    # Extra keys of a row are kept as evidence, not dropped.
    single = _row(_view(_real()), "fw.vllm.single")
    assert "(includes_stop_string=false)" in single.subchecks[6].detail


def test_real_run_platform_resolution() -> None:
    pf = _view(_real()).frameworks[0].platform
    assert pf is not None and pf.platform == "vllm.platforms.cpu.CpuPlatform" and pf.device_type == "cpu"
    outcomes = {p.name: (p.outcome.label, p.chosen) for p in pf.plugins}
    assert outcomes == {"tpu": ("declined", False), "cuda": ("declined", False), "rocm": ("declined", False),
                        "xpu": ("declined", False), "cpu": ("answered, chosen", True)}
    assert [g.label for g in pf.general_plugins] == ["adaptcheck_dummy", "lora_filesystem_resolver",
                                                     "lora_hf_hub_resolver"]
    assert pf.note == ""
    # Platform and device type sit with the table, not twice in the facts.
    assert not {"platform", "device type"} & {f.label for f in _view(_real()).frameworks[0].facts}


def test_real_run_renders_the_section() -> None:
    page = render(build_view(_real()))
    section = _section(page)
    text = _text(section)
    assert "Framework bring-up" in text and "vLLM (offline LLM API, in process)" in text
    assert "9 prompts: 5 identical, 4 diverged within top-5, 0 failed; token agreement 61.8%" in text
    assert "· not run stream vs non-stream" in text and "✓ pass stream vs non-stream" not in text
    assert "✓ answered, chosen" in text and 'class="fw-chosen"' in section
    assert "loaded in 44.2 s by fw.vllm.load" in text
    for cid in ("fw.vllm.load", "fw.vllm.single", "fw.vllm.ref", "fw.vllm.conc", "fw.vllm.kv"):
        # Check entries are on the details page.
        assert f'<a href="report-details.html#check-{cid}"><code>{cid}</code></a>' in section
    assert '<li><a href="#framework">Framework bring-up</a></li>' in page


# ---------------------------------------------------------------- grouping


def test_grouping_by_the_evidence_framework_name() -> None:
    checks = [
        _step4("framework.vllm.load", "framework.load", details={"framework": _fw("vllm")}),
        _step4("framework.transformers.load", "framework.load", Status.SKIP, applicable=False,
               details={"framework": _not_loaded("transformers")}, message="transformers: not installed"),
        # A ladder id that does not follow the convention: the evidence decides.
        _step4("fw-a.b.c", "framework.reference", details={"framework": _fw("vllm")}),
        # Worker crashed: the runner wrote the kind's identity (Check.identity), the framework's name.
        _step4("framework.vllm_serve.reference", "framework.reference", Status.ERROR,
               details={"framework": _not_loaded("vllm_serve")}, message="worker crashed: SIGKILL (out of memory?)"),
        _step4("framework.vllm.moe.reference", "framework.reference", Status.ERROR, message="boom",
               details={"framework": _not_loaded("vllm")}),
        _step4("framework.myplugin.load", "framework.load", details={"framework": _fw("acme_fw", acme="2.1")}),
    ]
    view = _view(_results(checks))
    names = [b.name for b in view.frameworks]
    # First-appearance order; the factory's two-segment 'framework.batch' names no framework.
    assert names == ["vllm", "transformers", "vllm_serve", "acme_fw", "unknown"]
    assert [r.id for r in _block(view, "vllm").checks] == ["framework.vllm.load", "fw-a.b.c",
                                                           "framework.vllm.moe.reference"]
    tf = _block(view, "transformers")
    assert not tf.loaded and tf.facts == [] and tf.checks[0].status.key == "na"
    assert {f.label: f.value for f in _block(view, "acme_fw").facts}["acme"] == "2.1"  # plugin facts kept


def test_a_result_without_evidence_is_unknown_not_guessed_from_its_id() -> None:
    """The id's second segment is no longer read: only the loader upgrades files that lacked it."""
    bare = _step4("framework.vllm.load", "framework.load", Status.ERROR, message="boom")
    assert framework_of(bare) == "unknown"
    assert framework_of(_step4("a.b.c", "framework.load", details={"framework": {"name": ""}})) == "unknown"
    assert framework_of(_step4("a.b.c", "framework.load", details={"framework": _not_loaded("vllm")})) == "vllm"


def test_a_failed_load_shows_its_framework_name_from_the_evidence() -> None:
    """A failed load names its framework in the evidence; the id says nothing of it here."""
    failed = _step4("bringup.first", "framework.load", Status.ERROR, message="vllm: no platform detected",
                    details={"framework": _not_loaded("vllm")})
    view = _view(_results([failed]))
    block = _block(view, "vllm")
    assert not block.loaded and block.display_name == "vllm" and [r.id for r in block.checks] == ["bringup.first"]
    assert "vllm" in _text(_section(render(build_view(_results([failed])))))


def test_crashed_check_without_details_is_still_listed() -> None:
    crashed = _step4("framework.vllm_serve.reference", "framework.reference", Status.ERROR,
                     message="worker crashed: SIGKILL (out of memory?)")
    view = _view(_results([crashed]))
    row = _row(view, crashed.id)
    assert row.status.key == "error" and row.message == "worker crashed: SIGKILL (out of memory?)"
    assert row.anchor == "check-framework.vllm_serve.reference"
    assert row.summary == [] and row.subchecks == [] and row.divergences == []
    text = _text(_section(render(build_view(_results([crashed])))))
    assert "! error" in text and "worker crashed: SIGKILL (out of memory?)" in text
    assert "not loaded" in text


def test_check_on_another_instance_says_so() -> None:
    other = _fw("vllm", loaded_by="framework.vllm.kv_cache", load_s=12.0)
    view = _view(_results([
        _step4("framework.vllm.load", "framework.load", details={"framework": _fw("vllm")}),
        _step4("framework.vllm.kv_cache", "framework.kv_cache", details={"framework": other}),
    ]))
    assert _row(view, "framework.vllm.load").instance == ""
    assert _row(view, "framework.vllm.kv_cache").instance == "own instance: loaded by framework.vllm.kv_cache in 12.0 s"


# ---------------------------------------------------------------- sub-checks and comparisons


def test_subcheck_ok_only_true_is_a_pass() -> None:
    rows: list[Any] = [{"name": "held", "ok": True, "detail": ""}, {"name": "broke", "ok": False, "detail": "wrong"},
                       {"name": "n/a here", "ok": None, "detail": "no streaming"}, {"name": "missing"}]
    view = _view(_results([_step4("framework.vllm.single", "framework.single_request",
                                  details={"framework": _fw("vllm"), "subchecks": rows})]))
    got = [(s.name, s.status.key, s.status.label) for s in _row(view, "framework.vllm.single").subchecks]
    assert got == [("held", "pass", "pass"), ("broke", "fail", "fail"), ("n/a here", "notrun", "not run"),
                   ("missing", "notrun", "not run")]
    # A verdict that is not a literal boolean, or a row that is not one, does not fit the evidence:
    # the check is still listed (under its framework), without rows, and nothing reads as a pass.
    for odd in ({"name": "odd", "ok": "yes"}, {"name": "odd", "ok": 1}, "not a row"):
        view = _view(_results([_step4("framework.vllm.single", "framework.single_request",
                                      details={"framework": _fw("vllm"), "subchecks": [*rows, odd]})]))
        row = _row(view, "framework.vllm.single")
        assert row.subchecks == [] and row.status.key == "pass"


def test_failed_comparison_shows_its_reason_and_caps_the_list() -> None:
    bad = {"index": 3, "ok": False, "exact": False, "common_prefix": 4, "len_a": 16, "len_b": 16, "divergence": 4,
           "token_a": 7, "token_b": 9, "b_in_top_a": False, "a_in_top_b": False, "gap_a": 2.5,
           "reason": "prompt 3: token 4 is 9 instead of 7, not in the other's top-5"}
    many = [dict(bad, index=i) for i in range(MAX_DIVERGENCES + 3)]
    metrics = {"sequences": 30, "sequences_exact": 7, "sequences_diverged_within_top_n": 0, "sequences_failed": 23,
               "token_agreement": 0.25, "top_n": 5}
    view = _view(_results([_step4("framework.vllm.reference", "framework.reference", Status.FAIL,
                                  details={"framework": _fw("vllm"), "comparison": many}, metrics=metrics)]))
    row = _row(view, "framework.vllm.reference")
    assert row.summary[0] == "30 prompts: 7 identical, 0 diverged within top-5, 23 failed; token agreement 25.0%"
    assert len(row.divergences) == MAX_DIVERGENCES and row.divergences_more == 3
    d = row.divergences[0]
    assert d.status.key == "fail"
    assert d.text.startswith("prompt 3: token 4 is 9 instead of 7, not in the other's top-5 — same first 4 tokens")
    assert "not in the other's top-5" in d.text and "logprob gap 2.5000" in d.text
    text = _text(_section(render(build_view(_results([_step4("framework.vllm.reference", "framework.reference",
                                                              Status.FAIL,
                                                              details={"framework": _fw("vllm"), "comparison": many},
                                                              metrics=metrics)])))))
    assert f"{MAX_DIVERGENCES + 3} diverging prompts" in text and "and 3 more" in text


def test_compile_and_tensor_parallel_variant_load_times() -> None:
    metrics = {"sequences": 4, "sequences_exact": 4, "sequences_diverged_within_top_n": 0, "sequences_failed": 0,
               "token_agreement": 1.0, "load_s[1 device]": 20.5, "load_s[2 devices]": 31.0}
    row = _row(_view(_results([_step4("framework.vllm.tensor_parallel", "framework.tensor_parallel",
                                      details={"framework": _fw("vllm")}, metrics=metrics)])),
               "framework.vllm.tensor_parallel")
    assert row.what == "tensor parallel vs one device"
    assert row.summary[-1] == "load time: 1 device 20.5 s, 2 devices 31.0 s"


# ---------------------------------------------------------------- endpoints and platforms


def test_endpoint_facts_and_capabilities() -> None:
    fw = _fw("vllm_serve", url="http://127.0.0.1:8123/v1", served_model="tiny", server_command="vllm serve /m --port 8123",
             server_log="/run/x/server.log", server_startup_s=41.25, server_pid=4242,
             capabilities={"completions": True, "chat": False, "rejected_fields": ["ignore_eos"],
                           "ignore_eos": "native", "system_fingerprint": None})
    b = _block(_view(_results([_step4("framework.vllm_serve.load", "framework.load", details={"framework": fw})])),
               "vllm_serve")
    facts = {f.label: (f.value, f.mono) for f in b.facts}
    assert facts["URL"] == ("http://127.0.0.1:8123/v1", True)
    assert facts["server command"] == ("vllm serve /m --port 8123", True) and facts["server startup"][0] == "41.2 s"
    caps = {f.label: f.value for f in b.capabilities}
    assert caps == {"completions": "yes", "chat": "no", "rejected_fields": "ignore_eos", "ignore_eos": "native",
                    "system_fingerprint": "—"}
    assert b.platform is None
    probe = _block(_view(_results([_step4("framework.endpoint.load", "framework.load",
                                          details={"framework": _fw("endpoint", capabilities={"probe_error": "503"})})])),
                   "endpoint")
    assert [(f.label, f.value) for f in probe.capabilities] == [("probe", "failed: 503")]


def test_platform_plugins_that_failed_were_skipped_or_lost() -> None:
    plugins = [
        {"name": "cuda", "source": "built-in", "answer": "vllm.platforms.cuda.CudaPlatform"},
        {"name": "ascend", "source": "vllm_ascend:register", "answer": "vllm_ascend.platform.NPUPlatform"},
        {"name": "broken", "source": "broken_pkg:register", "load_error": "ImportError: no module named torch_npu"},
        {"name": "flaky", "source": "flaky:register", "detect_error": "RuntimeError: driver"},
        {"name": "other", "source": "other:register", "skipped": "not in VLLM_PLUGINS"},
        {"name": "odd", "source": "odd:register"},
    ]
    fw = _fw("vllm", platform="vllm_ascend.platform.NPUPlatform", device_type="npu", platform_plugins=plugins)
    pf = _block(_view(_results([_step4("framework.vllm.load", "framework.load", details={"framework": fw})])),
                "vllm").platform
    assert pf is not None
    got = {p.name: (p.outcome.key, p.outcome.label, p.chosen) for p in pf.plugins}
    assert got == {"cuda": ("skip", "answered, not chosen", False), "ascend": ("pass", "answered, chosen", True),
                   "broken": ("error", "failed to load", False), "flaky": ("error", "detector raised", False),
                   "other": ("na", "skipped", False), "odd": ("notrun", "not asked", False)}
    assert next(p for p in pf.plugins if p.name == "broken").detail == "ImportError: no module named torch_npu"
    # vLLM on a platform no detector named (e.g. UnspecifiedPlatform): said, not hidden.
    fw2 = dict(fw, platform="vllm.platforms.interface.UnspecifiedPlatform")
    pf2 = _block(_view(_results([_step4("framework.vllm.load", "framework.load", details={"framework": fw2})])),
                 "vllm").platform
    assert pf2 is not None and "no detector's answer" in pf2.note and not any(p.chosen for p in pf2.plugins)


# ---------------------------------------------------------------- collectives


def _collectives(status: Status = Status.FAIL) -> CheckResult:
    table = [
        {"op": "all_reduce", "dtype": "fp32", "elements": 4096, "bytes_per_rank": 16384, "status": "ok", "time_s": 0.0012},
        {"op": "all_gather", "dtype": "bf16", "elements": 4096, "bytes_per_rank": 8192, "status": "mismatch",
         "time_s": 0.002, "ranks": {"1": {"mismatches": 3, "first_index": 17, "got": 5.0, "expected": 6.0}}},
        {"op": "all_to_all", "dtype": "fp32", "elements": 4096, "bytes_per_rank": 16384, "status": "unsupported",
         "time_s": None, "ranks": {"0": {"error": "NotImplementedError: all_to_all"}}},
        {"op": "broadcast", "dtype": "fp32", "elements": 4096, "bytes_per_rank": 16384, "status": "exploded",
         "time_s": None, "missing_ranks": [1]},
    ]
    ranks = [{"rank": 0, "exit": "exited with code 0", "killed": None},
             {"rank": 1, "exit": "killed by SIGKILL", "killed": "timeout", "stuck_at": "broadcast/fp32/4096"}]
    return _step4("framework.collectives", "framework.collectives", status, message="all_gather wrong on rank 1",
                  details={"table": table, "ranks": ranks, "skipped_dtypes": {"int8": "cpu does not declare int8"}},
                  metrics={"world_size": 2, "library": "gloo", "wall_s": 3.25})


def test_collectives_table() -> None:
    view = _view(_results([_collectives()]))
    assert view.frameworks[0].name == "unknown"  # the factory's framework.batch; collectives have no block
    (x,) = view.collectives
    assert (x.id, x.anchor, x.status.key) == ("framework.collectives", "check-framework.collectives", "fail")
    assert x.summary == "2 ranks over gloo; 4 op runs: 1 ok, 1 mismatch, 1 unsupported, 1 exploded; wall time 3.2 s"
    rows = {r.op: r for r in x.rows}
    assert (rows["all_reduce"].status.key, rows["all_reduce"].status.label) == ("pass", "ok")
    assert rows["all_reduce"].bytes_per_rank == "16 KiB" and rows["all_reduce"].time == "1 ms"
    assert rows["all_gather"].status.key == "fail"
    assert rows["all_gather"].problem == "rank 1: 3 wrong, first at [17] = 5 (expected 6)"
    assert rows["all_to_all"].status.label == "unsupported" and "NotImplementedError" in rows["all_to_all"].problem
    # A status this version does not know never reads as a pass.
    assert rows["broadcast"].status.key == "notrun" and rows["broadcast"].status.label == "exploded"
    assert rows["broadcast"].problem == "no report from rank 1"
    assert x.notes == ["dtype int8 not checked: cpu does not declare int8",
                       "rank 1 killed by SIGKILL (timeout), stuck at broadcast/fp32/4096"]
    text = _text(_section(render(build_view(_results([_collectives()])))))
    assert "Collectives" in text and "✗ mismatch" in text and "○ unsupported" in text


def test_collectives_skipped_without_table() -> None:
    skipped = _step4("framework.collectives", "framework.collectives", Status.SKIP, applicable=False,
                     message="collectives need more than one device", details={"device_count": 1})
    (x,) = _view(_results([skipped])).collectives
    assert x.status.key == "na" and x.rows == [] and x.summary == ""


# ---------------------------------------------------------------- empty and interrupted runs


@pytest.mark.parametrize("steps", [[1, 2], [1, 2, 3]])
def test_run_without_step4_says_not_run(steps: list[int]) -> None:
    view = build_view(make_results(steps=steps))
    assert view.framework.ran is False and view.framework.frameworks == []
    assert view.framework.not_run_status is not None and view.framework.not_run_status.key == "notrun"
    assert "step 4 not run" in view.framework.not_run_reason
    section = _section(render(view))
    assert "step 4 not run: it was not selected" in _text(section) and "fw-block" not in section


def test_step4_ran_without_framework_checks_is_na() -> None:
    results = make_results(checks=[c for c in make_results().checks if c.step != 4])
    results = results.model_copy(update={"planned": [p for p in PLANNED if p.step != 4]})
    view = build_framework(results, {})
    assert view.ran is False and view.not_run_status is not None and view.not_run_status.key == "na"
    assert view.not_run_reason == "step 4 ran but this ladder has no framework checks"


def test_planned_check_without_result_is_not_run() -> None:
    planned = [*PLANNED, PlannedCheck(id="framework.vllm.reference", step=4, kind="framework.reference", timeout_s=60),
               PlannedCheck(id="framework.collectives", step=4, kind="framework.collectives", timeout_s=60)]
    results = _results([_step4("framework.vllm.load", "framework.load", details={"framework": _fw("vllm")})],
                       complete=False).model_copy(update={"planned": planned})
    view = build_view(results).framework
    row = _row(view, "framework.vllm.reference")
    assert row.status.label == "not run" and "not reached" in row.message
    assert row.anchor == "check-framework.vllm.reference"
    assert [x.status.key for x in view.collectives] == ["notrun"]


# ---------------------------------------------------------------- escaping, anchors, plain data


def test_hostile_strings_are_escaped() -> None:
    fw = _fw(XSS_ATTR, display_name=XSS_SCRIPT, vllm=XSS_SCRIPT, capabilities={XSS_ATTR: XSS_SCRIPT},
             platform=XSS_ATTR, platform_plugins=[{"name": XSS_SCRIPT, "source": XSS_ATTR, "load_error": XSS_SCRIPT}],
             general_plugins=[{"name": XSS_ATTR, "source": XSS_SCRIPT}], **{XSS_SCRIPT: XSS_ATTR})
    details = {"framework": fw, "model": {"name": XSS_SCRIPT, "path": XSS_ATTR},
               "subchecks": [{"name": XSS_ATTR, "ok": False, "detail": XSS_SCRIPT}],
               "comparison": [{"index": XSS_ATTR, "ok": False, "exact": False, "reason": XSS_SCRIPT}]}
    coll = _collectives()
    coll.details["table"][1]["ranks"]["1"] = {"error": XSS_SCRIPT}
    checks = [_step4(f"framework.{XSS_ATTR}.load", "framework.load", Status.FAIL, details=details,
                     message=XSS_SCRIPT, metrics={"sequences": 1, "top_n": XSS_ATTR}), coll]
    view = build_view(_results(checks))
    row = view.framework.frameworks[0].checks[0]
    assert row.subchecks[0].detail == XSS_SCRIPT  # plain data keeps the text; escaping is the template's
    page = render(view)
    assert XSS_SCRIPT not in page and XSS_ATTR not in page
    assert str(escape(XSS_SCRIPT)) in page and str(escape(XSS_ATTR)) in page
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.tags.count("script") == 1 and parsed.tags.count("img") == 0
    assert not [a for a in parsed.attrs if a[1].lower().startswith("on")]
    for anchor in [v for _, k, v in parsed.attrs if k == "id"]:
        assert anchor and re.fullmatch(r"[A-Za-z0-9_.-]+", anchor), anchor


def test_section_is_well_formed_with_unique_ids_and_live_links() -> None:
    checks = [_step4("framework.vllm.load", "framework.load", details={"framework": _fw("vllm")}),
              _step4("framework.vllm serve.load", "framework.load", details={"framework": _fw("vllm serve")}),
              _step4("framework.vllm-serve.load", "framework.load", details={"framework": _fw("vllm-serve")}),
              _collectives()]
    for results in (_real(), _results(checks)):
        view = build_view(results)
        page = render(view)
        parsed = _parse(page)
        assert parsed.errors == [] and parsed.stack == []
        ids = [v for _, k, v in parsed.attrs if k == "id"]
        assert len(ids) == len(set(ids))
        detail_ids = {v for _, k, v in _parse(render(view, "details")).attrs if k == "id"}
        section = _parse(_section(page))
        hrefs = {v for _, k, v in section.attrs if k == "href" and v}
        assert hrefs
        # A link is live on the page it names: this one (#x) or the details page beside it.
        for href in hrefs:
            page_name, _, frag = href.partition("#")
            assert frag in (detail_ids if page_name == "report-details.html" else set(ids)) and page_name in ("", "report-details.html"), href
    anchors = [b.anchor for b in _view(_results(checks)).frameworks]
    assert anchors[:3] == ["fw-vllm", "fw-vllm-serve", "fw-vllm-serve-2"]


def test_framework_view_is_plain_json_data() -> None:
    for results in (_real(), _results([_collectives()])):
        data = dataclasses.asdict(build_view(results))
        back = json.loads(json.dumps(data))
        assert "frameworks" in back["framework"] and "collectives" in back["framework"]


def test_fixture_is_the_real_run() -> None:
    """Guard against the fixture drifting into a hand-made file: the real run's own markers."""
    raw = _real_raw()
    assert raw["checks"][0]["details"]["framework"]["vllm"] == "0.32.0"
    assert {c["kind"] for c in raw["checks"]} == {"framework.load", "framework.single_request", "framework.reference",
                                                 "framework.concurrent", "framework.kv_cache"}


def test_template_never_bypasses_escaping() -> None:
    template = (Path(__file__).parents[2] / "adaptcheck" / "report" / "templates" / "framework.html.j2").read_text()
    assert "|safe" not in template.replace(" ", "") and "autoescape false" not in template
