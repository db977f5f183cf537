"""Where a CPU-served vLLM's processes run: compute cores for the worker, a front-end core for the rest.

vLLM on CPU binds its worker's OpenMP threads to cores and "reserves" a core for the
scheduler, but leaves the API server and the EngineCore process (and the load generator
that measures them) free to float. On a small host the kernel then often wakes them on the
worker's busy core, where they wait behind its compute: measured on the 2-core development
machine (tiny Llama, bf16, 16 requests of 128 → 64 tokens at concurrency 1, 12 runs), the
run medians of TPOT were bimodal (1.58–2.55 ms, run-to-run CV 12 %), and in three standard
ladders every one failed some scenario's stability bound on that noise. With the worker
alone on core 0 and the API server + EngineCore pinned to core 1, the same runs gave TPOT
1.27–1.42 ms (CV 4 %) and TTFT CV 8 %: the same compute, placed deterministically.

So, unless the user placed vLLM themselves (``VLLM_CPU_OMP_THREADS_BIND`` set), a CPU vLLM
server is started with

- ``VLLM_CPU_OMP_THREADS_BIND`` = one logical CPU per physical core of the usable CPUs,
  the front-end core excepted (what vLLM's own auto-binding chooses on one NUMA node);
- the server process (and so the API server and EngineCore, which inherit it) pinned to the
  front-end core: the last physical core, with its SMT siblings.

Nothing is placed when it cannot help or would change vLLM's own choice: fewer than two
physical cores, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in the server's environment (no
separate worker: the model would run on the front-end core), or usable CPUs on more than one NUMA node (vLLM binds rank 0 to node 0
there; overriding that is the user's call). The plan always says why, and is recorded with
the server's facts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaptcheck.hostfacts import core_key, numa_node_of, one_cpu_per_core

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
SERVER_CPUS_VAR = "ADAPTCHECK_SERVER_CPUS"
"""Read by the server's reaper (never by the server): the CPUs the server process is pinned to."""


@dataclass(frozen=True)
class Placement:
    """Where a CPU vLLM server's processes run, or why adaptcheck left that to vLLM."""

    applied: bool
    worker_cpus: tuple[int, ...] = ()
    """Logical CPUs of the worker's OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``)."""
    frontend_cpus: tuple[int, ...] = ()
    """Logical CPUs the API server and EngineCore are pinned to."""
    reason: str = ""

    def env(self) -> dict[str, str]:
        """Variables for the server's (reaper's) environment."""
        if not self.applied:
            return {}
        return {BIND_VAR: ",".join(map(str, self.worker_cpus)),
                SERVER_CPUS_VAR: ",".join(map(str, self.frontend_cpus))}

    def describe(self) -> str:
        """One line for the server's facts and the report."""
        if not self.applied:
            return f"left to vLLM: {self.reason}"
        return (f"worker threads on CPU {','.join(map(str, self.worker_cpus))}; API server and EngineCore on "
                f"CPU {','.join(map(str, self.frontend_cpus))} ({BIND_VAR} and affinity set by adaptcheck)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_cpu_placement(usable: Sequence[int], env: Mapping[str, str], *,
                       sysfs: Path = Path("/sys/devices/system/cpu")) -> Placement:
    """The placement for a CPU vLLM server on ``usable`` logical CPUs (see module doc)."""
    if env.get(BIND_VAR):
        return Placement(False, reason=f"{BIND_VAR}={env[BIND_VAR]} set by the user: vLLM places its threads as told")
    if env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        # The model then runs inside the EngineCore, which pinning would put on the front-end core.
        return Placement(False, reason="VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine runs the model in its own "
                                       "process, left to vLLM")
    cpus = sorted(set(usable))
    nodes = {numa_node_of(c, sysfs) for c in cpus}
    if len(nodes - {None}) > 1:
        return Placement(False, reason=f"usable CPUs span NUMA nodes {sorted(n for n in nodes if n is not None)}: "
                                       "left to vLLM's auto-binding")
    cores = one_cpu_per_core(cpus, sysfs)
    if len(cores) < 2:
        return Placement(False, reason=f"{len(cores)} physical core usable: nothing to keep apart")
    # The front-end core goes with its SMT siblings: they share its execution units.
    front_key = core_key(cores[-1], sysfs)
    frontend = tuple(c for c in cpus if core_key(c, sysfs) == front_key)
    worker = tuple(c for c in cores if c not in frontend)
    return Placement(True, worker_cpus=worker, frontend_cpus=frontend,
                     reason=f"worker on {len(worker)} core(s), API server and EngineCore on CPU(s) "
                            f"{','.join(map(str, frontend))}")


def usable_cpus() -> list[int]:
    """Logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def pin_self_from_env(env: MutableMapping[str, str]) -> None:
    """In the reaper: pin this process (and so the server it starts) as the plan said; the
    variable is removed so that it does not leak further. A failure leaves it unpinned."""
    value = env.pop(SERVER_CPUS_VAR, None)
    if not value or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(0, {int(c) for c in value.split(",")})
    except (OSError, ValueError):
        pass
