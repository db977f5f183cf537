"""Step-4 checks through the real CLI: transformers for real, wrong frameworks caught, bad input survived.

Every test runs ``adaptcheck run`` in a subprocess on a throw-away ladder, exactly as a user
would, and reads results.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

WRONG = "tests.steps.frameworks.wrong_frameworks"


def fw_check(id_: str, kind: str, framework: str, **params: Any) -> dict[str, Any]:
    return {"id": id_, "step": 4, "kind": f"framework.{kind}", "params": {"framework": framework, **params}}


def run_ladder(write_ladder: Callable[..., Path], tmp_path: Path, checks: list[dict[str, Any]],
               *extra: str, timeout_s: float = 300) -> tuple[dict[str, dict[str, Any]], dict[str, Any], Any]:
    ladder = write_ladder(checks, timeout_s=timeout_s)
    out = tmp_path / "run"
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out), "--quiet", *extra],
                   timeout=1800)
    assert (out / "results.json").exists(), proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    return {c["id"]: c for c in results["checks"]}, results, proc


def test_transformers_passes_every_step4_check(write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    checks = [fw_check(f"fw.{k}", k, "transformers") for k in
              ("load", "single_request", "reference", "concurrent", "kv_cache", "compile", "tensor_parallel")]
    by_id, _results, proc = run_ladder(write_ladder, tmp_path, checks)
    for k in ("load", "single_request", "reference", "concurrent", "kv_cache"):
        assert by_id[f"fw.{k}"]["status"] == "pass", (k, by_id[f"fw.{k}"]["message"], proc.stderr[-2000:])
    # No compile switch in transformers, and one CPU: both not applicable, with the reason.
    for k in ("compile", "tensor_parallel"):
        assert by_id[f"fw.{k}"]["status"] == "skip" and by_id[f"fw.{k}"]["applicable"] is False
    load = by_id["fw.load"]
    assert load["metrics"]["load_s"] > 0
    assert load["details"]["framework"]["name"] == "transformers"
    assert load["details"]["model"]["name"] == "embedded:tiny-llama"
    ref = by_id["fw.reference"]
    assert ref["metrics"]["reference_dtype"] == "fp64" and ref["metrics"]["sequences"] >= 6
    assert ref["metrics"]["sequences_failed"] == 0
    rows = {r["name"]: r for r in by_id["fw.single_request"]["details"]["subchecks"]}
    assert rows["stop string honoured"]["ok"] is True and rows["EOS honoured"]["ok"] is True
    assert rows["ignore_eos honoured"]["ok"] is True
    # The reference is computed once and cached in the run folder.
    assert list((tmp_path / "run" / "framework").glob("teacher-*.json"))


def test_wrong_frameworks_are_caught(write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    checks = [
        fw_check("wrong.tokens", "reference", f"{WRONG}:WrongTokens"),
        fw_check("wrong.max_tokens", "single_request", f"{WRONG}:IgnoresMaxTokens", output_lengths=[4, 8]),
        fw_check("wrong.stop", "single_request", f"{WRONG}:IgnoresStop", output_lengths=[4, 8]),
        fw_check("wrong.batch", "concurrent", f"{WRONG}:BatchCrossTalk"),
    ]
    by_id, _, _proc = run_ladder(write_ladder, tmp_path, checks)
    assert by_id["wrong.tokens"]["status"] == "fail", by_id["wrong.tokens"]["message"]
    assert "token 3" in by_id["wrong.tokens"]["message"]
    assert by_id["wrong.max_tokens"]["status"] == "fail"
    assert "max_tokens=4" in by_id["wrong.max_tokens"]["message"]
    assert by_id["wrong.stop"]["status"] == "fail" and "stop string" in by_id["wrong.stop"]["message"]
    assert by_id["wrong.batch"]["status"] == "fail" and "batch" in by_id["wrong.batch"]["message"]


def test_a_path_that_is_not_a_model_is_a_one_line_error_and_the_run_goes_on(
        write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "README.txt").write_text("no config.json here")
    checks = [{"id": "smoke.device_visible", "step": 2, "kind": "smoke.device_visible"},
              fw_check("fw.load", "load", "transformers"), fw_check("fw.single", "single_request", "transformers")]
    by_id, results, proc = run_ladder(write_ladder, tmp_path, checks, "--model", str(not_a_model))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert by_id["smoke.device_visible"]["status"] == "pass"
    for cid in ("fw.load", "fw.single"):
        msg = by_id[cid]["message"]
        assert by_id[cid]["status"] == "error" and "\n" not in msg
        assert "config.json" in msg, msg
    assert results["model"]["name"] == str(not_a_model)


def test_unreachable_endpoint_is_a_one_line_error_and_no_endpoint_is_not_applicable(
        write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    checks = [fw_check("fw.endpoint.load", "load", "endpoint"), fw_check("fw.endpoint.single", "single_request", "endpoint")]
    by_id, _, _proc = run_ladder(write_ladder, tmp_path, checks, "--endpoint", "http://127.0.0.1:9/v1")
    for cid in ("fw.endpoint.load", "fw.endpoint.single"):
        assert by_id[cid]["status"] == "error", by_id[cid]
        assert "127.0.0.1:9" in by_id[cid]["message"] and "\n" not in by_id[cid]["message"]
    by_id, _, _ = run_ladder(write_ladder, tmp_path / "again", checks)
    assert by_id["fw.endpoint.load"]["status"] == "skip" and by_id["fw.endpoint.load"]["applicable"] is False
    assert "--endpoint" in by_id["fw.endpoint.load"]["message"]


def test_unknown_framework_is_rejected_before_the_run(write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    ladder = write_ladder([fw_check("fw.load", "load", "vllmm")])
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp_path / "r")])
    assert proc.returncode == 2, proc.stderr  # unknown name: usage error, with suggestions
    assert "vllmm" in proc.stderr and "vllm" in proc.stderr


def test_plugin_framework_is_discovered_listed_and_used(write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    listed = run_cli(["frameworks", "--format", "json"])
    assert listed.returncode == 0, listed.stderr
    by_name = {d["name"]: d for d in json.loads(listed.stdout)}
    assert {"transformers", "vllm", "vllm_serve", "transformers_serve", "endpoint"} <= set(by_name)
    assert by_name["dummy_framework"]["available"] is False
    assert "ADAPTCHECK_DUMMY" in by_name["dummy_framework"]["reason"]
    checks = [fw_check("plugin.load", "load", "dummy_framework")]
    by_id, _, _proc = run_ladder(write_ladder, tmp_path, checks)
    assert by_id["plugin.load"]["status"] == "skip" and by_id["plugin.load"]["applicable"] is False
    ladder = write_ladder(checks, timeout_s=300)
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp_path / "on"), "--quiet"],
                   env={"ADAPTCHECK_DUMMY": "1"})
    result = json.loads((tmp_path / "on" / "results.json").read_text())["checks"][0]
    assert result["status"] == "pass", (result["message"], proc.stderr[-1000:])
    assert result["details"]["framework"]["display_name"].startswith("Dummy plugin framework")
