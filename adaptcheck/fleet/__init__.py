"""The fleet compatibility matrix: merge many runs' results into one table of combinations.

``merge_results`` groups runs by machine/software combination (never by host) with
recomputed grades; ``write_matrix`` renders it as HTML, JSON or YAML; ``export_known_good``
turns combinations that reached L4+ into known-good entries a site's
``$ADAPTCHECK_KNOWN_GOOD`` file feeds back to the ``matrix.known_good`` check.
"""

from __future__ import annotations

from adaptcheck.fleet.export import export_known_good
from adaptcheck.fleet.merge import merge_results
from adaptcheck.fleet.models import (
           Combination,
           FleetMatrix,
           KnownGoodExport,
           SkippedInput,
           StackKey,
)
from adaptcheck.fleet.output import output_format, write_matrix

__all__ = ["Combination", "FleetMatrix", "KnownGoodExport", "SkippedInput", "StackKey", "export_known_good",
           "merge_results", "output_format", "write_matrix"]
