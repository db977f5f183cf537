"""Check kind ``perf.regression`` through a real run folder: the baseline copy, the journal of the
current run (environment lifted from the capture check as the session does), and each outcome —
skip without a baseline, pass on a same-machine rerun, fail on a planted regression, skip for
another device or when no performance figure was compared."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.compare import Comparison
from adaptcheck.ladder.check import CheckContext
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.ladder.runner import JournalWriter
from adaptcheck.runfolder import BASELINE, JOURNAL, LADDER_SNAPSHOT, RUN_META, RunMeta
from adaptcheck.steps.perf.regression import (
    NO_BASELINE,
    RegressionCheck,
    RegressionParams,
)
from tests.compare.helpers import BASELINE as BASELINE_FILE
from tests.compare.helpers import gemm_row, load_pair, scale_row_time, sealed_text
from tests.conftest import ladder_text

# One journal record carries every result of the recorded run; this check is planned last.
LADDER = [{"id": "recorded", "step": 5, "kind": "dummy.skip"},
          {"id": "perf.regression", "step": 5, "kind": "perf.regression"}]


def _run_dir(tmp_path: Path, current: RunResults, baseline_text: str | None) -> CheckContext:
    """A run folder as ``adaptcheck run --baseline`` leaves it just before perf.regression runs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    meta = RunMeta(run_id="20261130-000000-cpu-test", started_at=current.started_at, command=["adaptcheck", "run"],
                   ladder=current.ladder, seed=0, steps=[1, 2, 3, 4, 5], device=current.device)
    (tmp_path / RUN_META).write_text(meta.model_dump_json())
    (tmp_path / LADDER_SNAPSHOT).write_text(ladder_text(LADDER))
    results: list[CheckResult] = []
    for c in current.checks:
        if c.kind == "perf.regression" or c.id == "perf.regression":
            continue
        if c.kind == "matrix.capture" and current.environment is not None:
            # The journal holds the environment inside the capture check's details.
            c = c.model_copy(update={"details": {**c.details, "environment": current.environment.model_dump(mode="json")}})
        results.append(c)
    JournalWriter(tmp_path / JOURNAL).append("recorded", results)
    if baseline_text is not None:
        (tmp_path / BASELINE).write_text(baseline_text)
    return CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec(),
                        check_id="perf.regression")


def _run(ctx: CheckContext, **params: object) -> tuple[Status, str, Comparison | None]:
    out = RegressionCheck().run(ctx, RegressionParams(**params))  # type: ignore[arg-type]
    assert not isinstance(out, list)
    comparison = Comparison.from_data(out.details, "details") if out.details else None
    if comparison is not None:
        assert out.metrics == {**comparison.counts.model_dump(), "baseline_verified": int(comparison.baseline.verified)}
    return out.status, out.message, comparison


def test_registered_with_a_strict_params_model() -> None:
    assert get_check_class("perf.regression") is RegressionCheck
    assert RegressionCheck.step == 5
    assert RegressionParams().require_perf is True
    with pytest.raises(ValidationError):
        RegressionParams(noise_multipler=2)  # type: ignore[call-arg]


def test_no_baseline_is_a_skip_that_blocks_l5(tmp_path: Path) -> None:
    _, rerun = load_pair()
    out = RegressionCheck().run(_run_dir(tmp_path, rerun, None), RegressionParams())
    assert not isinstance(out, list)
    assert (out.status, out.applicable, out.message) == (Status.SKIP, True, NO_BASELINE)


def test_same_machine_rerun_passes(tmp_path: Path) -> None:
    _, rerun = load_pair()
    status, message, c = _run(_run_dir(tmp_path, rerun, sealed_text(BASELINE_FILE)))
    assert status is Status.PASS, message
    assert c is not None and c.counts.perf_compared >= 40 and not c.regressions
    assert message.startswith("no regression against run 20261129-213300-cpu-3b2105")
    # The environment came out of the journal's capture check: only the ladder edit differs,
    # and the baseline's own perf.regression result is not listed as removed.
    assert [e.what for e in c.environment] == ["ladder sha256"]
    assert c.removed_checks == [] and c.added_checks == []


def test_planted_regression_fails_and_names_it(tmp_path: Path) -> None:
    _, rerun = load_pair()
    scale_row_time(gemm_row(rerun), 2.0)  # twice as slow: far beyond 3 × its ~20 % spread
    status, message, c = _run(_run_dir(tmp_path, rerun, sealed_text(BASELINE_FILE)))
    assert status is Status.FAIL
    assert message.startswith("1 regression(s) against run 20261129-213300-cpu-3b2105: perf.gemm prefill "
                              "m=2048 n=4096 k=4096 bf16: median time")
    assert c is not None and [r.category for r in c.regressions] == ["performance"]


def test_baseline_of_another_device_is_not_comparable(tmp_path: Path) -> None:
    baseline, rerun = load_pair()
    baseline.device.device_name = "AMD EPYC 9654"
    status, message, c = _run(_run_dir(tmp_path, rerun, sealed_text(baseline)))
    assert status is Status.SKIP and message.startswith("baseline not comparable: different devices")
    assert c is not None and not c.comparable


def test_without_performance_figures_it_is_not_a_pass_unless_allowed(tmp_path: Path) -> None:
    _, rerun = load_pair()
    rerun.checks = [c for c in rerun.checks if c.step < 5]
    ctx = _run_dir(tmp_path, rerun, sealed_text(BASELINE_FILE))
    status, message, c = _run(ctx)
    assert status is Status.SKIP and "no performance figure was measured in both" in message
    assert c is not None and c.counts.perf_compared == 0 and c.counts.checks_removed > 0
    status, _, _ = _run(ctx, require_perf=False)
    assert status is Status.PASS
    # A regression still fails, figures or not.
    next(c for c in rerun.checks if c.id == "ops.gemm.bf16").metrics["ratio_to_tolerance"] *= 3
    status, message, _ = _run(_run_dir(tmp_path / "again", rerun, sealed_text(BASELINE_FILE)), require_perf=False)
    assert status is Status.FAIL and "ops.gemm.bf16 ratio_to_tolerance" in message


def test_unreadable_baseline_copy_is_an_error(tmp_path: Path) -> None:
    _, rerun = load_pair()
    out = RegressionCheck().run(_run_dir(tmp_path, rerun, "{not json"), RegressionParams())
    assert not isinstance(out, list)
    assert out.status is Status.ERROR and "baseline copy cannot be read" in out.message


def test_unverified_baseline_copy_is_marked_in_the_evidence(tmp_path: Path) -> None:
    """A baseline admitted with 'run --allow-unverified' (here the real schema-1.0 file, no
    digest) is compared, but the message, details and metrics say nothing vouches for it."""
    _, rerun = load_pair()
    ctx = _run_dir(tmp_path, rerun, BASELINE_FILE.read_text())
    out = RegressionCheck().run(ctx, RegressionParams())
    assert not isinstance(out, list)
    assert out.status is Status.PASS and out.message.startswith("UNVERIFIED baseline (no digest): no regression")
    assert out.metrics["baseline_verified"] == 0
    details = Comparison.from_data(out.details, "details")
    assert (details.baseline.verified, details.baseline.integrity) == (False, "no_digest")
    assert details.verdict.startswith("UNVERIFIED baseline (no digest): ")
    # The same content sealed: verified, and no mark.
    _status, message, c = _run(_run_dir(tmp_path / "sealed", rerun, sealed_text(BASELINE_FILE)))
    assert c is not None and c.baseline.verified and c.baseline.integrity == "intact"
    assert "UNVERIFIED" not in message
