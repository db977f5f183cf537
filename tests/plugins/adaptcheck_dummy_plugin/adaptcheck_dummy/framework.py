"""A third-party framework adapter, registered through ``adaptcheck.frameworks``.

It is the transformers adapter under another name, declared "unavailable" unless
``ADAPTCHECK_DUMMY`` is set: enough to prove that a plugin framework is discovered, listed
with its availability reason, and used by step-4 checks by its entry-point name.
"""

from __future__ import annotations

import os

from adaptcheck.frameworks.base import Availability
from adaptcheck.frameworks.transformers_fw import TransformersFramework


class DummyFramework(TransformersFramework):
    name = "dummy_framework"
    display_name = "Dummy plugin framework (transformers underneath)"

    @classmethod
    def availability(cls) -> Availability:
        if not os.environ.get("ADAPTCHECK_DUMMY"):
            return Availability(False, "dummy framework: set ADAPTCHECK_DUMMY=1 to enable it")
        return Availability(True, version="0.0.1")
