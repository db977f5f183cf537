"""``adaptcheck cluster collectives`` across two "nodes": two torchrun launchers on loopback.

Each node is its own ``python -m torch.distributed.run --nnodes 2 --nproc-per-node 1
--node-rank R`` process (static rendezvous on 127.0.0.1, gloo on the CPU), exactly as two
machines would run it — node 0 through the documented console-script form, node 1 through
torchrun's ``-m`` form. Then the failures: a deliberately wrong all_reduce on the other node
(caught, evidence gathered to rank 0, both nodes exit 1), a node that never starts (bounded
by torchrun's rendezvous timeout), and — launched as any launcher would, with the
environment set by hand — a rank whose peers never join (exit 6), and a peer that hangs
or dies mid-run (exit 7). Sizes are small: the machine has 2 cores.

The wrong implementations are loaded by the ranks through ``--impl`` (this module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from adaptcheck.base.procs import free_port
from adaptcheck.collectives.exact import OPS
from adaptcheck.collectives.launch import loopback_interface
from adaptcheck.collectives.worker import TorchCollectives

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

REPO = Path(__file__).resolve().parents[2]
ME = "tests.cluster.test_multinode"
SMALL = ["--elements", "1,1031", "--dtypes", "fp32,int32", "--device", "cpu"]
CONSOLE_SCRIPT = Path(sys.executable).with_name("adaptcheck")


class CorruptOnLastRank(TorchCollectives):
    """all_reduce that is right everywhere except one element on the last rank (the other node)."""

    def all_reduce(self, tensor: torch.Tensor) -> None:
        super().all_reduce(tensor)
        if dist.get_rank() == dist.get_world_size() - 1 and tensor.numel() > 1:
            tensor[tensor.numel() // 2] += 1


class HangingAllGather(TorchCollectives):
    """Rank 1 never enters all_gather: rank 0 blocks inside the collective."""

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if dist.get_rank() == 1:
            time.sleep(3600)
        super().all_gather(output, input)


class DyingAllGather(TorchCollectives):
    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if dist.get_rank() == 1:
            os._exit(9)
        super().all_gather(output, input)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    lo = loopback_interface()
    if lo:
        env["GLOO_SOCKET_IFNAME"] = lo  # a container hostname may resolve to an address nothing listens on
    env.update(extra)
    return env


def torchrun_node(node_rank: int, port: int, out: Path, args: list[str], *, nnodes: int = 2,
                  rdzv_timeout_s: int = 60) -> subprocess.Popen[str]:
    """One "node": its own torchrun launcher with one rank."""
    if node_rank == 0 and CONSOLE_SCRIPT.exists():
        target = [str(CONSOLE_SCRIPT), "cluster", "collectives"]  # the form docs/cluster.md gives
    else:
        target = ["-m", "adaptcheck", "cluster", "collectives"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", "1",
           "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
           "--rdzv-conf", f"timeout={rdzv_timeout_s}", *target, "--out", str(out), *args]
    return subprocess.Popen(cmd, cwd=out.parent, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def run_nodes(tmp_path: Path, args: list[str], timeout: float = 240) -> tuple[list[int], list[str], dict[str, Any]]:
    port = free_port()
    out = tmp_path / "out"
    procs = [torchrun_node(r, port, out, args) for r in (0, 1)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    report = out / "collectives-multinode.json"
    return [p.returncode for p in procs], logs, json.loads(report.read_text()) if report.exists() else {}


def test_two_nodes_under_torchrun_agree_every_collective_is_exact(tmp_path: Path) -> None:
    codes, logs, report = run_nodes(tmp_path, [*SMALL, "--bench", "--bench-sizes-mib", "0.0625",
                                               "--bench-budget-s", "0.05"])
    assert codes == [0, 0], logs
    assert report["status"] == "pass" and report["exit_code"] == 0
    assert report["world_size"] == 2 and report["nnodes"] == 2 and report["missing_ranks"] == []
    assert [(n["node_rank"], n["ranks"]) for n in report["nodes"]] == [(0, [0]), (1, [1])]
    assert {(c["op"], c["dtype"], c["elements"]) for c in report["cases"]} == {
        (op, d, n) for op in OPS for d in ("fp32", "int32") for n in (1, 1031)}
    assert all(c["status"] == "ok" for c in report["cases"])
    assert "across 2 nodes" in report["message"]
    bench = report["bench"]
    assert [b["op"] for b in bench] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    for b in bench:
        assert b["status"] == "ok" and b["bytes"] == 65536 and set(b["rank_median_s"]) == {"0", "1"}
        assert b["time_s"] == max(b["rank_median_s"].values())
        assert b["busbw_gbps"] == pytest.approx(b["algbw_gbps"] * b["busbw_factor"])
    assert report["slowest_rank"]["rank"] in (0, 1) and report["slowest_rank"]["basis"] == "bench"
    assert "pass: " in logs[0] and "collectives-multinode.json" in logs[0]
    assert "collectives-multinode.json" not in logs[1]  # only rank 0 reports


def test_a_wrong_all_reduce_on_the_other_node_is_caught_and_both_nodes_exit_1(tmp_path: Path) -> None:
    codes, logs, report = run_nodes(tmp_path, [*SMALL, "--ops", "all_reduce,broadcast",
                                               "--impl", f"{ME}:CorruptOnLastRank"])
    assert codes == [1, 1], logs
    assert report["status"] == "fail" and report["exit_code"] == 1
    rows = {(c["op"], c["dtype"], c["elements"]): c for c in report["cases"]}
    for dtype in ("fp32", "int32"):
        wrong = rows[("all_reduce", dtype, 1031)]
        # The evidence came from the other node, through the gather: one element, index 515, on rank 1.
        assert wrong["status"] == "mismatch" and list(wrong["ranks"]) == ["1"]
        assert wrong["ranks"]["1"]["mismatches"] == 1 and wrong["ranks"]["1"]["first_index"] == 515
        assert wrong["ranks"]["1"]["got"] == wrong["ranks"]["1"]["expected"] + 1
        assert rows[("all_reduce", dtype, 1)]["status"] == "ok"
        assert rows[("broadcast", dtype, 1031)]["status"] == "ok"
    assert "rank 1 (node 1," in report["message"] and "all_reduce (fp32, 1031 elements)" in report["message"]
    for log in logs:  # every node says why, in one line, and torchrun names the rank's own code
        assert "adaptcheck: error: all_reduce (fp32, 1031 elements) wrong on rank 1 (node 1," in log
        assert "exitcode  : 1" in log


def test_a_node_that_never_starts_fails_the_other_within_the_rendezvous_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = torchrun_node(0, free_port(), tmp_path / "out", SMALL, rdzv_timeout_s=5)
    log = proc.communicate(timeout=120)[0]
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert took < 60, f"took {took:.0f} s with a 5 s rendezvous timeout"
    assert "1/2 clients joined" in log.strip().splitlines()[-1]  # torchrun's own one-line reason
    assert not (tmp_path / "out").exists()  # no rank ever started


def direct_rank(rank: int, port: int, out: Path, args: list[str], world_size: int = 2) -> subprocess.Popen[str]:
    """A rank started as a non-torchrun launcher (srun, mpirun, a script) would: env set by hand."""
    env = _env(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               GROUP_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, "-m", "adaptcheck", "cluster", "collectives", "--out", str(out), *args],
                            cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_peers_that_never_join_end_the_rank_with_exit_6_and_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = direct_rank(0, free_port(), tmp_path / "out", [*SMALL, "--join-timeout", "3"])
    _, stderr = proc.communicate(timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 6, stderr
    assert took < 60
    lines = [ln for ln in stderr.splitlines() if ln.startswith("adaptcheck: error:")]
    assert len(lines) == 1 and "joining the process group at 127.0.0.1:" in lines[0]
    assert "took longer than 3 s" in lines[0]
    report = json.loads((tmp_path / "out" / "collectives-multinode.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 6 and report["missing_ranks"] == [1]
    assert report["cases"] == []


@pytest.mark.parametrize(("impl", "rank1_code"), [("HangingAllGather", 7), ("DyingAllGather", 9)])
def test_a_peer_lost_mid_run_ends_the_other_with_exit_7_keeping_what_ran(tmp_path: Path, impl: str,
                                                                          rank1_code: int) -> None:
    port, out = free_port(), tmp_path / "out"
    started = time.monotonic()
    args = [*SMALL, "--ops", "all_reduce,all_gather", "--elements", "1031", "--timeout", "4",
            "--impl", f"{ME}:{impl}"]
    procs = [direct_rank(r, port, out, args) for r in (0, 1)]
    try:
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    took = time.monotonic() - started
    assert [p.returncode for p in procs] == [7, rank1_code], results
    assert took < 90
    error = [ln for ln in results[0][1].splitlines() if ln.startswith("adaptcheck: error:")]
    assert len(error) == 1 and "all_gather (fp32, 1031 elements)" in error[0], results[0][1]
    report = json.loads((out / "collectives-multinode.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 7
    ran = {(c["op"], c["dtype"]): c["status"] for c in report["cases"]}
    assert ran[("all_reduce", "fp32")] == "incomplete"  # rank 0's own result kept; rank 1's never came
    assert report["missing_ranks"] == [1]


def test_without_a_launcher_it_is_a_usage_error_pointing_at_torchrun(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "adaptcheck", "cluster", "collectives", "--out", str(tmp_path)],
                          env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in proc.stderr and "torchrun" in proc.stderr
