"""Step-1 check kinds (STUB: being written)."""

from __future__ import annotations

from adaptcheck.ladder.check import Check, CheckContext, NoParams, Outcome


class CaptureCheck(Check):
    kind = "matrix.capture"
    step = 1

    def run(self, ctx: CheckContext, params: NoParams) -> Outcome:
        raise NotImplementedError


class RulesCheck(CaptureCheck):
    kind = "matrix.rules"


class TelemetryCheck(CaptureCheck):
    kind = "matrix.telemetry"


class KnownGoodCheck(CaptureCheck):
    kind = "matrix.known_good"
