"""The run header's estimate: a kind's own typical time first, then its family's."""

from __future__ import annotations

import json

from adaptcheck.base.schemas.ladder import CheckSpec
from adaptcheck.ladder.estimate import TYPICAL_BY_PREFIX, TYPICAL_DEFAULT_S, check_estimate
from adaptcheck.ladder.protocol import WorkerReply
from adaptcheck.ladder.registry import get_check_class


def _spec(kind: str, step: int = 4, **params: object) -> CheckSpec:
    return CheckSpec(id=f"x.{kind}", step=step, kind=kind, params=params)


def test_a_kind_that_declares_its_typical_time_is_estimated_by_it() -> None:
    assert get_check_class("framework.load").typical_s == 15.0
    assert check_estimate(_spec("framework.load", framework="transformers")) == (15.0, False)
    assert check_estimate(_spec("framework.collectives")) == (10.0, False)


def test_other_kinds_take_their_familys_time() -> None:
    assert get_check_class("framework.concurrent").typical_s is None
    assert check_estimate(_spec("framework.concurrent")) == (TYPICAL_BY_PREFIX["framework."], False)
    assert check_estimate(_spec("acme.unknown", step=2)) == (TYPICAL_DEFAULT_S, False)


def test_stated_times_and_malformed_params() -> None:
    assert check_estimate(_spec("perf.serving", step=5, levels=[1, 2], min_runs=3, duration_s=10)) == (60.0, True)
    assert check_estimate(_spec("perf.soak", step=5, duration_s=100, max_duration_s=200))[0] == 215.0
    # A malformed parameter is the check's own error to report: the estimate is the typical time.
    assert check_estimate(_spec("perf.serving", step=5, levels=3)) == (TYPICAL_BY_PREFIX["perf."], False)
    assert check_estimate(_spec("perf.soak", step=5, duration_s="long")) == (TYPICAL_BY_PREFIX["perf."], False)


def test_a_worker_reply_keeps_nan_and_inf_in_a_checks_figures() -> None:
    line = json.dumps({"id": "c", "outcomes": [{"status": "pass", "metrics": {"kl": float("nan")},
                                                "details": {"worst": [float("inf"), None]}}], "duration_s": 1.5})
    reply = WorkerReply.model_validate_json(line)
    assert reply.outcomes is not None and not reply.is_progress
    [outcome] = reply.outcomes
    assert outcome.metrics["kl"] != outcome.metrics["kl"] and outcome.details["worst"] == [float("inf"), None]
