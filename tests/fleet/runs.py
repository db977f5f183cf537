"""Real runs of the tool for the fleet tests: ``adaptcheck run`` on tiny step-1/2 ladders.

Two ladders share the same four fast checks and differ only in their grade rules:

* ``high`` reaches L4 from steps 1-2 alone (L3 and L4 need ``matrix.capture``) and keeps L5
  behind ``matrix.known_good`` pointed at a file that never matches — so a run grades
  exactly L4 on any machine, and L5 only once a site file (``$ADAPTCHECK_KNOWN_GOOD``)
  knows the stack;
* ``low`` demands for L2 a tag no check carries, so it grades L1.

Runs: cpu/low, cpu/high, dummy/high (the test plugin's pretend accelerator: another
combination, graded L0 because its tensors stay on the CPU), cpu/high again — about 4 s
each. The session fixture writes them once under the session's base temp folder, so the
library and CLI test modules share them.

Other nodes, edited grades and broken files are *derived* from these real files with
:func:`derive`, which says in each test what was changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from adaptcheck.base.integrity import DIGEST_FIELD, compute_digest
from tests.conftest import run_cli

NEVER_MATCHES = {"schema_version": 1, "entries": [{
    "id": "never-matches", "description": "a stack no test machine has", "backend": "cuda", "device": "^NoSuchGPU$",
    "versions": {"torch": "==0.0.1"}, "source": "fleet tests", "date": "2026-12-02", "basis": "measured"}]}


def ladder(known_good_file: Path, *, low: bool) -> dict[str, Any]:
    """The ladder as data (see module doc)."""
    def level(lv: str, name: str, cond: dict[str, Any]) -> dict[str, Any]:
        return {"level": lv, "name": name, "conditions": [{"description": cond.pop("why"), **cond}]}

    l2 = {"id": "impossible", "why": "a tag no check has", "tags": ["never"]} if low else \
        {"id": "roundtrip", "why": "round trip", "checks": ["smoke.roundtrip"]}
    return {
        "schema_version": 1, "id": "fleet-low" if low else "fleet-high", "version": "1",
        "defaults": {"timeout_s": 60},
        "checks": [
            {"id": "matrix.capture", "step": 1, "kind": "matrix.capture"},
            {"id": "matrix.known_good", "step": 1, "kind": "matrix.known_good",
             "params": {"known_good_file": str(known_good_file)}},
            {"id": "smoke.device_visible", "step": 2, "kind": "smoke.device_visible"},
            {"id": "smoke.roundtrip", "step": 2, "kind": "smoke.roundtrip", "params": {"size_mib": 1}},
        ],
        "grade": {"levels": [
            level("L1", "device usable", {"id": "visible", "why": "device visible", "checks": ["smoke.device_visible"]}),
            level("L2", "model runs", l2),
            level("L3", "service usable", {"id": "captured", "why": "stack captured", "checks": ["matrix.capture"]}),
            level("L4", "performance optimizable", {"id": "captured4", "why": "stack captured", "checks": ["matrix.capture"]}),
            level("L5", "production sustainable", {"id": "known_good", "why": "known-good stack",
                                                   "checks": ["matrix.known_good"]}),
        ]},
    }


@dataclass
class FleetRuns:
    """The run folders' results files and the ladders that made them."""

    root: Path
    high_ladder: Path
    low_ladder: Path
    never_matches: Path
    cpu_low: Path
    cpu_high: Path
    dummy_high: Path
    cpu_high_again: Path

    @property
    def all(self) -> list[Path]:
        return [self.cpu_low, self.cpu_high, self.dummy_high, self.cpu_high_again]


def run(ladder_path: Path, out: Path, *, device: str | None = None, env: dict[str, str] | None = None) -> Path:
    """One real ``adaptcheck run``; returns its results.json."""
    args = ["run", "--ladder", str(ladder_path), "--out", str(out), "--quiet"] + (["--device", device] if device else [])
    # A known-good file set by whoever runs the tests must not leak into these runs.
    done = run_cli(args, env={"ADAPTCHECK_KNOWN_GOOD": "", **(env or {})}, timeout=180)
    assert done.returncode == 0, done.stderr
    return out / "results.json"


def _produce(root: Path) -> FleetRuns:
    never = root / "never_matches.yaml"
    never.write_text(yaml.safe_dump(NEVER_MATCHES, sort_keys=False))
    high, low = root / "high.yaml", root / "low.yaml"
    high.write_text(yaml.safe_dump(ladder(never, low=False), sort_keys=False))
    low.write_text(yaml.safe_dump(ladder(never, low=True), sort_keys=False))
    return FleetRuns(
        root=root, high_ladder=high, low_ladder=low, never_matches=never,
        cpu_low=run(low, root / "cpu-low", device="cpu"),
        cpu_high=run(high, root / "cpu-high", device="cpu"),
        dummy_high=run(high, root / "dummy-high", env={"ADAPTCHECK_DUMMY": "dummy"}),
        cpu_high_again=run(high, root / "cpu-high-again", device="cpu"),
    )


@pytest.fixture(scope="session", name="fleet_runs")
def fleet_runs_fixture(tmp_path_factory: pytest.TempPathFactory) -> FleetRuns:
    """The four real runs, produced once per session (every module importing this fixture
    finds the same folder: a marker file says the runs completed)."""
    root = tmp_path_factory.getbasetemp() / "fleet-runs"
    marker = root / "done.json"
    if marker.is_file():
        return FleetRuns(**{k: Path(v) for k, v in json.loads(marker.read_text()).items()})
    root.mkdir(exist_ok=True)
    runs = _produce(root)
    marker.write_text(json.dumps({k: str(v) for k, v in vars(runs).items()}))
    return runs


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def derive(src: Path, dest: Path, *, seal: bool = True, **changes: Any) -> Path:
    """A copy of a real results file with top-level ``changes``; nested ones as 'a.b' keys
    (``**{"environment.hostname": "node-b"}``). Returns the new file.

    ``seal`` (default): the copy gets a digest matching its new content, as if another node's
    run had written it — merge refuses edited files, and most tests stand for real other runs.
    ``seal=False`` leaves the original digest: a hand-edited file, as a forger leaves it."""
    data = load(src)
    for dotted, value in changes.items():
        target = data
        *parents, last = dotted.split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = value
    if seal:
        data.pop(DIGEST_FIELD, None)
        data[DIGEST_FIELD] = compute_digest(data)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return dest
