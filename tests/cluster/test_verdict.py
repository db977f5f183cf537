"""The pure parts of ``cluster collectives``: the launcher's environment, the verdict and exit
code from gathered records, nccl-tests bandwidths with t = the slowest rank, the watchdog.

Every numerical rule is checked on inputs where the plausible wrong rule (fastest rank,
mean, per-rank bytes, the other op's bus factor) gives a different number.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from adaptcheck.base.errors import UsageError
from adaptcheck.base.schemas.micro_evidence import RankPayload
from adaptcheck.cluster.env import EXIT_PEER_LOST, EXIT_RENDEZVOUS, RankEnv
from adaptcheck.cluster.models import Settings
from adaptcheck.cluster.rank import Watchdog
from adaptcheck.cluster.verdict import (
    RunInfo,
    bench_results,
    build_report,
    nodes_of,
    rank_infos,
    slowest_rank,
)
from adaptcheck.collectives.plan import Plan

TORCHRUN_ENV = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "0"}


# --- the launcher's environment -------------------------------------------------------------

def test_torchrun_environment_is_read_whole() -> None:
    env = RankEnv.from_environ(TORCHRUN_ENV)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.nnodes, env.master, env.run_id) == (1, 2, "10.0.0.1:29500", "job7")


def test_a_launcher_without_node_variables_still_works() -> None:
    env = RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (env.local_rank, env.local_world_size, env.node_rank, env.nnodes) == (0, 1, None, None)


@pytest.mark.parametrize(("change", "message"), [
    ({"RANK": ""}, "RANK not set"),
    ({"MASTER_ADDR": "", "MASTER_PORT": ""}, "MASTER_ADDR, MASTER_PORT not set"),
    ({"RANK": "4"}, "RANK=4 is not below WORLD_SIZE=4"),
    ({"WORLD_SIZE": "1", "RANK": "0"}, "at least 2 ranks"),
    ({"LOCAL_RANK": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
    ({"MASTER_PORT": "70000"}, "not a TCP port"),
    ({"RANK": "-1"}, "RANK=-1 must be at least 0"),
])
def test_a_wrong_environment_is_a_usage_error_naming_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as err:
        RankEnv.from_environ({**TORCHRUN_ENV, **change})
    assert err.value.exit_code == 2


# --- gathered records → report ---------------------------------------------------------------

def _plan(ws: int = 4, ops: tuple[str, ...] = ("all_reduce", "broadcast"), on_unsupported: str = "report") -> Plan:
    return Plan(ops=list(ops), dtypes=["fp32"], elements=[8], world_size=ws, library="gloo", dist_backend="gloo",
                on_unsupported=on_unsupported)


def _payload(rank: int, records: list[dict[str, Any]], *, node: int | None = None, host: str = "",
             bench: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"rank": rank, "local_rank": rank % 2, "node_rank": rank // 2 if node is None else node,
            "hostname": host or f"host{rank // 2}", "device": "cpu", "pid": 100 + rank, "init_s": 0.1,
            "records": records, "bench": bench or []}


def _typed(payloads: list[dict[str, Any]]) -> list[RankPayload]:
    """Payloads as rank 0 reads them off the wire."""
    return [RankPayload.parse(p) for p in payloads]


def _rec(op: str, status: str = "ok", time_s: float = 0.001, **kw: Any) -> dict[str, Any]:
    return {"event": "op", "key": f"{op}/fp32/8", "op": op, "dtype": "fp32", "elements": 8, "status": status,
            "time_s": time_s, **kw}


def _report(plan: Plan, payloads: list[dict[str, Any]], failure: tuple[int, str] | None = None,
            bench: tuple[list[tuple[str, str, int]], list[tuple[str, str, int, str]]] = ([], [])) -> Any:
    info = RunInfo(started_at=datetime.now(timezone.utc), wall_s=1.5, adaptcheck_version="0", torch_version="2",
                   backend="cpu", world_size=plan.world_size, master="10.0.0.1:29500", run_id=None)
    settings = Settings(ops=plan.ops, dtypes=plan.dtypes, elements=plan.elements, bench=bool(bench[0]),
                        timeout_s=120, join_timeout_s=300)
    return build_report(info, plan, settings, payloads, bench[0], bench[1], failure=failure)


def _all_ok(ws: int = 4) -> list[dict[str, Any]]:
    return [_payload(r, [_rec("all_reduce"), _rec("broadcast")]) for r in range(ws)]


def test_every_rank_exact_on_two_nodes_passes_with_exit_0() -> None:
    report = _report(_plan(), _all_ok())
    assert (report.status, report.exit_code, report.nnodes, report.missing_ranks) == ("pass", 0, 2, [])
    assert [(n.node, n.ranks) for n in report.nodes] == [("node 0", [0, 1]), ("node 1", [2, 3])]
    assert report.message.endswith("across 2 nodes")
    assert all(c.status == "ok" for c in report.cases)


def test_one_wrong_element_on_one_remote_rank_fails_naming_its_node_and_host() -> None:
    payloads = _all_ok()
    payloads[3]["records"][0] = _rec("all_reduce", "mismatch", mismatches=1, first_index=5, got=7.0, expected=6.0)
    report = _report(_plan(), payloads)
    assert (report.status, report.exit_code) == ("fail", 1)
    case = next(c for c in report.cases if c.op == "all_reduce")
    assert case.status == "mismatch" and list(case.ranks) == [3] and case.ranks[3].first_index == 5
    assert "rank 3 (node 1, host1)" in report.message and "first at [5] = 7.0 (expected 6.0)" in report.message


def test_a_lost_peer_is_an_error_with_its_code_unless_a_wrong_result_was_already_seen() -> None:
    mine = [_payload(0, [_rec("all_reduce")])]
    lost = _report(_plan(), mine, failure=(EXIT_PEER_LOST, "rank 0 (host0): lost a peer in broadcast"))
    assert (lost.status, lost.exit_code, lost.missing_ranks) == ("error", 7, [1, 2, 3])
    assert lost.message == "rank 0 (host0): lost a peer in broadcast"
    assert [(c.op, c.status) for c in lost.cases] == [("all_reduce", "incomplete")]  # broadcast never ran: dropped
    seen = [_payload(0, [_rec("all_reduce", "mismatch", mismatches=8, first_index=0, got=1.0, expected=4.0)])]
    wrong = _report(_plan(), seen, failure=(EXIT_PEER_LOST, "lost a peer"))
    assert (wrong.status, wrong.exit_code) == ("fail", 1)
    assert "then lost a peer" in wrong.message
    never = _report(_plan(), [_payload(0, [])], failure=(EXIT_RENDEZVOUS, "group never formed"))
    assert (never.exit_code, never.cases) == (6, [])


def test_a_case_missing_although_every_rank_reported_is_an_internal_error() -> None:
    payloads = _all_ok()
    payloads[2]["records"].pop()
    report = _report(_plan(), payloads)
    assert (report.status, report.exit_code) == ("error", 70)


def test_unsupported_ops_follow_the_step_4_policy() -> None:
    def with_bcast(status: str) -> list[dict[str, Any]]:
        return [_payload(r, [_rec("all_reduce"), _rec("broadcast", status, error="not supported")]) for r in range(4)]

    assert _report(_plan(on_unsupported="report"), with_bcast("unsupported")).exit_code == 0
    assert _report(_plan(on_unsupported="fail"), with_bcast("unsupported")).exit_code == 1
    assert _report(_plan(on_unsupported="report"), with_bcast("raised")).exit_code == 1
    nothing = [_payload(r, [_rec("all_reduce", "unsupported", error="not supported")]) for r in range(4)]
    skipped = _report(_plan(ops=("all_reduce",)), nothing)
    assert (skipped.status, skipped.exit_code) == ("skip", 1)  # nothing verified is never a 0


def test_nodes_are_told_apart_by_node_rank_else_by_hostname() -> None:
    same_host = rank_infos(_typed([_payload(0, [], node=0, host="vm"), _payload(1, [], node=1, host="vm")]))
    assert [n.node for n in nodes_of(same_host)] == ["node 0", "node 1"]  # two launchers on one machine
    no_rank = [{**_payload(r, [], host=h), "node_rank": None} for r, h in enumerate(["b", "a", "b"])]
    nodes = nodes_of(rank_infos(_typed(no_rank)))
    assert [(n.node, n.ranks) for n in nodes] == [("a", [1]), ("b", [0, 2])]


# --- bandwidth: nccl-tests definitions, t = the slowest rank's median ----------------------------

MEDIANS = {0: 3e-3, 1: 5e-3, 2: 8e-3, 3: 4e-3}


def _bench_payloads(op: str, n: int) -> list[dict[str, Any]]:
    # Median m, mean well above it and a minimum well below, so mean- or min-based rules differ.
    return [_payload(r, [], bench=[{"event": "bench", "key": f"{op}/bf16/{n}", "status": "ok",
                                    "samples": [m / 4, m, m, m * 9, m * 1.01], "inner": 1}])
            for r, m in MEDIANS.items()]


@pytest.mark.parametrize(("op", "factor", "chunks"), [("all_reduce", 1.5, 1), ("all_gather", 0.75, 4),
                                                      ("reduce_scatter", 0.75, 4), ("all_to_all", 0.75, 4),
                                                      ("broadcast", 1.0, 1)])
def test_bandwidth_is_full_tensor_over_the_slowest_median_times_the_bus_factor(op: str, factor: float,
                                                                                chunks: int) -> None:
    n = 1000
    (row,) = bench_results([(op, "bf16", n)], [], _typed(_bench_payloads(op, n)), 4)
    size = n * 2 * chunks  # bf16; S is the full tensor, not one rank's chunk
    assert row.status == "ok" and row.bytes == size and row.slowest_rank == 2
    assert row.time_s == pytest.approx(8e-3)
    assert row.algbw_gbps == pytest.approx(size / 8e-3 / 1e9)
    assert row.busbw_gbps == pytest.approx(size / 8e-3 / 1e9 * factor)
    assert row.rank_median_s == pytest.approx(MEDIANS)
    # The plausible wrong rules give other numbers on these inputs (where they differ at all).
    mean_slowest = sum([8e-3 / 4, 8e-3, 8e-3, 8e-3 * 9, 8e-3 * 1.01]) / 5
    wrong_busbw = {"fastest rank's median": size / 3e-3 * factor, "slowest rank's mean": size / mean_slowest * factor,
                   "slowest rank's best sample": size / (8e-3 / 4) * factor}
    if chunks > 1:
        wrong_busbw["one rank's chunk as S"] = n * 2 / 8e-3 * factor
    if factor != 1:
        wrong_busbw["algbw as busbw"] = size / 8e-3
    for rule, busbw in wrong_busbw.items():
        assert row.busbw_gbps is not None and abs(row.busbw_gbps - busbw / 1e9) > 0.01 * row.busbw_gbps, rule


def test_bandwidth_rows_without_a_figure_say_why() -> None:
    payloads = _bench_payloads("all_reduce", 10)
    payloads[1]["bench"][0] = {"event": "bench", "key": "all_reduce/bf16/10", "status": "raised", "error": "boom"}
    rows = bench_results([("all_reduce", "bf16", 10), ("all_gather", "bf16", 10)], [("all_to_all", "fp16", 5, "no fp16")],
                         _typed(payloads), 4)
    assert [(r.status, r.error) for r in rows] == [("raised", "boom"), ("incomplete", "ranks [0, 1, 2, 3] never reported it"),
                                                   ("skipped", "no fp16")]
    assert all(r.busbw_gbps is None for r in rows)


def test_the_slowest_rank_is_the_one_with_the_largest_total() -> None:
    payloads = _typed(_bench_payloads("all_reduce", 10))
    rows = bench_results([("all_reduce", "bf16", 10)], [], payloads, 4)
    slow = slowest_rank(rows, payloads, rank_infos(payloads))
    assert slow is not None and (slow.rank, slow.node, slow.basis) == (2, "node 1", "bench")
    assert slow.ratio == pytest.approx(8 / 3)
    checks = _typed([_payload(r, [_rec("all_reduce", time_s=t)]) for r, t in enumerate([0.1, 0.5])])
    by_check = slowest_rank([], checks, rank_infos(checks))
    assert by_check is not None and (by_check.rank, by_check.basis, by_check.ratio) == (1, "check", pytest.approx(5.0))
    assert slowest_rank([], checks[:1], rank_infos(checks[:1])) is None


# --- the watchdog -------------------------------------------------------------------------

def test_the_watchdog_ends_a_phase_that_outlives_its_limit_and_only_that() -> None:
    expired: list[tuple[str, int]] = []
    exited: list[int] = []
    done = threading.Event()

    def fake_exit(code: int) -> None:
        exited.append(code)
        done.set()

    dog = Watchdog(lambda reason, code: expired.append((reason, code)), poll_s=0.01, exit=fake_exit)
    dog.enter("quick", 0.5, 7)
    for _ in range(5):  # phases that end in time never fire
        time.sleep(0.05)
        dog.enter("quick", 0.5, 7)
    assert not expired
    dog.enter("all_gather (fp32, 8 elements)", 0.05, 7)
    assert done.wait(5)
    assert expired == [("all_gather (fp32, 8 elements) took longer than 0.05 s", 7)] and exited == [7]

    quiet_exit: list[int] = []
    quiet = Watchdog(lambda reason, code: expired.append((reason, code)), poll_s=0.01, exit=quiet_exit.append)
    quiet.enter("leaving", 0.02, 6, report=False)
    time.sleep(0.3)
    assert quiet_exit == [6] and len(expired) == 1  # the verdict was already out: no second report
