"""On a machine with an accelerator: steps 1 and 2 of the quick ladder pass on it (skipped on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.accelerator


def test_quick_ladder_steps_1_2_reach_l1_on_the_accelerator(tmp_path: Path) -> None:
    done = run_cli(["run", "--ladder", "quick", "--steps", "1,2", "--out", str(tmp_path / "r"), "--format", "json"],
                   timeout=900)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results["device"]["backend"] != "cpu"
    failed = [c for c in results["checks"] if c["status"] in ("fail", "error")]
    assert not failed, failed
    assert results["grade"]["level"] == "L1"
    env = results["environment"]
    assert env["accelerators"], "the vendor tool or torch should list the devices"
