"""Step 4's model numerics in the report: teacher-forced figures against the CPU control,
the fallback marking, the divergence chart, the localisation, the reproducer link, the
same-framework distributions, and step 3's 'not used by the served model here' mark.

Results are synthetic ``details.teacher_forced`` / ``details.distribution`` of the issue-13
contract, built on the report tests' factory (the real grade step, real models).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from markupsafe import escape

from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.frameworks.vllm_ops import VLLM_OPS, VllmOp
from adaptcheck.report import svg
from adaptcheck.report.framework import FwCheckRow
from adaptcheck.report.numerics import NumericsView
from adaptcheck.report.ops import build_ops
from adaptcheck.report.render import render
from adaptcheck.report.served_ops import NOT_USED_TEXT
from adaptcheck.report.view import build_view

from .factory import XSS_ATTR, XSS_SCRIPT
from .test_framework_view import _fw, _results, _section, _step4, _text
from .test_ops_section import _case, _op_result, _output
from .test_render import _parse

REF_ID = "framework.transformers.reference"
MODULE = "model.layers.0.mlp.act_fn"
EDGES = [-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0]
DEVICE_COUNTS = [0, 1, 3, 9, 20, 40, 27]
CONTROL_COUNTS = [2, 10, 40, 35, 12, 1, 0]


def _tf(**over: Any) -> dict[str, Any]:
    tf: dict[str, Any] = {
        "method": "teacher_forced", "fallback_reason": None, "top_k": 20,
        "reference": "transformers fp64 on cpu (attention sdpa)",
        "control": "transformers bf16 on cpu (attention sdpa)",
        "sequences": 9, "positions": 100,
        "device": {"kl_mean": 0.0371, "kl_p99": 0.412, "kl_max": 0.733, "dlogprob_mean": 0.05,
                   "dlogprob_max": 0.301, "same_top_rate": 0.87},
        "control_stats": {"kl_mean": 0.00213, "kl_p99": 0.0157, "kl_max": 0.0291, "dlogprob_mean": 0.01,
                          "dlogprob_max": 0.0902, "same_top_rate": 0.97},
        "bounds": {
            "kl_mean": {"value": 0.0371, "bound": 0.0107, "multiple": 4, "floor": 0.0022, "control": 0.00213,
                        "ok": False},
            "kl_p99": {"value": 0.412, "bound": 0.0648, "multiple": 4, "floor": 0.002, "control": 0.0157,
                       "ok": False},
        },
        "histogram": {"edges": EDGES, "device": DEVICE_COUNTS, "control": CONTROL_COUNTS},
        "localisation": {
            "module": MODULE, "where": "output", "error": 0.071, "control": 0.004, "bound": 0.0161, "reason": None,
            "table": [
                {"module": "model.embed_tokens", "where": "output", "error": 0.0, "control": 0.0, "bound": 0.001,
                 "departs": False},
                {"module": "model.layers.0.input_layernorm", "where": "output", "error": 0.0031, "control": 0.0029,
                 "bound": 0.0126, "departs": False},
                {"module": MODULE, "where": "output", "error": 0.071, "control": 0.004, "bound": 0.0161,
                 "departs": True},
            ],
        },
        "implementations": {"attention": "sdpa", "norm": "LlamaRMSNorm (module forward in torch ops)",
                            "activation": "SiLUActivation (torch op)"},
    }
    tf.update(over)
    return tf


def _ref(tf: dict[str, Any] | None = None, *, status: Status = Status.FAIL, **details: Any) -> CheckResult:
    d: dict[str, Any] = {"framework": _fw("transformers"), "teacher_forced": _tf() if tf is None else tf, **details}
    return _step4(REF_ID, "framework.reference", status, details=d, message="teacher-forced KL over the bound")


def _tf_view(results: RunResults, cid: str = REF_ID) -> NumericsView:
    row = _fw_row(results, cid)
    assert row.numerics is not None and row.numerics.teacher_forced is not None
    return row.numerics.teacher_forced


def _fw_row(results: RunResults, cid: str) -> FwCheckRow:
    return next(r for b in build_view(results).framework.frameworks for r in b.checks if r.id == cid)


def _pages(results: RunResults) -> tuple[str, str]:
    view = build_view(results)
    return render(view, "main"), render(view, "details")


# ---------------------------------------------------------------- figures and bounds


def test_figures_device_beside_control_with_each_bound_and_verdict() -> None:
    t = _tf_view(_results([_ref()]))
    assert t.method == "teacher-forced" and not t.fallback and t.fallback_reason == ""
    rows = {r.name: r for r in t.figures}
    assert list(rows) == ["KL mean", "KL p99", "KL max", "|Δ logprob| max", "same top token"]
    assert (rows["KL mean"].device, rows["KL mean"].control) == ("0.0371", "0.00213")
    assert rows["KL mean"].bound == "≤ 0.0107 (4× control 0.00213 + floor 0.0022)"
    assert rows["KL mean"].verdict is not None and rows["KL mean"].verdict.key == "fail"
    assert rows["KL p99"].bound.startswith("≤ 0.0648") and rows["KL p99"].verdict.key == "fail"  # type: ignore[union-attr]
    # Unbounded figures are reported, without a verdict that could read as held.
    assert rows["KL max"].verdict is None and rows["KL max"].bound == ""
    assert (rows["|Δ logprob| max"].device, rows["|Δ logprob| max"].control) == ("0.301", "0.0902")
    assert (rows["same top token"].device, rows["same top token"].control) == ("87.0%", "97.0%")
    assert "9 sequences, 100 positions" in t.summary and "top-20 + a rest bucket" in t.summary
    assert "control: transformers bf16 on cpu (attention sdpa)" in t.summary


def test_a_held_bound_passes_and_an_unknown_verdict_is_never_a_pass() -> None:
    tf = _tf()
    tf["bounds"]["kl_mean"]["ok"] = True
    tf["bounds"]["kl_p99"]["ok"] = None  # a writer that could not decide
    tf["bounds"]["same_top_rate"] = {"bound": 0.9}  # an extra bound of a newer writer, no verdict
    rows = {r.name: r for r in _tf_view(_results([_ref(tf)])).figures}
    assert rows["KL mean"].verdict.key == "pass"  # type: ignore[union-attr]
    assert rows["KL p99"].verdict.key == "notrun"  # type: ignore[union-attr]
    assert rows["same top token"].verdict.key == "notrun"  # type: ignore[union-attr]
    assert rows["same top token"].bound == "≤ 0.9"
    # A verdict that is not a literal boolean ("yes") does not fit the record: no figures, never a pass.
    tf["bounds"]["same_top_rate"]["ok"] = "yes"
    row = _fw_row(_results([_ref(tf)]), REF_ID)
    assert row.numerics is None
    _parse(_pages(_results([_ref(tf)]))[0])  # renders


def test_figures_render_in_the_framework_section() -> None:
    main, _ = _pages(_results([_ref()]))
    text = _text(_section(main))
    assert "Method: teacher-forced" in text
    assert re.search(r"KL mean 0\.0371 0\.00213 ≤ 0\.0107 \(4× control 0\.00213 \+ floor 0\.0022\) ✗ fail", text)
    assert re.search(r"same top token 87\.0% 97\.0%", text)
    assert "attention : sdpa" in text and "SiLUActivation (torch op)" in text  # the implementations dict


def test_missing_fields_show_as_unknown_and_malformed_records_are_left_out() -> None:
    tf = {"method": "teacher_forced", "device": {"kl_mean": None, "kl_p99": None},
          "histogram": {"edges": [0, 1], "device": [1, 2]}}
    t = _tf_view(_results([_ref(tf)]))
    assert [(r.name, r.device, r.control, r.verdict) for r in t.figures] == [
        ("KL mean", "—", "—", None), ("KL p99", "—", "—", None)]
    assert t.localisation == "" and t.implementations == [] and t.chart is not None
    assert "do not match" in str(t.chart.svg)
    # Details that do not fit the record (a hand-edited file): the numerics are left out, the
    # check and its framework block stay, and the page renders.
    bad = {"method": "teacher_forced", "device": {"kl_mean": "n/a"}, "bounds": "garbage",
           "histogram": {"edges": [0, 1], "device": "x"}, "localisation": "garbage", "implementations": ["x"]}
    row = _fw_row(_results([_ref(bad)]), REF_ID)
    assert row.numerics is None and row.status.key == "fail"
    _parse(_pages(_results([_ref(bad)]))[0])


# ---------------------------------------------------------------- greedy fallback


def test_greedy_fallback_is_marked_with_its_reason() -> None:
    reason = "the endpoint rejected prompt_logprobs and echo (HTTP 400)"
    tf = {"method": "greedy_fallback", "fallback_reason": reason, "top_k": 20, "implementations": {}}
    t = _tf_view(_results([_ref(tf, status=Status.PASS)]))
    assert t.fallback and t.method.startswith("greedy comparison (fallback") and t.fallback_reason == reason
    assert t.figures == [] and t.chart is None
    main, _ = _pages(_results([_ref(tf, status=Status.PASS)]))
    section = _section(main)
    assert 'class="tf tf-is-fallback"' in section and 'class="tf-fallback"' in section
    assert f"⚠ greedy comparison (fallback: teacher forcing did not run) — {reason}" in _text(section)
    assert "Method: teacher-forced" not in _text(section)


def test_an_unknown_method_is_not_shown_as_teacher_forced() -> None:
    t = _tf_view(_results([_ref({"method": "magic"})]))
    assert t.fallback and t.method == "magic (not teacher-forced)" and t.fallback_reason == "no reason recorded"
    t = _tf_view(_results([_ref({})]))
    assert t.fallback and "not teacher-forced" in t.method


# ---------------------------------------------------------------- chart


def _polygon_heights(chart: str) -> list[list[float]]:
    """Per series polygon: the y coordinates of its bin tops (every other pair after the baseline)."""
    out = []
    for pts in re.findall(r'<polygon points="([^"]+)"', chart):
        ys = [float(p.split(",")[1]) for p in pts.split()]
        out.append(ys[1:-1:2])
    return out


def test_chart_draws_device_and_control_histograms_and_the_p99_bound() -> None:
    t = _tf_view(_results([_ref()]))
    assert t.chart is not None
    chart = str(t.chart.svg)
    assert chart.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="chart"')
    tops = _polygon_heights(chart)
    assert len(tops) == 2  # device, control
    # Taller bars have smaller y: the order of the bin tops follows the counts of each series.
    for ys, counts in zip(tops, (DEVICE_COUNTS, CONTROL_COUNTS), strict=False):
        assert max(range(len(ys)), key=lambda i: ys[i]) == min(range(len(counts)), key=lambda i: counts[i])
        assert min(range(len(ys)), key=lambda i: ys[i]) == max(range(len(counts)), key=lambda i: counts[i])
    assert "device: 40 positions in [1e-3, 1e-2)" in chart and "CPU control: 40 positions in [1e-6, 1e-5)" in chart
    assert 'class="marker"' in chart and "p99 bound 0.0648" in chart
    assert "1e-4" in chart and "KL per position" in chart


def test_chart_is_inline_and_self_contained() -> None:
    main, _ = _pages(_results([_ref()]))
    section = _section(main)
    assert section.count('<figure class="chart tf-chart"><svg') == 1
    svg_text = section[section.index("<svg"):section.index("</svg>")]
    # No script, no external reference: the only URL is the SVG namespace.
    assert "<script" not in svg_text and "href" not in svg_text
    assert re.findall(r"https?://[^\"' ]+", svg_text) == ["http://www.w3.org/2000/svg"]
    assert _parse(main).errors == []


def test_no_histogram_means_no_chart_and_bad_edges_say_so() -> None:
    tf = _tf()
    del tf["histogram"]
    assert _tf_view(_results([_ref(tf)])).chart is None
    bad = svg.histogram_chart("t", [0.0, 2.0, 1.0], [("device", [1, 2])], x_label="x")
    assert "no histogram recorded" in str(bad)
    # An open first edge (everything below) is closed at a neighbouring bin's width, not dropped.
    open_left = svg.histogram_chart("t", [float("-inf"), -3.0, -2.0], [("device", [5, 1])], x_label="x")
    assert "device: 5 positions in [1e-4, 1e-3)" in str(open_left)


# ---------------------------------------------------------------- localisation


def test_localisation_line_and_its_table_on_the_details_page() -> None:
    results = _results([_ref()])
    t = _tf_view(results)
    assert t.localisation == (f"first departing module: {MODULE}, normalized error 0.071, control 0.004 "
                              "(bound 0.0161)")
    assert t.localisation_anchor == f"tf-{REF_ID}"
    main, details = _pages(results)
    assert t.localisation in _text(_section(main))
    # The main page links to the table, which lives on the details page.
    assert f'href="report-details.html#tf-{REF_ID}"' in _section(main)
    assert f'id="tf-{REF_ID}"' in details and 'href="#numerics-details"' in details
    table = details[details.index(f'id="tf-{REF_ID}"'):details.index('<section id="checks"')]
    rows = re.findall(r"<tr><td>(.*?)</td><td><code>(.*?)</code></td>", table)
    assert [(m, "fail" in s) for s, m in rows] == [
        ("model.embed_tokens", False), ("model.layers.0.input_layernorm", False), (MODULE, True)]
    assert "0.0029" in table and "0.0126" in table


def test_localisation_without_a_module_says_why() -> None:
    tf = _tf(localisation={"module": None, "reason": "vLLM runs in an engine: no forward hooks", "table": []})
    t = _tf_view(_results([_ref(tf)]))
    assert t.localisation == "localisation: vLLM runs in an engine: no forward hooks"
    assert t.localisation_anchor == ""
    _, details = _pages(_results([_ref(tf)]))
    assert 'id="numerics-details"' not in details
    t = _tf_view(_results([_ref(_tf(localisation={"module": "m.x", "where": "input", "error": 1, "control": 0}))]))
    assert t.localisation == "first departing module: m.x (its input), normalized error 1, control 0"


def test_module_names_and_implementations_are_escaped() -> None:
    tf = _tf()
    tf["localisation"]["module"] = XSS_SCRIPT
    tf["localisation"]["table"][2]["module"] = XSS_SCRIPT
    tf["implementations"] = {XSS_ATTR: XSS_SCRIPT}
    tf["fallback_reason"] = XSS_ATTR
    main, details = _pages(_results([_ref(tf)]))
    for page in (main, details):
        assert XSS_SCRIPT not in page and "<img" not in page
        parsed = _parse(page)
        assert parsed.errors == [] and parsed.tags.count("script") == 1
        assert not [a for a in parsed.attrs if a[1].lower().startswith("on")]
    assert f"first departing module: {escape(XSS_SCRIPT)}" in main
    assert str(escape(XSS_SCRIPT)) in details[details.index('id="numerics-details"'):]
    assert str(escape(XSS_ATTR)) in main


# ---------------------------------------------------------------- reproducer, distribution


def test_reproducer_path_is_linked_relative_to_the_run_folder() -> None:
    repro = f"repro/{REF_ID}.py"
    results = _results([_ref(repro=repro)])
    t = _tf_view(results)
    assert t.repro is not None and (t.repro.text, t.repro.href) == (repro, repro)
    view = build_view(results, records_base="../runs/r 1")
    row = next(r for b in view.framework.frameworks for r in b.checks if r.id == REF_ID)
    assert row.numerics.teacher_forced.repro.href == f"../runs/r%201/{repro}"  # type: ignore[union-attr]
    assert f'<a href="{repro}"><code>{repro}</code></a>' in _section(render(build_view(results)))
    # A path that leaves the run folder is shown, never linked.
    hostile = _tf_view(_results([_ref(repro="../../etc/passwd")])).repro
    assert hostile is not None and hostile.href == ""
    # A check without teacher-forced details still shows its reproducer.
    other = _step4("framework.transformers.single", "framework.single_request", Status.FAIL,
                   details={"framework": _fw("transformers"), "repro": "repro/x.py"})
    row = _fw_row(_results([other]), "framework.transformers.single")
    assert row.numerics is not None and row.numerics.teacher_forced is None
    assert row.numerics.repro is not None and row.numerics.repro.href == "repro/x.py"


def test_same_framework_checks_show_their_distribution() -> None:
    # As teacher.same_framework_row writes it: the summary, its judged bounds, the verdict.
    dist = {"kl_mean": 0.00012, "kl_p99": 0.0041, "kl_max": 0.0093, "dlogprob_mean": 0.01, "dlogprob_max": 0.07,
            "same_top_rate": 1.0, "positions": 96, "ok": False,
            "bounds": {"kl_mean": {"value": 0.00012, "bound": 0.0003, "ok": True},
                       "kl_max": {"value": 0.0093, "bound": 0.005, "ok": False}}}
    conc = _step4("framework.transformers.concurrent", "framework.concurrent", Status.FAIL,
                  details={"framework": _fw("transformers"), "distribution": dist})
    # The flat form of the contract (bound_kl_max), and no verdict possible (no control).
    flat = {"kl_mean": 1e-5, "kl_p99": 2e-5, "kl_max": 3e-5, "dlogprob_max": 0.001, "bound_kl_max": 0.005, "ok": None}
    kv = _step4("framework.transformers.kv_cache", "framework.kv_cache", Status.PASS,
                details={"framework": _fw("transformers"), "distribution": flat})
    results = _results([conc, kv])
    d = _fw_row(results, conc.id).numerics.distribution  # type: ignore[union-attr]
    assert d is not None and d.verdict is not None and d.verdict.key == "fail"
    assert d.text == ("teacher-forced, batched vs alone: KL mean 1.200e-04 (bound 3.000e-04), p99 0.0041, "
                      "max 0.0093 (bound 0.005, exceeded); |Δ logprob| max 0.07 over 96 positions")
    k = _fw_row(results, kv.id).numerics.distribution  # type: ignore[union-attr]
    assert k is not None and k.verdict.key == "notrun"  # type: ignore[union-attr]
    assert k.text.startswith("teacher-forced, prefix-cache hit vs recompute:") and "max 3.000e-05 (bound 0.005)" in k.text
    assert "✗ fail teacher-forced, batched vs alone" in _text(_section(render(build_view(results))))


def test_checks_without_numerics_carry_none() -> None:
    plain = _step4("framework.transformers.load", "framework.load", details={"framework": _fw("transformers")})
    assert _fw_row(_results([plain]), plain.id).numerics is None


# ---------------------------------------------------------------- step 3: ops the served model did not use


def _vllm_ref(impls: dict[str, Any], cid: str = "framework.vllm.reference") -> CheckResult:
    tf = _tf(implementations=impls)
    return _step4(cid, "framework.reference", details={"framework": _fw("vllm"), "teacher_forced": tf})


def _step3() -> list[CheckResult]:
    ok = [_case("rows", [_output(0.2)])]
    return [_op_result(op, "bf16", Status.PASS, copy.deepcopy(ok), provider=p)
            for op, p in (("rms_norm", "torch"), ("rms_norm", "vllm"), ("fused_add_rms_norm", "vllm"),
                          ("silu_and_mul", "vllm"), ("gelu_tanh", "vllm"), ("paged_attention", "vllm"))]


def _unused(results: RunResults) -> dict[tuple[str, str], str]:
    ops = build_ops(results, {})
    return {(r.provider, r.op): r.unused_detail for g in ops.groups for r in g.rows if r.unused}


def test_step3_marks_vllm_kernels_the_served_model_did_not_run() -> None:
    # As vllm_impl.merge describes layers: the method, then what the traced request ran.
    impls = {"RMSNorm": "forward_cpu -> forward_native: torch ops (aten::add, aten::mean, aten::mul, aten::pow …)",
             "SiluAndMul": "forward_cpu: custom kernel _C::silu_and_mul",
             "GemmaRMSNorm": "forward_native: torch ops (aten::mul)", "Attention": "CPUAttentionBackend (impl X)"}
    results = _results([*_step3(), _vllm_ref(impls)])
    why = f"RMSNorm: {impls['RMSNorm']}; per framework.vllm.reference"
    assert _unused(results) == {("vllm", "rms_norm"): why, ("vllm", "fused_add_rms_norm"): why}
    main, details = _pages(results)
    ops = main[main.index('<section id="ops"'):main.index('<section id="framework"')]
    assert _text(ops).count(NOT_USED_TEXT) == 2
    assert NOT_USED_TEXT == "not used by the served model here (vLLM ran forward_native)"
    assert f"{NOT_USED_TEXT}: {why}." in _text(details)


def test_step3_only_native_layers_that_never_name_the_kernel_are_marked() -> None:
    impls = {
        # forward_cpu that runs only torch ops (x86 SiluAndMul calls forward_native): not the kernel.
        "SiluAndMul": "forward_cpu: torch ops (aten::silu, aten::mul)",
        # A description naming the class; a dict value.
        "act": {"class": "GELUTanh", "ran": "forward_native"},
        # RMSNorm with and without a residual merged: one kernel ran, the other op's is not claimed.
        "RMSNorm": "forward_cpu: custom kernel _C::fused_add_rms_norm",
        "RotaryEmbedding": "forward_native: but ran _C::rotary_embedding",
    }
    assert set(_unused(_results([*_step3(), _vllm_ref(impls)]))) == {("vllm", "silu_and_mul"), ("vllm", "gelu_tanh")}
    # transformers' implementations never mark vLLM kernels; no step-4 evidence, no mark.
    assert _unused(_results([*_step3(), _ref()])) == {}
    assert _unused(_results(_step3())) == {}



def test_the_marked_ops_come_from_the_one_vllm_op_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # The table the vllm op provider maps its ops by is the report's too: an op given a layer
    # class there is marked here, with no change to the report's code; an op taken out of it
    # is no longer marked. (A hand-kept mirror in the report would miss both.)
    impls = {"MyNorm": "forward_cpu -> forward_native: torch ops (aten::mul)",
             "RMSNorm": "forward_native: torch ops (aten::mean)"}
    ops = [*_step3(), _op_result("my_norm", "bf16", Status.PASS, [_case("rows", [_output(0.2)])], provider="vllm")]
    before = set(_unused(_results([*ops, _vllm_ref(impls)])))
    assert before == {("vllm", "rms_norm"), ("vllm", "fused_add_rms_norm")}

    monkeypatch.setitem(VLLM_OPS, "my_norm", VllmOp(("_C.my_norm",), layer="vllm.layers:MyNorm"))
    monkeypatch.delitem(VLLM_OPS, "fused_add_rms_norm")
    why = _unused(_results([*ops, _vllm_ref(impls)]))
    assert set(why) == {("vllm", "rms_norm"), ("vllm", "my_norm")}
    assert why["vllm", "my_norm"] == f"MyNorm: {impls['MyNorm']}; per framework.vllm.reference"
    # The table's kernel name decides too: a description naming it is the kernel, not forward_native.
    named = {"MyNorm": "forward_native: but ran _C::my_norm"}
    assert ("vllm", "my_norm") not in _unused(_results([*ops, _vllm_ref(named)]))


def test_the_batched_vs_alone_figures_are_shown_with_their_bound() -> None:
    from adaptcheck.base.schemas.framework_evidence import Distribution
    from adaptcheck.report.numerics import distribution_view

    dist = {"kl_mean": 0.00012, "kl_max": 0.0093, "dlogprob_max": 0.07, "positions": 288, "ok": False,
            "vs_reference": {"alone": {"kl_mean": 0.00094}, "batched": {"kl_mean": 0.0081},
                             "bounds": {"kl_mean": {"value": 0.0081, "bound": 0.00209, "ok": False}}, "ok": False}}
    view = distribution_view("batched vs alone", Distribution.model_validate(dist))
    assert view is not None
    assert "batched vs float64 KL mean 0.0081 against alone 9.400e-04 (bound 0.00209, exceeded)" in view.text
