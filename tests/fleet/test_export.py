"""Known-good export: exact pins, escaped regexes, L4+ only, read back by the check's own loader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compat.known_good import (
    KnownGoodEntry,
    differences,
    load_known_good,
    match_known_good,
)
from adaptcheck.compat.stackkeys import fits
from adaptcheck.fleet import export_known_good
from adaptcheck.fleet.export import device_regex, pin

from .runs import FleetRuns, derive, fleet_runs_fixture, load  # noqa: F401 - a fixture


@pytest.mark.parametrize(("value", "expected", "neighbours"), [
    ("2.13.0+cpu", "==2.13.0+cpu", ["2.13.1+cpu", "2.13.0+cu129", "2.13.0"]),
    ("3.11.7", "==3.11.7", ["3.11.8", "3.11.70", "3.1.17"]),
    # Not in normal PEP 440 form: pinned literally (PEP 440 would rewrite them as 535.104.5 and 8.0rc2).
    ("535.104.05", r"re:535\.104\.05", ["535.104.06", "535.104", "535x104x05"]),
    ("8.0.RC2", r"re:8\.0\.RC2", ["8.0.RC3", "8x0xRC2", "8.0.RC21"]),
    ("AVX512", "re:AVX512", ["AVX2", "AVX512_BF16"]),
])
def test_pins_are_exact(value: str, expected: str, neighbours: list[str]) -> None:
    assert pin(value) == expected
    assert fits(pin(value), value)
    for other in neighbours:
        assert not fits(pin(value), other), other


def test_device_regex_is_literal_and_whole() -> None:
    rx = device_regex(["Intel(R) Xeon(R) Processor", "NVIDIA H100 80GB HBM3"])
    for name in ("Intel(R) Xeon(R) Processor", "NVIDIA H100 80GB HBM3"):
        assert re.search(rx, name)
    # Unescaped, '(R)' would be a group matching 'R' and '.' any character; unanchored, a prefix would do.
    for name in ("IntelR XeonR Processor", "Intel(R) Xeon(R) Processor v2", "NVIDIA H100 80GB HBM3e", "x NVIDIA H100 80GB HBM3"):
        assert not re.search(rx, name), name


def test_export_round_trips_and_matches_its_own_machine_only(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    out = tmp_path / "site" / "known_good.local.yaml"
    done = export_known_good(fleet_runs.all, out, prefix="lab")
    assert done.output == str(out) and len(done.entries) == 1 and done.kept == 0
    entry = done.entries[0]
    assert [r.reason for r in done.refused] and "L0, below L4" in done.refused[0].reason  # the dummy combination

    reread = load_known_good(out)  # the loader matrix.known_good uses; raises on any schema problem
    assert reread.entries == [entry]
    assert out.read_text().startswith("# Known-good stacks measured on this site")
    assert entry.id.startswith("lab-cpu-") and entry.basis == "measured" and entry.backend == "cpu"
    latest = RunResults.load(fleet_runs.cpu_high_again)
    env = latest.environment
    assert env is not None
    assert entry.arch == env.arch and entry.versions["torch"] == f"=={env.torch}"
    assert entry.versions["python"] == f"=={env.python}"
    assert all(v.startswith(("==", "re:")) for v in entry.versions.values())
    for needle in (latest.run_id, RunResults.load(fleet_runs.cpu_low).run_id, env.hostname, "graded L4",
                   latest.started_at.date().isoformat()):
        assert needle in entry.source

    assert differences(env, entry) == []
    assert match_known_good(env, reread).matched
    dummy_env = RunResults.load(fleet_runs.dummy_high).environment
    assert dummy_env is not None and not match_known_good(dummy_env, reread).matched
    # One patch release of torch away is another stack.
    newer = env.model_copy(update={"torch": "2.99.0+cpu"})
    assert differences(newer, entry) == [f"torch is 2.99.0+cpu, entry wants =={env.torch}"]


def test_l3_is_refused_and_nothing_is_written(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    # The real high run with its L4 condition rewritten to need a tag no check has: it grades L3.
    rules = load(fleet_runs.cpu_high)["grade_rules"]
    rules["levels"][3]["conditions"] = [{"id": "x", "description": "never", "tags": ["never"]}]
    l3 = derive(fleet_runs.cpu_high, tmp_path / "l3.json", grade_rules=rules)
    out = tmp_path / "kg.yaml"
    done = export_known_good([l3, fleet_runs.dummy_high], out)
    assert done.entries == [] and done.output is None and not out.exists()
    assert sorted(r.reason.split(", ")[0].rsplit(" ", 1)[1] for r in done.refused) == ["L0", "L3"]


def test_reexport_replaces_by_id_and_keeps_other_entries(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    out = tmp_path / "kg.yaml"
    hand = KnownGoodEntry(id="hand-written", description="kept", backend="cuda", versions={"torch": "==2.9.0"},
                          source="a colleague", date="2026-12-02", basis="measured")
    out.write_text(yaml.safe_dump({"schema_version": 1, "entries": [hand.model_dump(exclude_none=True)]}))
    first = export_known_good([fleet_runs.cpu_high], out)
    second = export_known_good([fleet_runs.cpu_high, fleet_runs.cpu_high_again], out)
    assert first.kept == second.kept == 1 and first.entries[0].id == second.entries[0].id
    entries = load_known_good(out).entries
    assert [e.id for e in entries] == ["hand-written", first.entries[0].id]
    assert RunResults.load(fleet_runs.cpu_high_again).run_id in entries[1].source  # refreshed


def test_an_invalid_existing_file_is_not_overwritten(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    from adaptcheck.base.yamldata import MatrixError

    out = tmp_path / "kg.yaml"
    out.write_text("schema_version: 1\nentries: [{id: x}]\n")
    with pytest.raises(MatrixError, match=r"kg.yaml"):
        export_known_good([fleet_runs.cpu_high], out)
    assert out.read_text() == "schema_version: 1\nentries: [{id: x}]\n"
