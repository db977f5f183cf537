"""procs: what an in-process engine sets in os.environ stays out of the children started later."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from adaptcheck import procs


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(procs, "_PROCESS_LOCAL", {})
    yield


def test_changes_inside_the_block_are_left_out_of_children(clean_registry: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AC_TEST_USER", "mine")
    monkeypatch.setenv("AC_TEST_CHANGED", "before")
    monkeypatch.delenv("AC_TEST_ADDED", raising=False)
    with procs.process_local_environ():
        os.environ["AC_TEST_ADDED"] = "engine"  # e.g. VLLM_ENABLE_V1_MULTIPROCESSING=0
        os.environ["AC_TEST_CHANGED"] = "engine"
    monkeypatch.setenv("AC_TEST_LATER", "set after the block")  # a caller's own change still reaches children
    env = procs.child_environ()
    assert "AC_TEST_ADDED" not in env
    assert env["AC_TEST_CHANGED"] == "before"
    assert env["AC_TEST_USER"] == "mine" and env["AC_TEST_LATER"] == "set after the block"
    assert os.environ["AC_TEST_ADDED"] == "engine"  # the process itself keeps what its engine needs
    # A given base is cleaned the same way.
    assert procs.child_environ({"AC_TEST_ADDED": "x", "K": "v"}) == {"K": "v", "AC_TEST_CHANGED": "before"}
    monkeypatch.delenv("AC_TEST_ADDED")


def test_nothing_recorded_leaves_the_environment_as_it_is(clean_registry: None) -> None:
    with procs.process_local_environ():
        pass
    assert procs.child_environ() == dict(os.environ)
