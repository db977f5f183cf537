"""Reproducers: standalone scripts a kernel engineer runs without adaptcheck.

Every failing step-3 case and every failing step-4 comparison writes
``repro/<check id>.py`` into the run folder (:func:`repro_path`). A script needs torch
(plus numpy, which torch's CPU tensors already use, and the vendor's extension where the
device needs one) and, for step 4, the model folder: never adaptcheck nor its ladder.

* :mod:`adaptcheck.repro.bundle` copies the check's own code (input generator, float64
  reference kernel, comparison) into the script, so the numbers cannot drift from the check;
* :mod:`adaptcheck.repro.ops` writes the step-3 script;
* :mod:`adaptcheck.repro.model` writes the step-4 (teacher-forced model) script.

This package imports only the base layer; steps and the CLI call into it.
"""

from __future__ import annotations

from adaptcheck.repro.files import REPRO_DIR, repro_path, repro_relpath

__all__ = ["REPRO_DIR", "repro_path", "repro_relpath"]
