"""Shared fixtures: run the real CLI in a subprocess and write throw-away ladders."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.procs import child_environ

pytest_plugins = ["tests.servers"]  # session servers: vllm_server, transformers_server


def run_cli(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``adaptcheck ARGS`` as a user runs it (a real process, real exit code).

    The environment is this process's without what an in-process engine of an earlier test
    set for itself (vLLM's VLLM_ENABLE_V1_MULTIPROCESSING=0 would otherwise reach every later
    run's servers as if the user had set it)."""
    full_env = child_environ()
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "adaptcheck", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def popen_interruptible(args: list[str], **kw: Any) -> subprocess.Popen[str]:
    """``subprocess.Popen`` for a child the test will Ctrl-C.

    A test session started in the background by a non-interactive shell inherits SIGINT as
    *ignored*, children inherit that through exec, and Python then never raises
    KeyboardInterrupt. Spawning while this (main) thread has Python's default handler makes
    the child start with the default disposition, without a preexec_fn (unsafe with threads).
    """
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, text=True, **kw)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session", autouse=True)
def adaptcheck_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """adaptcheck's cache (synthetic models, vLLM and inductor caches) for the whole session:
    ``$ADAPTCHECK_CACHE_DIR`` when the caller set one (CI may keep it between runs), else a
    session temporary folder, so tests never write to the user's home cache. CLI runs in
    subprocesses inherit it."""
    existing = os.environ.get("ADAPTCHECK_CACHE_DIR")
    if existing:
        return Path(existing)
    path = tmp_path_factory.mktemp("adaptcheck-cache")
    os.environ["ADAPTCHECK_CACHE_DIR"] = str(path)
    return path


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli


GRADE_ANY_STEP = """
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - id: first
          description: the first check passes
          checks: [{first}]
    - level: L2
      name: model runs
      conditions:
        - id: everything
          description: every check passes
          steps: [1, 2, 3, 4, 5]
"""


def ladder_text(checks: list[dict[str, object]], *, timeout_s: float = 60, grade: str | None = None) -> str:
    """A ladder YAML with the given checks (dicts of id/step/kind/params/timeout_s)."""
    import yaml

    body = yaml.safe_dump({"schema_version": 1, "id": "test", "version": "0", "defaults": {"timeout_s": timeout_s},
                           "checks": checks}, sort_keys=False)
    return body + textwrap.dedent(grade if grade is not None else GRADE_ANY_STEP.format(first=checks[0]["id"]))


def finished_run(root: Path, checks: list[dict[str, object]], **ladder_kw: object) -> Path:
    """A real ``adaptcheck run --device cpu`` of a throw-away ladder of ``checks`` in ``root``,
    finished (exit 0); its run folder. For module-scoped fixtures: one run that several tests
    read, or copy before they change it."""
    ladder = root / "ladder.yaml"
    ladder.write_text(ladder_text(checks, **ladder_kw))  # type: ignore[arg-type]
    run_dir = root / "run"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(run_dir), "--quiet"])
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.fixture
def write_ladder(tmp_path: Path) -> Callable[..., Path]:
    def _write(checks: list[dict[str, object]], **kw: object) -> Path:
        path = tmp_path / "ladder.yaml"
        path.write_text(ladder_text(checks, **kw))  # type: ignore[arg-type]
        return path

    return _write


def _accelerator_available() -> bool:
    from adaptcheck.backends.registry import probe_all

    return any(info.cls is not None and info.cls.is_accelerator and probe.available and not info.name.startswith("dummy")
               for info, probe in probe_all())


# Session fixtures that make real end-to-end runs: a test using one is slow whatever its own
# body costs (fleet_runs: four `adaptcheck run`s, ~40 s on 2 cores), so it stays out of the
# fast lane (-m "not slow") without every such test having to say so.
SLOW_FIXTURES = frozenset({"fleet_runs"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests using a slow fixture are marked ``slow``; tests marked ``accelerator`` skip cleanly
    on a CPU-only machine."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    marked = [item for item in items if item.get_closest_marker("accelerator")]
    if marked and not _accelerator_available():
        skip = pytest.mark.skip(reason="no accelerator backend is available on this machine")
        for item in marked:
            item.add_marker(skip)


def run_checks(root: Path, checks: list[dict[str, Any]], *, model: str = "embedded:tiny-llama",
               check_timeout_s: float = 600, timeout: float = 1200) -> dict[str, dict[str, Any]]:
    """One throw-away ladder of ``checks`` run through the real CLI on the CPU: each check's
    results.json entry by id (the feature tests' module fixtures; a run that wrote no results
    fails with the CLI's stderr)."""
    import json

    ladder = root / "ladder.yaml"
    ladder.write_text(ladder_text(checks, timeout_s=check_timeout_s))
    out = root / "run"
    proc = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--model", model, "--out", str(out),
                    "--quiet"], timeout=timeout)
    assert (out / "results.json").exists(), proc.stderr[-3000:]
    return {c["id"]: c for c in json.loads((out / "results.json").read_text())["checks"]}
