"""Checks that span several machines, launched by the tools clusters already use.

``adaptcheck run`` certifies one machine; what only shows between machines (the
collective library over the network, a slow or misconfigured node) needs every node to
take part at once. This package holds those multi-node checks. They run under a standard
launcher (torchrun, or any that sets torchrun's environment variables) rather than
starting processes on other hosts themselves: ssh keys, schedulers and firewalls are the
cluster's business, not adaptcheck's (docs/cluster.md).

* :mod:`.env` — what a rank learns from its launcher, and the exit codes;
* :mod:`.models` — ``collectives-multinode.json``;
* :mod:`.verdict` — the gathered per-rank outcomes → that report (pure);
* :mod:`.collectives` — one rank of ``adaptcheck cluster collectives``.
"""
