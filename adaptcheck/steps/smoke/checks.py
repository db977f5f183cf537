"""Step-2 check kinds: gathers the topic modules' checks under their registered names.

The kinds, what each proves and how: docs/smoke.md.
"""

from __future__ import annotations

from adaptcheck.steps.smoke.device import (
    DeviceVisibleCheck,
    StreamsEventsCheck,
    SynchronizeCheck,
)
from adaptcheck.steps.smoke.dtypes import DtypeProbeCheck
from adaptcheck.steps.smoke.matmul import MatmulCheck
from adaptcheck.steps.smoke.memory import AllocFreeCheck, FillZeroCheck, RoundTripCheck
from adaptcheck.steps.smoke.ops import DeviceOps, SmokeCheck

__all__ = [
    "AllocFreeCheck", "DeviceOps", "DeviceVisibleCheck", "DtypeProbeCheck", "FillZeroCheck", "MatmulCheck",
    "RoundTripCheck", "SmokeCheck", "StreamsEventsCheck", "SynchronizeCheck",
]
