"""Every step-1 check writes its details through its kind's evidence model: what a check stores
parses back as that model with no undeclared key, on several backends' stacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.matrix_evidence import (
    CaptureEvidence,
    KnownGoodEvidence,
    RuleCompared,
    RuleEvidence,
    TelemetryEvidence,
)
from adaptcheck.ladder.check import CheckContext, NoParams, Outcome
from adaptcheck.steps.matrix.checks import (
    CaptureCheck,
    KnownGoodCheck,
    KnownGoodParams,
    RulesCheck,
    RulesParams,
    TelemetryCheck,
    TelemetryParams,
)
from tests.steps.matrix.factories import make_env

STACKS = {
    "cpu": make_env(),
    "cuda": make_env(backend="cuda", device_arch="sm_90", torch_archs=["sm_80"], torch="2.5.1+cu124",
                     runtimes={"cuda": "12.4"}, driver_version="470.1"),
    "ascend": make_env(backend="ascend", torch="2.5.1", runtimes={"cann": "8.0.RC3"},
                       packages={"vllm-ascend": "0.7.3", "torch-npu": "2.4.0", "vllm": "0.7.3"}),
}


def _ctx(tmp_path: Path, env: Environment | None = None) -> CheckContext:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=0, run_dir=tmp_path, model=ModelSpec())
    if env is not None:
        ctx.scratch["matrix.environment"] = env
    return ctx


def _typed(outcome: Outcome, model: type[Evidence]) -> Evidence:
    evidence = model.parse(outcome.details)
    assert evidence.extras == {}
    assert evidence.dump() == outcome.details
    return evidence


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_rules_and_known_good_details_are_typed(tmp_path: Path, stack: str) -> None:
    ctx = _ctx(tmp_path, STACKS[stack])
    for o in RulesCheck().run(ctx, RulesParams()):
        rule = _typed(o, RuleEvidence)
        assert isinstance(rule, RuleEvidence) and rule.compared is not None
        # Each rule type's own record, not the catch-all (which only an unevaluable rule gives).
        assert type(rule.compared) is not RuleCompared or o.status.value == "error"
    _typed(KnownGoodCheck().run(ctx, KnownGoodParams()), KnownGoodEvidence)


def test_capture_and_telemetry_details_are_typed(tmp_path: Path) -> None:
    _typed(CaptureCheck().run(_ctx(tmp_path), NoParams()), CaptureEvidence)
    _typed(TelemetryCheck().run(_ctx(tmp_path), TelemetryParams(cpu_interval_s=0.05)), TelemetryEvidence)
