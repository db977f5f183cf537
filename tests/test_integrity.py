"""results.json's digest: what save writes, what verify accepts and what it calls an edit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.integrity import Integrity, compute_digest, verify_file, verify_text
from adaptcheck.base.schemas.results import SCHEMA_VERSION, CheckResult, RunResults, Status
from tests.report.factory import make_results


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "results.json"
    make_results().save(path)
    return path


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _independent_digest(content: dict[str, Any]) -> str:
    """The documented rule, written out again: no digest field, keys sorted, compact, SHA-256."""
    body = {k: v for k, v in content.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def test_save_seals_the_file_with_the_documented_digest(tmp_path: Path) -> None:
    results = make_results()
    path = tmp_path / "results.json"
    returned = results.save(path)
    data = _load(path)
    assert data["schema_version"] == SCHEMA_VERSION == "1.7"
    assert data["digest"] == returned == results.digest  # the object carries what the file carries
    assert data["digest"] == _independent_digest(data)
    assert verify_file(path).status is Integrity.INTACT
    # Saving again (e.g. an object loaded from a file) gives the same seal, not a digest of a digest.
    again = tmp_path / "again.json"
    assert RunResults.load(path).save(again) == returned


def test_digest_rule_is_the_canonical_one_not_the_file_text(saved: Path) -> None:
    data = _load(saved)
    raw_text_digest = "sha256:" + hashlib.sha256(saved.read_bytes()).hexdigest()
    assert data["digest"] != raw_text_digest  # a digest of the bytes would break on re-indenting
    unsorted = json.dumps({k: v for k, v in data.items() if k != "digest"}, separators=(",", ":"))
    assert data["digest"] != "sha256:" + hashlib.sha256(unsorted.encode()).hexdigest()
    assert compute_digest(data) == compute_digest({**data, "digest": "sha256:" + "0" * 64})


def _check(data: dict[str, Any], cid: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in data["checks"] if c["id"] == cid)
    return found


@pytest.mark.parametrize("edit", [
    lambda d: _check(d, "smoke.matmul")["metrics"].__setitem__("n", 513),              # one metric value
    lambda d: _check(d, "smoke.matmul")["metrics"].__setitem__("cosine", 0.99999913),  # last digits of a float
    lambda d: _check(d, "smoke.matmul")["metrics"].__setitem__("n", 512.0),            # int → float
    lambda d: _check(d, "matrix.rules.vllm_torch").__setitem__("status", "pass"),      # a failed check "fixed"
    lambda d: _check(d, "matrix.known_good").__setitem__("message", "no known-good entry matches."),
    lambda d: d["grade"].__setitem__("level", "L5"),
    lambda d: d["checks"].pop(),                                                        # a result removed
    lambda d: d.__setitem__("note", "added"),                                           # a field added
])
def test_any_change_of_content_is_an_edit(saved: Path, edit: Any) -> None:
    data = _load(saved)
    matmul = _check(data, "smoke.matmul")["metrics"]
    assert (matmul["n"], matmul["cosine"]) == (512, 0.99999912)  # the values the edits change
    assert _check(data, "matrix.rules.vllm_torch")["status"] == "fail"
    edit(data)
    saved.write_text(json.dumps(data, indent=2))
    result = verify_file(saved)
    assert result.status is Integrity.EDITED and not result.intact
    assert result.stored == data["digest"] and result.computed != result.stored
    assert "edited after the run" in result.message


def test_reformatting_is_not_an_edit(saved: Path) -> None:
    """Whitespace and key order are not content: a pretty-printer or a jq pass keeps it intact."""
    data = _load(saved)
    saved.write_text(json.dumps(data))  # compact
    assert verify_file(saved).intact
    saved.write_text(json.dumps(data, indent=4, sort_keys=True, ensure_ascii=True) + "\n\n")
    assert verify_file(saved).intact
    reordered = dict(reversed(list(data.items())))
    reordered["checks"] = [dict(reversed(list(c.items()))) for c in data["checks"]]
    saved.write_text(json.dumps(reordered, indent=1))
    assert verify_file(saved).intact


def test_awkward_values_round_trip_through_the_file(tmp_path: Path) -> None:
    """Floats, huge ints, non-ASCII, NaN/inf (written as null) all verify after save."""
    check = CheckResult(step=2, id="smoke.matmul", kind="smoke.matmul", status=Status.PASS,
                        message="größe 東京 ✓ \u2028 \"quoted\" \\ back",
                        metrics={"sum": 0.1 + 0.2, "tiny": 5e-324, "big": 1.7976931348623157e308, "neg0": -0.0,
                                 "huge_int": 2**80, "nan": float("nan"), "inf": float("inf")})
    path = tmp_path / "results.json"
    make_results(checks=[check]).save(path)
    assert verify_file(path).intact
    assert _load(path)["checks"][0]["metrics"]["nan"] is None


def test_missing_digest_is_reported_as_such(saved: Path) -> None:
    data = _load(saved)
    del data["digest"]
    saved.write_text(json.dumps(data))
    assert verify_file(saved).status is Integrity.NO_DIGEST
    data["digest"] = None
    saved.write_text(json.dumps(data))
    result = verify_file(saved)
    assert result.status is Integrity.NO_DIGEST and not result.intact and "no digest" in result.message


@pytest.mark.parametrize("digest", ["sha256:abc", "md5:" + "0" * 32, 42, "SHA256:" + "0" * 64])
def test_malformed_digest_is_an_edit(saved: Path, digest: object) -> None:
    data = _load(saved)
    data["digest"] = digest
    saved.write_text(json.dumps(data))
    assert verify_file(saved).status is Integrity.EDITED


def test_duplicate_key_is_an_edit(saved: Path) -> None:
    """A repeated key reads differently in different JSON readers; save never writes one."""
    text = saved.read_text()
    doctored = text.replace('"status": "fail"', '"status": "pass", "status": "fail"', 1)
    assert doctored != text
    assert verify_text(doctored).status is Integrity.EDITED
    assert "appears twice" in verify_text(doctored).message


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "", '{"digest": NaN}'])
def test_unreadable_text(text: str) -> None:
    result = verify_text(text, "r.json")
    assert result.status is Integrity.UNREADABLE and result.message.startswith("r.json: ")


def test_unreadable_files(tmp_path: Path) -> None:
    assert verify_file(tmp_path / "missing.json").status is Integrity.UNREADABLE
    assert verify_file(tmp_path).status is Integrity.UNREADABLE  # a folder
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert verify_file(binary).status is Integrity.UNREADABLE


def test_schema_1_0_files_without_digest_still_load(saved: Path) -> None:
    data = _load(saved)
    del data["digest"]
    data["schema_version"] = "1.0"
    saved.write_text(json.dumps(data))
    loaded = RunResults.load(saved)
    # Loaded through the upgrades (adaptcheck/base/schemas/upgrade.py): the object has today's
    # shape and says so; the file itself is left as written.
    assert loaded.digest is None and loaded.schema_version == SCHEMA_VERSION
    assert _load(saved)["schema_version"] == "1.0"
    assert verify_file(saved).status is Integrity.NO_DIGEST
