"""Launching and stopping real servers: command lines, start-up failures, and no orphans.

The processes are real (``transformers serve`` where a fresh server is needed, ~6 s;
``vllm serve`` where its engine-core child process matters). ``stop()`` on vLLM is also
checked by the ``vllm_server`` fixture's teardown (``tests/servers.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from adaptcheck.base.procs import descendants, pid_alive
from adaptcheck.frameworks.server import (
    ManagedServer,
    ServerSpec,
    ServerStartError,
    build_command,
    build_env,
    death_cause,
)
from tests.servers import serving_unavailable

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

REPO = Path(__file__).resolve().parents[2]


def _need(kind: str) -> None:
    reason = serving_unavailable(kind)
    if reason:
        pytest.skip(reason)


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if pid_alive(p)]
    return alive


# --------------------------------------------------------------------------------------
# Command lines and environment (no process)
# --------------------------------------------------------------------------------------

def test_vllm_command_line(tmp_path: Path) -> None:
    spec = ServerSpec("vllm", tmp_path, dtype="bf16", max_model_len=512, enforce_eager=True,
                      enable_prefix_caching=False, served_model_name="m", extra_args=["--seed", "1"])
    cmd = build_command(spec, 1234)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in ("--model " + str(tmp_path), "--served-model-name m", "--host 127.0.0.1", "--port 1234",
                 "--dtype bfloat16", "--max-model-len 512", "--enforce-eager", "--no-enable-prefix-caching"):
        assert part in joined
    assert cmd[-2:] == ["--seed", "1"]
    default = build_command(ServerSpec("vllm", tmp_path), 1)
    assert "--enforce-eager" not in default and "prefix-caching" not in " ".join(default)
    assert ServerSpec("vllm", tmp_path / "tiny-llama").model_name == "tiny-llama"


def test_transformers_command_line(tmp_path: Path) -> None:
    spec = ServerSpec("transformers", tmp_path, dtype="fp32", enforce_eager=False)
    cmd = build_command(spec, 99)
    assert cmd[:5] == [sys.executable, "-m", "transformers.cli.transformers", "serve", str(tmp_path)]
    joined = " ".join(cmd)
    assert "--port 99" in joined and "--device cpu" in joined and "--dtype float32" in joined
    assert "--compile" in cmd
    assert spec.model_name == str(tmp_path)  # transformers serve is pinned to the path it was given


def test_server_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = build_env(ServerSpec("vllm", tmp_path, env={"EXTRA": "1"}))
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "cache"))
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "cache"))
    assert env["HF_HUB_OFFLINE"] == "1" and env["EXTRA"] == "1"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")  # the user's setting wins
    assert build_env(ServerSpec("vllm", tmp_path))["VLLM_CPU_KVCACHE_SPACE"] == "8"
    assert "VLLM_CACHE_ROOT" not in build_env(ServerSpec("transformers", tmp_path), base={})
    assert build_env(ServerSpec("vllm", tmp_path, device="cuda:3"), base={})["CUDA_VISIBLE_DEVICES"] == "3"


def test_spec_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        ServerSpec("vllm", tmp_path, dtype="int3")
    with pytest.raises(ValueError, match="kind"):
        ServerSpec("sglang", tmp_path)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Real processes
# --------------------------------------------------------------------------------------

def test_start_and_stop_leave_nothing(served_model: Path, tmp_path: Path) -> None:
    _need("transformers")
    server = ManagedServer(ServerSpec("transformers", served_model), tmp_path)
    # Started from a thread that then ends (a check run with a timeout): PR_SET_PDEATHSIG
    # follows the forking *thread*, so the server must have been forked by one that lives on.
    starter = threading.Thread(target=server.start, args=(180,))
    starter.start()
    starter.join()
    time.sleep(0.5)
    with server:
        assert server.alive()
        assert server.startup_s is not None and server.startup_s > 0
        assert server.pid is not None and server.pid in server.process_tree()
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        assert server.log_path.is_file() and server.log_path.parent == tmp_path
        assert server.client().completion("Hello", max_tokens=2).completion_tokens == 2
        tree = server.process_tree()
        # Same process group as the test: a runner's killpg reaches the server.
        assert all(os.getpgid(p) == os.getpgid(0) for p in tree)
    assert not server.alive()
    assert _wait_gone(tree, 0) == []
    server.stop()  # idempotent


def test_missing_model_path_fails_at_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="does not exist"):
        ManagedServer(ServerSpec("vllm", tmp_path / "nope"), tmp_path).start(600)
    assert time.monotonic() - t0 < 1


@pytest.mark.parametrize("kind", ["transformers", "vllm"])
def test_broken_model_fails_fast_with_the_reason(kind: str, tmp_path: Path) -> None:
    """An empty model folder: the server process exits; the error comes at once, not after the timeout."""
    _need(kind)
    model = tmp_path / "empty-model"
    model.mkdir()
    server = ManagedServer(ServerSpec(kind, model), tmp_path / "logs")  # type: ignore[arg-type]
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.start(600)
    assert time.monotonic() - t0 < 180
    msg = info.value.one_line()
    assert f"{kind} serve exited with code 1 during start-up" in msg
    reason = "Unrecognized processing class" if kind == "transformers" else "Invalid repository ID or local directory"
    assert reason in msg, msg
    assert info.value.log_path is not None and info.value.log_path.is_file()
    assert "\n" not in msg
    assert not server.alive()


def test_not_ready_in_time_is_reported_and_cleaned_up(served_model: Path, tmp_path: Path) -> None:
    _need("transformers")
    server = ManagedServer(ServerSpec("transformers", served_model), tmp_path)
    with pytest.raises(ServerStartError, match=r"not ready within 0\.5 s"):
        server.start(0.5)
    assert server.reaper_pid is not None and _wait_gone([server.reaper_pid], 10) == []


_PARENT_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from adaptcheck.frameworks.server import ManagedServer, ServerSpec
    server = ManagedServer(ServerSpec({kind!r}, Path({model!r}), enforce_eager=True), Path({logs!r}))
    server.start(600)
    print(json.dumps({{"tree": server.process_tree(), "pid": server.pid}}), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("kind", ["transformers", "vllm"])
def test_parent_killed_leaves_no_orphans(kind: str, served_model: Path, tmp_path: Path) -> None:
    """SIGKILL the process that started a server: the server and (vLLM) its engine processes go too."""
    _need(kind)
    script = tmp_path / "parent.py"
    script.write_text(_PARENT_SCRIPT.format(repo=str(REPO), kind=kind, model=str(served_model),
                                            logs=str(tmp_path / "logs")))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    tree: list[int] = []
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()  # blocks until the server is ready (or the script died)
        assert line, f"the parent script died: exit {parent.wait()}"
        info = json.loads(line)
        tree = info["tree"]
        server_pid = info["pid"]
        assert server_pid in tree
        if kind == "vllm":  # API server, engine core, worker (and a resource tracker) besides the reaper
            assert len(descendants(server_pid)) >= 2
        tree = sorted(set(tree) | set(descendants(tree[0])))
        # Nothing moved to a session or group of its own: a runner's killpg reaches it all.
        assert {os.getpgid(p) for p in tree if pid_alive(p)} == {os.getpgid(0)}
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait_gone(tree, 15) == []
    finally:
        for p in [parent.pid, *tree]:  # never leave a server behind, even when the test fails
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
        parent.wait(10)


def test_death_cause_names_the_dead_process_and_its_signal(tmp_path: Path) -> None:
    """Lines recorded from a real vllm-cpu 0.32.0 server on this machine whose worker died of
    SIGILL on its first bf16 request: the cause is the first death line, not the HTTP symptom."""
    log = tmp_path / "vllm-serve.log"
    log.write_text(
        "INFO:     Application startup complete.\n"
        'INFO:     127.0.0.1:37936 - "GET /v1/models HTTP/1.1" 200 OK\n'
        "(EngineCore pid=29715) ERROR 11-29 18:17:09 [multiproc_executor.py:315] Worker proc VllmWorker-0 "
        "died unexpectedly (exit code: -4), shutting down executor.\n"
        "(EngineCore pid=29715) ERROR 11-29 18:17:09 [core.py:1512] EngineCore encountered a fatal error.\n")
    assert death_cause(log) == ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down "
                                "executor. = SIGILL")
    log.write_text("INFO:     Application startup complete.\nERROR: bad request\n")
    assert death_cause(log) is None
    assert death_cause(tmp_path / "missing.log") is None
