"""benchmarks/step4_false_failures.py builds its matrix ladder with the sizes asked for: the
quick ladder's step-4 sizes (what a user runs by default) or the params models' defaults, and
the ladder it writes loads under the strict ladder schema."""

from __future__ import annotations

from pathlib import Path

import yaml

from adaptcheck.ladder.loader import parse_ladder
from tests.benchmarks import load_script


def test_quick_sizes_reach_every_check_of_their_kind(tmp_path: Path) -> None:
    bench = load_script("step4_false_failures")
    sizes = bench.ladder_sizes("quick")
    assert sizes["framework.reference"]["prompts"] == 3
    text = bench.ladder(["transformers", "vllm"], ["bf16"], ["auto"], ["reference", "concurrent", "kv_cache"], sizes)
    parse_ladder(text, "false-failures.yaml")  # the strict schema: every size is a known field
    checks = {c["id"]: c["params"] for c in yaml.safe_load(text)["checks"]}
    assert checks["vllm.auto.bf16.concurrent"]["teacher"] == sizes["framework.concurrent"]["teacher"]
    assert checks["vllm.auto.bf16.concurrent"]["framework"] == "vllm"  # the size table never picks the framework
    assert checks["transformers.auto.bf16.kv_cache"]["rounds"] == 2
    plain = yaml.safe_load(bench.ladder(["transformers"], ["bf16"], ["auto"], ["reference"]))["checks"][0]["params"]
    assert "prompts" not in plain  # defaults: the params models' own
