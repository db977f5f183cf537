"""A value the installed vLLM rejects: one line with vLLM's own message in that check, and the
checks after it still run (issue 29, "Bad input")."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.steps.frameworks.test_framework_checks import fw_check, run_ladder

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")]


def test_a_rejected_engine_argument_is_one_line_and_the_run_goes_on(write_ladder: Callable[..., Path],
                                                                    tmp_path: Path) -> None:
    checks = [fw_check("fw.vllm.bad", "single_request", "vllm", compile=False,
                       engine_args={"kv_cache_dtype": "fp9_e9m9"}),
              fw_check("fw.vllm.good", "single_request", "vllm", compile=False)]
    by_id, _, _ = run_ladder(write_ladder, tmp_path, checks, "--model", "embedded:tiny-llama")
    bad, good = by_id["fw.vllm.bad"], by_id["fw.vllm.good"]
    assert bad["status"] == "error"
    message = bad["message"]
    assert "\n" not in message and "Traceback" not in message
    assert "fp9_e9m9" in message  # vLLM's own words name the value it refused
    assert good["status"] == "pass"
