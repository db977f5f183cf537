"""Collectives through ``torch.distributed``, checked exactly and timed — the library behind step
4's ``framework.collectives``, step 5's ``perf.collectives`` and ``adaptcheck cluster
collectives``: :mod:`.exact` (the per-op arithmetic), :mod:`.plan` (params, plan, verdict),
:mod:`.launch` (one process per rank, with a deadline), :mod:`.worker` (the rank side). How
they work: docs/cluster.md ("How collectives are checked and timed").
"""
