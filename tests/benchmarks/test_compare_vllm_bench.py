"""Smoke test of benchmarks/compare_vllm_bench.py: one tiny round of each client on the session's vLLM server.

Timings are not asserted (the tolerance is opened wide): the full comparison takes minutes and
its verdict is quoted in benchmarks/README.md. Only that both clients ran the same work and the
table came out is.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from adaptcheck.frameworks.server import ManagedServer

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_vllm_bench.py"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_one_round_against_the_session_server(vllm_server: ManagedServer, served_model: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--url", vllm_server.base_url, "--served-name", "tiny-llama",
                           "--tokenizer", str(served_model), "--rounds", "1", "--num-prompts", "4",
                           "--input-len", "16", "--output-len", "4", "--warmups", "1", "--concurrency", "2",
                           "--tolerance", "100"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "output tokens/run vLLM 16 vs adaptcheck 16" in out  # the same work on both sides
    assert "vs adaptcheck 16.0;" in out  # vLLM's random prompts are 16 tokens give or take a re-encoding
    for figure in ("median TTFT (ms)", "median TPOT (ms)", "output tok/s", "adaptcheck client:", "PASS"):
        assert figure in out, out
