"""Smoke test of benchmarks/soak_false_decisions.py: a tiny simulation prints its table and verdict."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_script


def test_prints_every_case_and_passes_a_sound_rule(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("soak_false_decisions")
    assert script.main(["--rule", "10:20:40:3:3:1", "--noise", "2", "--trials", "40"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("10:20:40:3:3:1 20-40s/3 ")]
    assert len(rows) == 3 * 3, out  # three cases, three autocorrelations
    for case in ("at bound", "flat", "2 x bound"):
        assert sum(case in row for row in rows) == 3, out
    assert "largest wrong-decision rate at the bound" in out


def test_the_ladders_rules_are_read_from_the_shipped_ladders() -> None:
    rules = load_script("soak_false_decisions").ladder_rules()
    assert [label for label, _, _ in rules] == ["quick", "standard"]
    for _, rule, interval in rules:
        assert rule.last_s >= rule.first_s > rule.warmup_s and interval > 0 and rule.bound_mib_per_min == 10
