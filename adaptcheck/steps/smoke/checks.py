"""Step-2 check kinds (the names the ``adaptcheck.checks`` entry points point at).

The checks live in topic modules; this module gathers them under their registered names:

========================  ===========================  =====================
kind                      class                        module
========================  ===========================  =====================
smoke.device_visible      DeviceVisibleCheck           :mod:`.device`
smoke.alloc_free          AllocFreeCheck               :mod:`.memory`
smoke.roundtrip           RoundTripCheck               :mod:`.memory`
smoke.fill_zero           FillZeroCheck                :mod:`.memory`
smoke.matmul              MatmulCheck                  :mod:`.matmul`
smoke.synchronize         SynchronizeCheck             :mod:`.device`
smoke.streams_events      StreamsEventsCheck           :mod:`.device`
smoke.dtypes              DtypeProbeCheck              :mod:`.dtypes`
========================  ===========================  =====================

Every check reaches the device through :class:`~.ops.DeviceOps` (tests substitute a wrong
one to prove the numerical checks can fail) and sizes its work to the device.
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
