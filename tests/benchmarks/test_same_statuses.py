"""benchmarks/same_statuses.py: a changed status is found and exits 1; the same file exits 0."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.benchmarks import load_script

STORED = Path(__file__).resolve().parents[1] / "report" / "data" / "quick-run.results.json.gz"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = tmp_path / "a.json"
    path.write_bytes(gzip.decompress(STORED.read_bytes()))
    return path


def _flip_first_pass(path: Path, target: Path) -> str:
    """A copy of the results with the first passing check failed (digest dropped: not a trusted file)."""
    data = json.loads(path.read_text())
    check = next(c for c in data["checks"] if c["status"] == "pass")
    check["status"] = "fail"
    data.pop("digest", None)
    target.write_text(json.dumps(data))
    return str(check["id"])


def test_the_same_results_have_the_same_statuses(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("same_statuses").main([str(results), str(results)]) == 0
    assert " 0 different" in capsys.readouterr().out


def test_a_changed_status_is_named_and_fails(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changed = _flip_first_pass(results, tmp_path / "b.json")
    script = load_script("same_statuses")
    assert script.main([str(results), str(tmp_path / "b.json")]) == 1
    assert f"{changed}: pass -> fail" in capsys.readouterr().out
    assert script.main([str(results), str(tmp_path / "b.json"), "--ignore", changed]) == 0
