"""Step-2 check kinds (STUB: being written)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from adaptcheck.ladder.check import Check, CheckContext, Outcome


class AnyParams(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Stub(Check):
    step = 2
    params_model = AnyParams

    def run(self, ctx: CheckContext, params: Any) -> Outcome:
        raise NotImplementedError


class DeviceVisibleCheck(_Stub):
    kind = "smoke.device_visible"


class AllocFreeCheck(_Stub):
    kind = "smoke.alloc_free"


class RoundTripCheck(_Stub):
    kind = "smoke.roundtrip"


class FillZeroCheck(_Stub):
    kind = "smoke.fill_zero"


class MatmulCheck(_Stub):
    kind = "smoke.matmul"


class SynchronizeCheck(_Stub):
    kind = "smoke.synchronize"


class StreamsEventsCheck(_Stub):
    kind = "smoke.streams_events"


class DtypeProbeCheck(_Stub):
    kind = "smoke.dtypes"
