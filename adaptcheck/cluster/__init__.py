"""Checks that span several machines (the collective library over the network, a slow or
misconfigured node), run under the launchers clusters already use (torchrun, or any that sets
its variables) rather than starting processes on other hosts: :mod:`.env` (what a rank learns,
exit codes), :mod:`.models` (``collectives-multinode.json``), :mod:`.verdict` (gathered
outcomes → that report), :mod:`.rank` (one rank of ``cluster collectives``). Usage:
docs/cluster.md.
"""
