"""Pytest plugin: real OpenAI-compatible servers on the tiny synthetic Llama, one per session.

``vllm_server`` and ``transformers_server`` start ``vllm serve`` / ``transformers serve``
once per test session (start-up costs ~60 s for vLLM on 2 cores, ~6 s for transformers)
and stop them at the end; a test that needs a server it does not own must not stop it.
Each skips with the reason when its framework cannot serve here. The vLLM fixture's
teardown also checks that stopping left no process of its tree behind (vLLM's engine
core outlives a killed API server), which tests :meth:`ManagedServer.stop` on vLLM at no
extra start-up cost.

Registered from ``tests/conftest.py`` (``pytest_plugins``), so any test folder can use them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptcheck.base.procs import pid_alive
from adaptcheck.frameworks.server import ManagedServer, ServerSpec

VLLM_START_TIMEOUT_S = 600.0
TRANSFORMERS_START_TIMEOUT_S = 180.0


def serving_unavailable(kind: str) -> str | None:
    """Why ``kind`` serve cannot run here (None when it can); checked without importing the framework."""
    needed = {
        # The API server, plus httpx for adaptcheck's client.
        "vllm": ["vllm", "httpx"],
        # transformers[serving]: the server stack, and accelerate, without which
        # ``--device cpu`` (a device_map) refuses to load the model.
        "transformers": ["transformers", "fastapi", "uvicorn", "openai", "accelerate", "httpx"],
    }[kind]
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        return f"{kind} serve is not usable here: missing {', '.join(missing)}"
    return None


@pytest.fixture(scope="session")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny synthetic Llama (``embedded:tiny-llama``, seed 0) the session's servers serve."""
    from adaptcheck.frameworks.synthetic import ensure_model

    return ensure_model("tiny-llama", root=tmp_path_factory.mktemp("served-models"))


def _serve(kind: str, model: Path, log_dir: Path, timeout_s: float, **spec_kw: object) -> ManagedServer:
    reason = serving_unavailable(kind)
    if reason:
        pytest.skip(reason)
    server = ManagedServer(ServerSpec(kind, model, dtype="fp32", **spec_kw), log_dir)  # type: ignore[arg-type]
    server.start(timeout_s)  # a ServerStartError here is an error of every test using it, not a skip
    return server


@pytest.fixture(scope="session")
def vllm_server(served_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    """``vllm serve`` on the tiny Llama, fp32, eager (compiling buys nothing at this size)."""
    server = _serve("vllm", served_model, tmp_path_factory.mktemp("vllm-serve-logs"), VLLM_START_TIMEOUT_S,
                    enforce_eager=True, max_model_len=1024, served_model_name="tiny-llama")
    tree = server.process_tree()
    try:
        yield server
    finally:
        tree = sorted(set(tree) | set(server.process_tree()))
        server.stop()
    leftovers = [p for p in tree if pid_alive(p)]
    assert not leftovers, f"ManagedServer.stop() left vLLM processes behind: {leftovers}"


@pytest.fixture(scope="session")
def transformers_server(served_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    """``transformers serve`` on the tiny Llama, fp32, CPU."""
    server = _serve("transformers", served_model, tmp_path_factory.mktemp("transformers-serve-logs"),
                    TRANSFORMERS_START_TIMEOUT_S)
    try:
        yield server
    finally:
        server.stop()
