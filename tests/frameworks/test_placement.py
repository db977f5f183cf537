"""Where a CPU vLLM server runs: the plan on recorded-shape topologies, and a real server placed as planned.

The topologies are sysfs trees laid out like Linux's (``cpuN/topology/core_id``,
``physical_package_id``, ``cpuN/nodeM``); the real server is the session's ``vllm serve``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from adaptcheck.frameworks.placement import BIND_VAR, SERVER_CPUS_VAR, pin_self_from_env, plan_cpu_placement
from adaptcheck.frameworks.server import ManagedServer


def fake_sysfs(root: Path, cores: dict[int, tuple[int, int, int]]) -> Path:
    """cpu → (package, core, numa node)."""
    for cpu, (pkg, core, node) in cores.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")
        (root / f"cpu{cpu}" / f"node{node}").mkdir()
    return root


def test_two_cores_worker_on_the_first_front_end_on_the_last(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {0: (0, 0, 0), 1: (0, 1, 0)})
    plan = plan_cpu_placement([0, 1], {}, sysfs=sysfs)
    assert plan.applied
    assert (plan.worker_cpus, plan.frontend_cpus) == ((0,), (1,))
    assert plan.env() == {BIND_VAR: "0", SERVER_CPUS_VAR: "1"}
    assert "CPU 0" in plan.describe() and "CPU 1" in plan.describe()


def test_smt_siblings_go_with_their_core(tmp_path: Path) -> None:
    # 4 cores × 2 threads, Linux numbering: cpu N and N+4 are siblings.
    sysfs = fake_sysfs(tmp_path, {c: (0, c % 4, 0) for c in range(8)})
    plan = plan_cpu_placement(range(8), {}, sysfs=sysfs)
    assert plan.worker_cpus == (0, 1, 2)  # one thread per core, as vLLM's auto-binding does
    assert plan.frontend_cpus == (3, 7)


def test_affinity_mask_is_respected(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {c: (0, c, 0) for c in range(8)})
    plan = plan_cpu_placement([2, 5, 6], {}, sysfs=sysfs)
    assert (plan.worker_cpus, plan.frontend_cpus) == ((2, 5), (6,))


@pytest.mark.parametrize(("usable", "env", "why"), [
    ([0], {}, "1 physical core"),
    ([0, 4], {}, "1 physical core"),  # two SMT siblings of one core
    ([0, 1], {BIND_VAR: "0-1"}, "set by the user"),
    ([0, 1], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "runs the model in its own process"),
    ([0, 1, 2, 3], {}, "NUMA nodes [0, 1]"),
])
def test_left_to_vllm_with_the_reason(tmp_path: Path, usable: list[int], env: dict[str, str], why: str) -> None:
    sysfs = fake_sysfs(tmp_path, {0: (0, 0, 0), 1: (0, 1, 0), 2: (1, 0, 1), 3: (1, 1, 1), 4: (0, 0, 0)})
    plan = plan_cpu_placement(usable, env, sysfs=sysfs)
    assert not plan.applied and plan.env() == {}
    assert why in plan.reason and plan.describe().startswith("left to vLLM")


def test_pin_reads_and_removes_the_variable() -> None:
    before = os.sched_getaffinity(0)
    mine = min(before)
    env = {SERVER_CPUS_VAR: str(mine), "OTHER": "x"}
    try:
        pin_self_from_env(env)
        assert os.sched_getaffinity(0) == {mine}
        assert env == {"OTHER": "x"}
        pin_self_from_env({SERVER_CPUS_VAR: "not,cpus"})  # garbage: left as it is, no exception
        assert os.sched_getaffinity(0) == {mine}
    finally:
        os.sched_setaffinity(0, before)


def _allowed(pid: int) -> str:
    return re.search(r"Cpus_allowed_list:\s*(\S+)", Path(f"/proc/{pid}/status").read_text()).group(1)  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs two cores")
def test_real_vllm_server_is_placed_as_planned(vllm_server: ManagedServer) -> None:
    plan = vllm_server.placement
    assert plan is not None
    if not plan.applied:
        pytest.skip(f"not placed here: {plan.reason}")
    front = ",".join(map(str, plan.frontend_cpus))
    assert vllm_server.pid is not None
    assert _allowed(vllm_server.pid) == front  # the API server
    log = vllm_server.log_path.read_text(errors="replace")
    # vLLM's own binding report: the worker's OpenMP threads on the planned cores.
    assert f"core ids={list(plan.worker_cpus)}" in log
    assert f"{BIND_VAR}='{','.join(map(str, plan.worker_cpus))}'" in log
