"""Collectives through ``torch.distributed``, checked exactly and timed.

The library behind step 4's ``framework.collectives``, step 5's ``perf.collectives`` and
``adaptcheck cluster collectives``:

* :mod:`.exact` — the per-op arithmetic: inputs and the exact outputs every rank must get;
* :mod:`.plan` — the params, the plan and the verdict over every rank's records;
* :mod:`.launch` — one process per rank on this machine, with a deadline;
* :mod:`.worker` — the rank side: one op through ``torch.distributed`` (and its timing).
"""
