"""Step 4 fails a device whose kernels are wrong, names the module, and writes a reproducer.

One real ``adaptcheck run`` in bf16 on the embedded models, with defects planted in the
model's execution path (``tests/steps/frameworks/planted.py``: torch dispatcher kernels and
torch's module hooks) next to the unmodified transformers adapter on the same ladder:

- a bf16 SiLU with a large error, an RMSNorm without eps, attention that ignores its scale
  at head_dim 80 (through the default SDPA path: eager attention would never call it), and
  a rotary table that wraps: ``framework.reference`` fails and names the first departing
  module;
- a GEMM whose result depends on the batch size: ``framework.concurrent`` fails on the
  teacher-forced batched-vs-alone rule (the batched run's KL from float64 against the run alone's);
- the healthy adapter passes both checks on both models.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.steps.frameworks.test_framework_checks import fw_check, run_ladder

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

P = "tests.steps.frameworks.planted"
QWEN_D80 = "embedded:tiny-qwen2-d80"


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Any]], Path]:
    from tests.conftest import ladder_text

    tmp = tmp_path_factory.mktemp("planted")
    checks = [
        fw_check("healthy.reference", "reference", "transformers", dtype="bf16"),
        fw_check("healthy.concurrent", "concurrent", "transformers", dtype="bf16"),
        fw_check("healthy.d80.reference", "reference", "transformers", dtype="bf16", model=QWEN_D80),
        fw_check("silu.reference", "reference", f"{P}:BadSiluBf16", dtype="bf16"),
        fw_check("rmsnorm.reference", "reference", f"{P}:RmsNormNoEps", dtype="bf16"),
        fw_check("attention.reference", "reference", f"{P}:AttentionScaleD80", dtype="bf16", model=QWEN_D80),
        fw_check("rope.reference", "reference", f"{P}:RopeTableTooShort", dtype="bf16"),
        fw_check("gemm.concurrent", "concurrent", f"{P}:BatchDependentGemm", dtype="bf16"),
    ]
    (tmp / "ladder.yaml").write_text(ladder_text(checks, timeout_s=600))
    by_id, _results, _proc = run_ladder(lambda *_a, **_k: tmp / "ladder.yaml", tmp, checks)
    return by_id, tmp / "run"


def _loc(check: dict[str, Any]) -> dict[str, Any]:
    return check["details"]["teacher_forced"]["localisation"]


def test_the_healthy_adapter_passes_with_teacher_forced_evidence(planted_run: tuple[dict[str, Any], Path]) -> None:
    by_id, _ = planted_run
    for cid in ("healthy.reference", "healthy.concurrent", "healthy.d80.reference"):
        assert by_id[cid]["status"] == "pass", (cid, by_id[cid]["message"])
    tf = by_id["healthy.reference"]["details"]["teacher_forced"]
    assert tf["method"] == "teacher_forced" and tf["positions"] > 200
    assert all(b["ok"] for b in tf["bounds"].values())
    assert tf["control_stats"]["kl_mean"] > 0  # bf16 costs something: the control measured it
    assert sum(tf["histogram"]["device"]) == tf["positions"] == sum(tf["histogram"]["control"])
    # transformers ran its default attention (SDPA), not eager, and says so.
    assert tf["implementations"]["attention"] == "sdpa"
    assert "repro" not in by_id["healthy.reference"]["details"]


@pytest.mark.parametrize(("check", "module", "where"), [
    ("silu.reference", "model.layers.0.mlp.act_fn", "output"),
    ("rmsnorm.reference", "model.layers.0.input_layernorm", "output"),
    ("attention.reference", "model.layers.0.self_attn.o_proj", "input"),  # the attention core's output
])
def test_a_planted_defect_fails_the_reference_check_and_names_the_module(
        planted_run: tuple[dict[str, Any], Path], check: str, module: str, where: str) -> None:
    by_id, _ = planted_run
    c = by_id[check]
    assert c["status"] == "fail", c["message"]
    assert "teacher-forced" in c["message"] and f"{module} {where}" in c["message"]
    loc = _loc(c)
    assert (loc["module"], loc["where"]) == (module, where)
    assert loc["error"] > loc["bound"] >= loc["control"]
    # Every module before it stayed within its bound: the name is the first departure.
    rows = loc["table"]
    at = next(i for i, r in enumerate(rows) if (r["module"], r["where"]) == (module, where))
    assert not any(r["departs"] for r in rows[:at])
    assert c["metrics"]["tf_kl_mean"] > 5 * c["metrics"]["control_kl_mean"]


def test_a_defect_only_late_positions_show_is_caught(planted_run: tuple[dict[str, Any], Path]) -> None:
    c = planted_run[0]["rope.reference"]
    assert c["status"] == "fail", c["message"]
    assert "kl_" in c["message"]


def test_a_batch_dependent_gemm_fails_the_concurrent_check(planted_run: tuple[dict[str, Any], Path]) -> None:
    c = planted_run[0]["gemm.concurrent"]
    assert c["status"] == "fail", c["message"]
    rows = {r["name"]: r for r in c["details"]["subchecks"]}
    # The batched run is farther from float64 than the same framework alone: the depth-invariant rule.
    assert rows["teacher-forced distributions batched vs float64, relative to alone"]["ok"] is False
    vs = c["details"]["distribution"]["vs_reference"]
    assert vs["ok"] is False and vs["batched"]["kl_mean"] > vs["bounds"]["kl_mean"]["bound"] > vs["alone"]["kl_mean"]
    assert c["details"]["distribution"]["ok"] is False


_KERNELS = {"silu.reference": ("silu", "_hard_silu"),
            "attention.reference": ("_scaled_dot_product_flash_attention_for_cpu", "_flash_cpu_wrong_scale")}


def _run_script(script: Path, cwd: Path, plant: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the reproducer with ``python -I``; with ``plant``, first replace that aten CPU kernel
    for the whole process (the broken device a kernel engineer would run it on)."""
    import inspect

    from tests.steps.frameworks import planted

    if plant is None:
        argv = [sys.executable, "-I", str(script)]
    else:
        op, fn = plant
        wrapper = cwd / "broken_device.py"
        wrapper.write_text("import math, runpy, sys, warnings\nimport torch\n\n"
                           + inspect.getsource(getattr(planted, fn))
                           + f"\nwarnings.simplefilter('ignore')\nlib = torch.library.Library('aten', 'IMPL')\n"
                           f"lib.impl({op!r}, {fn}, 'CPU')\nsys.argv = [{str(script)!r}]\n"
                           f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
        argv = [sys.executable, "-I", str(wrapper)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd, check=False)


def _printed_kl_mean(stdout: str) -> float:
    import re

    m = re.search(r"mean=([0-9.e+-]+)", stdout)
    assert m, stdout
    return float(m.group(1))


@pytest.mark.parametrize("check", sorted(_KERNELS))
def test_each_failure_writes_a_standalone_reproducer_that_shows_it(planted_run: tuple[dict[str, Any], Path],
                                                                   check: str, tmp_path: Path) -> None:
    by_id, run = planted_run
    rel = by_id[check]["details"]["repro"]
    script = run / rel
    assert script.name == f"{check}.py" and script.parent.name == "repro"
    text = script.read_text()
    assert "import adaptcheck" not in text and "from adaptcheck" not in text
    # On the broken device (the kernel replaced process-wide) the script shows the check's figure.
    broken = _run_script(script, tmp_path, _KERNELS[check])
    assert broken.returncode == 1, broken.stdout[-2000:] + broken.stderr[-2000:]
    assert _printed_kl_mean(broken.stdout) == pytest.approx(by_id[check]["metrics"]["tf_kl_mean"], rel=0.02)
    # On healthy kernels the same script passes: the failure is the kernel's, not the script's.
    healthy = _run_script(script, tmp_path)
    assert healthy.returncode == 0, healthy.stdout[-2000:] + healthy.stderr[-2000:]
    assert _printed_kl_mean(healthy.stdout) < by_id[check]["details"]["teacher_forced"]["bounds"]["kl_mean"]["bound"]


def test_results_carry_the_figures_the_report_draws(planted_run: tuple[dict[str, Any], Path]) -> None:
    results = json.loads((planted_run[1] / "results.json").read_text())
    ref = next(c for c in results["checks"] if c["id"] == "silu.reference")
    tf = ref["details"]["teacher_forced"]
    for key in ("device", "control_stats", "bounds", "histogram", "localisation", "implementations"):
        assert key in tf
    assert set(tf["bounds"]) == {"kl_mean", "kl_p99"}
