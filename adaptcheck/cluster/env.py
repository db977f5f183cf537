"""What one rank of a multi-node run learns from its launcher (torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``PORT``
…), parsed purely so a wrong or missing value is a one-line usage error before anything waits
on the network, and the ``EXIT_*`` codes of ``adaptcheck cluster collectives``. Both:
docs/cluster.md ("Collectives across nodes with torchrun", "Exit codes").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adaptcheck.base.errors import ExitCode, UsageError

EXIT_OK = 0
"""Every collective returned exact results on every rank."""
EXIT_WRONG = 1
"""Some collective returned a wrong element, raised, or (on an accelerator) is unsupported — or nothing
could be checked."""
EXIT_RENDEZVOUS = int(ExitCode.CLUSTER_RENDEZVOUS)
"""The process group never formed within ``--join-timeout``: a node never started, a wrong
MASTER_ADDR/endpoint, or a firewall between nodes. Nothing was checked."""
EXIT_PEER_LOST = int(ExitCode.CLUSTER_PEER_LOST)
"""A peer died, hung past ``--timeout`` or became unreachable after the group formed; the results so far
are in the report (a wrong result seen before that still exits 1)."""

LAUNCH_HINT = ("launch it under torchrun, e.g. 'torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 "
               "--master-addr HOST --master-port 29500 $(which adaptcheck) cluster collectives' (docs/cluster.md)")


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the job, as the launcher set it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int | None
    """``GROUP_RANK``: the node's rank (torchrun's static rendezvous: ``--node-rank``; c10d:
    order of arrival). None when the launcher does not set it (nodes are then told apart by
    hostname)."""
    nnodes: int | None
    """``GROUP_WORLD_SIZE``: how many nodes the launcher joined, when it says."""
    master_addr: str
    master_port: int
    run_id: str | None = None
    """``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``), to tell runs apart in collected reports."""
    restart_count: int = 0
    """``TORCHELASTIC_RESTART_COUNT``: above 0, torchrun restarted the workers after a failure."""

    @property
    def master(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankEnv:
        """Parse the launcher's variables; :class:`UsageError` names the first wrong one."""
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
        if missing:
            raise UsageError(f"{', '.join(missing)} not set: this command is one rank of a multi-node job",
                             hint=LAUNCH_HINT)

        def number(name: str, default: int | None = None, low: int = 0) -> int | None:
            text = environ.get(name, "")
            if not text:
                return default
            try:
                value = int(text)
            except ValueError:
                raise UsageError(f"{name}={text!r} is not an integer", hint=LAUNCH_HINT) from None
            if value < low:
                raise UsageError(f"{name}={value} must be at least {low}", hint=LAUNCH_HINT)
            return value

        rank, world = number("RANK"), number("WORLD_SIZE", low=1)
        assert rank is not None and world is not None  # both checked above
        if world < 2:
            raise UsageError(f"WORLD_SIZE={world}: collectives need at least 2 ranks",
                             hint="raise --nnodes or --nproc-per-node")
        if rank >= world:
            raise UsageError(f"RANK={rank} is not below WORLD_SIZE={world}", hint=LAUNCH_HINT)
        local_rank = number("LOCAL_RANK", 0)
        local_world = number("LOCAL_WORLD_SIZE", 1, low=1)
        assert local_rank is not None and local_world is not None  # defaults given
        if local_rank >= local_world:
            raise UsageError(f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}", hint=LAUNCH_HINT)
        port = number("MASTER_PORT", low=1)
        assert port is not None
        if port > 65535:
            raise UsageError(f"MASTER_PORT={port} is not a TCP port", hint=LAUNCH_HINT)
        return cls(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                   node_rank=number("GROUP_RANK"), nnodes=number("GROUP_WORLD_SIZE", low=1),
                   master_addr=environ["MASTER_ADDR"], master_port=port,
                   run_id=environ.get("TORCHELASTIC_RUN_ID") or None,
                   restart_count=number("TORCHELASTIC_RESTART_COUNT", 0) or 0)
