"""Site known-good files: ``$ADAPTCHECK_KNOWN_GOOD`` is read in addition to the base file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.paths import data_dir
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.base.yamldata import MatrixError
from adaptcheck.compat.known_good import (
    KNOWN_GOOD_ENV,
    extra_known_good_files,
    load_known_good_sources,
)
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.matrix.checks import KnownGoodCheck, KnownGoodParams
from tests.steps.matrix.factories import make_env

SHIPPED = data_dir("matrices") / "known_good.yaml"


def _file(path: Path, entry_id: str, torch: str) -> Path:
    path.write_text(yaml.safe_dump({"schema_version": 1, "entries": [{
        "id": entry_id, "description": "site stack", "backend": "cpu", "arch": "x86_64",
        "versions": {"torch": torch}, "source": "measured here", "date": "2026-12-02", "basis": "measured"}]}))
    return path


def _ctx(tmp_path: Path, torch: str) -> CheckContext:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec())
    ctx.scratch["matrix.environment"] = make_env(torch=torch)
    return ctx


def test_env_var_lists_files_in_order() -> None:
    value = os.pathsep.join(["/a/one.yaml", "", "/b/two.yaml"])
    assert extra_known_good_files({KNOWN_GOOD_ENV: value}) == [Path("/a/one.yaml"), Path("/b/two.yaml")]
    assert extra_known_good_files({}) == []


def test_site_entry_matches_a_stack_the_shipped_file_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.14 on CPU is not in the shipped file (its CPU entries pin 2.13).
    site = _file(tmp_path / "site.yaml", "site-cpu-torch-2.14", "==2.14.0+cpu")
    monkeypatch.delenv(KNOWN_GOOD_ENV, raising=False)
    out = KnownGoodCheck().run(_ctx(tmp_path, "2.14.0+cpu"), KnownGoodParams())
    assert out.status is Status.FAIL and out.details["files"] == [str(SHIPPED)]

    monkeypatch.setenv(KNOWN_GOOD_ENV, str(site))
    out = KnownGoodCheck().run(_ctx(tmp_path, "2.14.0+cpu"), KnownGoodParams())
    assert out.status is Status.PASS and "site-cpu-torch-2.14" in out.message
    assert out.details["entry_file"] == str(site)
    assert out.details["files"] == [str(SHIPPED), str(site)]
    assert out.details["extra_files_env"] == KNOWN_GOOD_ENV
    # The shipped entries are still read: a 2.13 stack matches the shipped one, not the site's.
    out = KnownGoodCheck().run(_ctx(tmp_path, "2.13.0+cpu"), KnownGoodParams())
    assert out.status is Status.PASS and out.details["entry_file"] == str(SHIPPED)


def test_param_replaces_the_base_file_but_site_files_still_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _file(tmp_path / "base.yaml", "base-2.12", "==2.12.0+cpu")
    site = _file(tmp_path / "site.yaml", "site-2.14", "==2.14.0+cpu")
    monkeypatch.setenv(KNOWN_GOOD_ENV, str(site))
    params = KnownGoodParams(known_good_file=str(base))
    assert KnownGoodCheck().run(_ctx(tmp_path, "2.13.0+cpu"), params).status is Status.FAIL  # shipped file not read
    out = KnownGoodCheck().run(_ctx(tmp_path, "2.14.0+cpu"), params)
    assert out.status is Status.PASS and out.details["files"] == [str(base), str(site)]


def test_an_id_defined_twice_names_both_files(tmp_path: Path) -> None:
    one = _file(tmp_path / "one.yaml", "same-id", "==2.14.0+cpu")
    two = _file(tmp_path / "two.yaml", "same-id", "==2.15.0+cpu")
    with pytest.raises(MatrixError, match=r"two\.yaml: known-good entry id 'same-id' is also defined in .*one\.yaml"):
        load_known_good_sources(one, [two])


def test_a_missing_site_file_is_an_error_not_a_silent_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KNOWN_GOOD_ENV, str(tmp_path / "nope.yaml"))
    with pytest.raises(MatrixError, match=r"nope.yaml: cannot read"):
        KnownGoodCheck().run(_ctx(tmp_path, "2.13.0+cpu"), KnownGoodParams())
