"""``framework.collectives``: the exact per-op arithmetic, the verdict, and real 2-rank gloo runs.

Layers, cheapest first:

* pure arithmetic — simulated collectives (summed in the target dtype, in several orders)
  must reproduce :func:`expected_output` exactly, and every deliberately wrong simulation
  (dropped rank, swapped chunks, wrong source …) must be caught by :func:`compare`;
* the verdict — :func:`summarize` on fabricated rank records;
* real runs — 2 gloo ranks on loopback through ``torch.distributed``, with the correct
  implementation, deliberately wrong ones, one that hangs, ones that crash, and one whose
  launcher is SIGKILLed; no rank may be left behind;
* the CLI end to end.

The wrong implementations below are loaded *by the rank processes* through the check's
``impl`` param (``tests.steps.frameworks.test_collectives:Name``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.base.plugins import import_root
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.micro_evidence import RankRecord
from adaptcheck.base.schemas.results import Status
from adaptcheck.collectives.exact import (
    OPS,
    broadcast_source,
    buffer_sizes,
    build_input,
    classify_exception,
    compare,
    expected_output,
    value_scale,
)
from adaptcheck.collectives.launch import (
    LaunchResult,
    RankExit,
    last_line,
    stuck_frame,
)
from adaptcheck.collectives.plan import (
    CollectivesParams,
    Plan,
    make_plan,
    resolve_world_size,
    summarize,
)
from adaptcheck.collectives.worker import TorchCollectives
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.ladder.registry import get_check_class
from adaptcheck.steps.frameworks.collectives import CollectivesCheck
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

REPO = Path(__file__).resolve().parents[3]
ME = "tests.steps.frameworks.test_collectives"
DTYPES = ["fp32", "bf16", "fp16", "int8", "int32", "int64"]


# --- deliberately wrong implementations (run inside the rank processes) --------------------

class DropLastRankAllReduce(TorchCollectives):
    """all_reduce that loses the last rank's contribution."""

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if dist.get_rank() == dist.get_world_size() - 1:
            tensor.zero_()
        super().all_reduce(tensor)


class OneDefectPerOp(DropLastRankAllReduce):
    """A different realistic defect in each of the five ops."""

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        super().all_gather(output, input)
        n = input.numel()
        first, second = output[:n].clone(), output[n:2 * n].clone()
        output[:n], output[n:2 * n] = second, first  # rank 0's and rank 1's chunks swapped

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> None:
        full = input.clone()
        dist.all_reduce(full)
        n, nxt = output.numel(), (dist.get_rank() + 1) % dist.get_world_size()
        output.copy_(full[nxt * n:(nxt + 1) * n])  # the neighbour's chunk of the sum

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None:
        output.copy_(input)  # no exchange at all: every rank keeps its own chunks

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        dist.broadcast(tensor, src=0)  # ignores the root it was given


class HangingAllToAll(TorchCollectives):
    """Rank 1 never enters all_to_all: its peer blocks inside the collective."""

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if dist.get_rank() == 1:
            time.sleep(3600)
        super().all_to_all(output, input)


class ExitingAllGather(TorchCollectives):
    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if dist.get_rank() == 1:
            os._exit(7)
        super().all_gather(output, input)


class SegfaultingAllGather(TorchCollectives):
    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if dist.get_rank() == 1:
            ctypes.string_at(0)  # reads address 0: SIGSEGV, as a broken native library would
        super().all_gather(output, input)


class NoReduceScatter(TorchCollectives):
    """A library without reduce_scatter (as gloo was in older torch)."""

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> None:
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")


class BrokenBroadcast(TorchCollectives):
    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        raise RuntimeError("NCCL error in: broadcast, unhandled cuda error")


class TwoDeviceCpu(CpuBackend):
    """A CPU that calls itself an accelerator with 2 devices (the accelerator code path)."""

    name = "twodevcpu"
    is_accelerator = True


# --- helpers ----------------------------------------------------------------------------

def make_ctx(tmp_path: Path, backend: Any = None, device_count: int = 1) -> CheckContext:
    return CheckContext(backend=backend or CpuBackend(), device_index=0, seed=0, run_dir=tmp_path,
                        model=ModelSpec(), device_count=device_count)


def run_check(tmp_path: Path, backend: Any = None, device_count: int = 1, **params: Any) -> Outcome:
    params.setdefault("elements", [1, 1031])
    params.setdefault("dtypes", ["fp32", "int32"])
    got = CollectivesCheck().run(make_ctx(tmp_path, backend, device_count), CollectivesParams(**params))
    assert isinstance(got, Outcome)
    return got


def rows_by(outcome: Outcome) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(r["op"], r["dtype"], r["elements"]): r for r in outcome.details["table"]}


def live_processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (the rank's config names its logs folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def assert_no_rank_left(outcome: Outcome) -> None:
    pids = [r["pid"] for r in outcome.details["ranks"] if r["pid"]]
    assert pids, "the ranks never reported their pids"
    assert live_processes_mentioning(outcome.details["logs_dir"]) == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "collectives.worker" not in Path(
            f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


# --- pure arithmetic --------------------------------------------------------------------

def _seq_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = acc + x
    return acc


def _tree_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    while len(xs) > 1:
        xs = [xs[i] + xs[i + 1] if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


SUM_ORDERS: dict[str, Callable[[list[torch.Tensor]], torch.Tensor]] = {
    # How a library may reduce: a ring accumulates in one order, a tree pairwise. Summed in
    # the target dtype, every order must land on the exact expectation.
    "forward": _seq_sum,
    "reverse": lambda xs: _seq_sum(xs[::-1]),
    "tree": _tree_sum,
}


def simulate(op: str, ws: int, n: int, dtype: str, order: str = "forward", defect: str | None = None,
             compute: torch.dtype | None = None) -> list[torch.Tensor]:
    """Each rank's output of ``op`` by its textbook definition, from the inputs
    :func:`build_input` gives every rank, computed in ``dtype`` (or ``compute``) — optionally
    with a defect."""
    inputs = [build_input(op, ws, r, n, dtype).to(compute or torch_dtype(dtype)) for r in range(ws)]
    total = SUM_ORDERS[order]

    def chunk(x: torch.Tensor, i: int) -> torch.Tensor:
        return x[i * n:(i + 1) * n]

    outs: list[torch.Tensor] = []
    for r in range(ws):
        if op == "all_reduce":
            contrib = list(inputs)
            if defect == "drop_last":
                contrib = contrib[:-1]
            elif defect == "double_first":
                contrib = [contrib[0], contrib[0], *contrib[2:]]
            out = torch.stack(contrib).amax(0) if defect == "max" else total(contrib)
        elif op == "broadcast":
            src = 0 if defect == "src0" else broadcast_source(ws)
            out = inputs[r].clone() if defect == "unwritten" and r != broadcast_source(ws) else inputs[src].clone()
        elif op == "all_gather":
            parts = [x.clone() for x in inputs]
            if defect == "swap01":
                parts[0], parts[1] = parts[1], parts[0]
            if defect == "own_unwritten":
                parts[r] = torch.full_like(parts[r], -1)
            out = torch.cat(parts)
        elif op == "reduce_scatter":
            idx = (r + 1) % ws if defect == "neighbour" else r
            contrib = inputs[:-1] if defect == "drop_last" else inputs
            out = total([chunk(x, idx) for x in contrib])
        else:
            if defect == "identity":
                out = inputs[r].clone()
            else:
                srcs = list(range(ws))[::-1] if defect == "reversed" else list(range(ws))
                out = torch.cat([chunk(inputs[s], r) for s in srcs])
        outs.append(out)
    return outs


@pytest.mark.parametrize("ws", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_expected_output_matches_the_textbook_op_in_every_summation_order(op: str, dtype: str, ws: int) -> None:
    n = 37
    exact = simulate(op, ws, n, dtype, compute=torch.int64)  # the same inputs, summed without rounding
    for order in SUM_ORDERS:
        for rank, got in enumerate(simulate(op, ws, n, dtype, order)):
            assert got.dtype == torch_dtype(dtype)
            exp = expected_output(op, ws, rank, n, dtype)
            assert compare(got, exp)["mismatches"] == 0, (order, rank)
            assert torch.equal(exp.to(torch.int64), exact[rank]), "the expectation was rounded"
    limit = {"fp32": 2**24, "bf16": 2**8, "fp16": 2**11, "int8": 127}.get(dtype)
    if limit:
        assert max(int(x.max()) for x in exact) <= limit


@pytest.mark.parametrize("ws", [2, 3, 8])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int32"])
@pytest.mark.parametrize(("op", "defect"), [
    ("all_reduce", "drop_last"), ("all_reduce", "double_first"), ("all_reduce", "max"),
    ("broadcast", "src0"), ("broadcast", "unwritten"),
    ("all_gather", "swap01"), ("all_gather", "own_unwritten"),
    ("reduce_scatter", "neighbour"), ("reduce_scatter", "drop_last"),
    ("all_to_all", "identity"), ("all_to_all", "reversed"),
])
def test_every_wrong_collective_is_caught(op: str, defect: str, dtype: str, ws: int) -> None:
    n = 1031
    caught = [compare(got, expected_output(op, ws, r, n, dtype)) for r, got in
              enumerate(simulate(op, ws, n, dtype, defect=defect))]
    assert any(c["mismatches"] > 0 for c in caught), f"{op}/{defect} on {ws} ranks in {dtype} went unnoticed"


def test_inputs_are_positive_distinct_per_rank_and_outputs_start_as_sentinel() -> None:
    from adaptcheck.collectives.exact import output_buffer

    a, b = build_input("all_gather", 4, 0, 1000, "fp32"), build_input("all_gather", 4, 1, 1000, "fp32")
    assert int(a.min()) >= 1 and int(b.min()) >= 1
    assert set(a.tolist()).isdisjoint(b.tolist())  # any swap between ranks changes values
    assert len(set(a.tolist())) == 1000  # any shift within a chunk changes values
    assert torch.equal(output_buffer("all_gather", 4, 3, "int32"), torch.full((12,), -1, dtype=torch.int32))


def test_buffer_sizes_and_value_scale() -> None:
    assert buffer_sizes("all_reduce", 4, 10) == (10, 10)
    assert buffer_sizes("broadcast", 4, 10) == (10, 10)
    assert buffer_sizes("all_gather", 4, 10) == (10, 40)
    assert buffer_sizes("reduce_scatter", 4, 10) == (40, 10)
    assert buffer_sizes("all_to_all", 4, 10) == (40, 40)
    with pytest.raises(ValueError, match="valid: all_reduce"):
        buffer_sizes("gather", 2, 1)
    assert value_scale("fp32", 2) == (2**24) // 3
    assert value_scale("bf16", 8) == 256 // 36
    assert value_scale("bf16", 22) >= 1 and value_scale("bf16", 23) == 0  # 23*24/2 = 276 > 256
    assert broadcast_source(2) == 1


def test_compare_reports_count_first_index_and_values() -> None:
    exp = torch.arange(10, dtype=torch.float32)
    got = exp.clone()
    got[3], got[7] = 99, float("nan")
    assert compare(got, exp) == {"mismatches": 2, "first_index": 3, "got": 99.0, "expected": 3.0}
    assert compare(exp.clone(), exp)["mismatches"] == 0
    assert compare(exp[:5], exp)["mismatches"] == 10  # wrong size is wrong everywhere
    assert compare(exp.to(torch.int32), exp)["mismatches"] == 10  # so is the wrong dtype


def test_classify_exception() -> None:
    assert classify_exception(NotImplementedError("x")) == "unsupported"
    assert classify_exception(RuntimeError("ProcessGroupGloo does not support reduce_scatter")) == "unsupported"
    assert classify_exception(RuntimeError("Unsupported dtype Byte for all_to_all")) == "unsupported"
    assert classify_exception(RuntimeError("NCCL error: unhandled cuda error")) == "raised"
    assert classify_exception(RuntimeError("Connection closed by peer")) == "raised"


# --- params and planning ----------------------------------------------------------------

def test_kind_is_registered_as_step_4_with_strict_params() -> None:
    cls = get_check_class("framework.collectives")
    assert cls is CollectivesCheck and cls.step == 4
    assert cls.params_model.model_config.get("extra") == "forbid"
    for name, f in CollectivesParams.model_fields.items():
        assert f.description, name
    assert CollectivesParams().ops == list(OPS)


def test_params_refuse_unknown_ops_naming_the_valid_ones() -> None:
    with pytest.raises(ValidationError, match=r"unknown collective.*'all_gatter'.*valid: all_reduce, all_gather"):
        CollectivesParams(ops=["all_gatter"])
    with pytest.raises(ValidationError, match="extra"):
        CollectivesParams.model_validate({"opz": []})
    with pytest.raises(ValidationError):
        CollectivesParams(dtypes=["fp64"])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        CollectivesParams(world_size=1)
    with pytest.raises(ValidationError):
        CollectivesParams(impl="not a ref")
    with pytest.raises(ValidationError):
        CollectivesParams(elements=[0])


def test_world_size_follows_the_devices_and_one_device_is_not_applicable(tmp_path: Path) -> None:
    cpu, accel = CpuBackend(), TwoDeviceCpu()
    assert resolve_world_size(cpu, 1, None) == (2, "")
    assert resolve_world_size(cpu, 1, 4) == (4, "")
    assert resolve_world_size(accel, 8, None) == (8, "")
    assert resolve_world_size(accel, 8, 4) == (4, "")
    single = run_check(tmp_path, accel, device_count=1)
    assert single.status == Status.SKIP and single.applicable is False
    assert "more than one device" in single.message
    too_many = run_check(tmp_path, accel, device_count=2, world_size=4)
    assert too_many.status == Status.SKIP and too_many.applicable is True  # a ladder asking too much is not "n/a"
    assert "4" in too_many.message and "2 visible" in too_many.message


def test_plan_keeps_only_dtypes_checkable_exactly() -> None:
    class NoBf16(CpuBackend):
        dtypes = ("fp32",)  # type: ignore[assignment]

    params = CollectivesParams(dtypes=["fp32", "bf16", "int32"])
    assert make_plan(CpuBackend(), params, 2).dtypes == ["fp32", "bf16", "int32"]
    plan = make_plan(NoBf16(), params, 2)
    assert plan.dtypes == ["fp32", "int32"] and "bf16" in plan.skipped_dtypes
    plan = make_plan(CpuBackend(), params, 32)
    assert plan.dtypes == ["fp32", "int32"] and "exact 32-rank sum" in plan.skipped_dtypes["bf16"]
    assert make_plan(CpuBackend(), params, 2).on_unsupported == "report"
    assert make_plan(TwoDeviceCpu(), params, 2).on_unsupported == "fail"
    assert make_plan(TwoDeviceCpu(), CollectivesParams(on_unsupported="report"), 2).on_unsupported == "report"


# --- the verdict on fabricated records --------------------------------------------------

def _plan(**kw: Any) -> Plan:
    base: dict[str, Any] = {"ops": ["all_reduce", "broadcast"], "dtypes": ["fp32"], "elements": [4], "world_size": 2,
                            "library": "gloo", "dist_backend": "gloo", "on_unsupported": "report"}
    base.update(kw)
    return Plan(**base)


def _records(plan: Plan, override: dict[tuple[int, str], dict[str, Any]] | None = None,
             stop: dict[int, str] | None = None) -> dict[int, list[dict[str, Any]]]:
    """Records as ranks write them; ``stop[rank] = op`` ends that rank's records inside ``op``."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r in range(plan.world_size):
        recs: list[dict[str, Any]] = [{"event": "start", "pid": 1000 + r, "device": "cpu"},
                                      {"event": "ready", "init_s": 0.1}]
        for op in plan.ops:
            key = f"{op}/fp32/4"
            recs.append({"event": "begin", "key": key, "op": op, "dtype": "fp32", "elements": 4})
            if (stop or {}).get(r) == op:
                break
            rec = {"event": "op", "key": key, "op": op, "dtype": "fp32", "elements": 4, "status": "ok",
                   "time_s": 0.01, "mismatches": 0}
            rec.update((override or {}).get((r, op), {}))
            recs.append(rec)
        else:
            recs.append({"event": "done"})
        out[r] = recs
    return out


def _launched(records: dict[int, list[dict[str, Any]]], exits: list[RankExit] | None = None) -> LaunchResult:
    return LaunchResult(records={r: [RankRecord.parse(rec) for rec in recs] for r, recs in records.items()},
                        exits=exits or [RankExit(r, 0) for r in records], wall_s=1.0,
                        logs_dir="/nonexistent")


def test_summarize_pass_has_metrics_and_table() -> None:
    plan = _plan()
    out = summarize(plan, _launched(_records(plan)))
    assert out.status == Status.PASS
    assert out.metrics["world_size"] == 2 and out.metrics["library"] == "gloo"
    assert out.metrics["all_reduce_s"] == pytest.approx(0.01) and out.metrics["rows_ok"] == 2
    assert [r["status"] for r in out.details["table"]] == ["ok", "ok"]


def test_summarize_mismatch_fails_naming_op_rank_and_first_index() -> None:
    plan = _plan()
    bad = {"status": "mismatch", "mismatches": 3, "first_index": 2, "got": 5.0, "expected": 7.0}
    out = summarize(plan, _launched(_records(plan, {(1, "broadcast"): bad})))
    assert out.status == Status.FAIL
    assert "broadcast (fp32, 4 elements) wrong on rank 1" in out.message
    assert "first at [2] = 5.0 (expected 7.0)" in out.message


def test_summarize_unsupported_is_reported_or_failed_by_policy() -> None:
    plan = _plan()
    uns = {"status": "unsupported", "error": "NotImplementedError: no"}
    recs = _records(plan, {(0, "broadcast"): uns, (1, "broadcast"): uns})
    reported = summarize(plan, _launched(recs))
    assert reported.status == Status.PASS and "not supported by gloo (reported, not failed): broadcast/fp32" in \
        reported.message
    assert reported.message.startswith("all_reduce exact")  # the pass names only what ran
    failed = summarize(_plan(on_unsupported="fail"), _launched(recs))
    assert failed.status == Status.FAIL and "not supported by gloo: broadcast/fp32" in failed.message
    # Nothing ran at all: never a pass.
    only = _plan(ops=["broadcast"])
    none_ran = summarize(only, _launched(_records(only, {(0, "broadcast"): uns, (1, "broadcast"): uns})))
    assert none_ran.status == Status.SKIP


def test_summarize_a_crash_is_an_error_naming_rank_op_and_reason_first() -> None:
    plan = _plan()
    recs = _records(plan, {(0, "broadcast"): {"status": "raised", "error": "RuntimeError: Connection closed by peer"}},
                    stop={1: "broadcast"})
    exits = [RankExit(0, 1, last_line="RuntimeError: Connection closed by peer", ended_s=2.0),
             RankExit(1, -11, last_line="Fatal Python error: Segmentation fault", ended_s=1.5)]
    out = summarize(plan, _launched(recs, exits))
    assert out.status == Status.ERROR  # the peer's "connection closed" is a consequence, not a finding
    assert out.message.startswith("rank 1 killed by SIGSEGV in broadcast (fp32, 4 elements); last line: Fatal "
                                  "Python error: Segmentation fault")
    row = rows_by(out)[("broadcast", "fp32", 4)]
    assert row["status"] == "incomplete" and row["missing_ranks"] == [1]


def test_summarize_a_wrong_result_before_a_crash_still_fails() -> None:
    plan = _plan()
    bad = {"status": "mismatch", "mismatches": 1, "first_index": 0, "got": 1.0, "expected": 3.0}
    recs = _records(plan, {(0, "all_reduce"): bad}, stop={0: "broadcast", 1: "broadcast"})
    exits = [RankExit(0, -9, killed="timeout"), RankExit(1, -9, killed="timeout")]
    out = summarize(plan, _launched(recs, exits))
    assert out.status == Status.FAIL and "all_reduce (fp32, 4 elements) wrong on rank 0" in out.message
    assert "hung in broadcast" in out.message


def test_log_parsing_finds_the_reason_and_the_stuck_frame() -> None:
    tb = ["Traceback (most recent call last):", 'File "x.py", line 3, in f', "torch.distributed.DistBackendError: boom"]
    assert last_line(tb) == "torch.distributed.DistBackendError: boom"
    segv = ["Fatal Python error: Segmentation fault", "", "Current thread 0x1 (most recent call first):",
            'File "w.py", line 9 in all_gather', 'File "w.py", line 99 in main']
    assert last_line([ln for ln in segv if ln]) == "Fatal Python error: Segmentation fault"
    dump = ["Thread 0x2 (most recent call first):", 'File "threading.py", line 1 in wait',
            'File "threading.py", line 2 in run',
            "Thread 0x1 (most recent call first):", 'File "t.py", line 55 in all_to_all',
            'File "w.py", line 120 in run_case', 'File "w.py", line 200 in main', 'File "w.py", line 210 in <module>']
    assert stuck_frame(dump) == 'File "t.py", line 55 in all_to_all'
    assert stuck_frame(["no dump here"]) == ""
    assert last_line([]) == ""


def test_import_root_is_the_sys_path_entry() -> None:
    assert import_root(ME) == str(REPO)
    assert import_root("adaptcheck.steps.frameworks") == str(REPO)


# --- real 2-rank gloo runs ----------------------------------------------------------------

def test_two_gloo_ranks_pass_every_op_exactly_with_the_defaults(tmp_path: Path) -> None:
    start = time.monotonic()
    out = CollectivesCheck().run(make_ctx(tmp_path), CollectivesParams())
    took = time.monotonic() - start
    assert isinstance(out, Outcome)
    assert out.status == Status.PASS, out.message
    assert out.metrics["world_size"] == 2 and out.metrics["library"] == "gloo"
    assert all(f"{op}_s" in out.metrics for op in OPS)
    table = out.details["table"]
    assert len(table) == 5 * 3 * 3 and {r["status"] for r in table} == {"ok"}
    assert {r["dtype"] for r in table} == {"fp32", "bf16", "int32"}
    assert [r["exit"] for r in out.details["ranks"]] == ["exited with code 0"] * 2
    assert out.details["broadcast_src"] == 1
    assert set(out.details["torch_apis"]) == set(OPS)
    assert_no_rank_left(out)
    assert took < 120


def test_one_wrong_op_fails_that_op_only(tmp_path: Path) -> None:
    out = run_check(tmp_path, impl=f"{ME}:DropLastRankAllReduce")
    assert out.status == Status.FAIL
    assert out.message.startswith("all_reduce (fp32, 1 elements) wrong on ranks 0, 1")
    rows = out.details["table"]
    assert {r["status"] for r in rows if r["op"] == "all_reduce"} == {"mismatch"}
    assert {r["status"] for r in rows if r["op"] != "all_reduce"} == {"ok"}
    r = rows_by(out)[("all_reduce", "int32", 1031)]["ranks"][0]
    assert r["mismatches"] == 1031 and r["first_index"] == 0
    assert out.details["impl"] == f"{ME}:DropLastRankAllReduce"
    assert_no_rank_left(out)


def test_a_defect_in_each_op_is_caught_on_the_rank_it_hurts(tmp_path: Path) -> None:
    out = run_check(tmp_path, impl=f"{ME}:OneDefectPerOp", elements=[1031], dtypes=["fp32"])
    assert out.status == Status.FAIL
    rows = {r["op"]: r for r in out.details["table"]}
    assert {op: r["status"] for op, r in rows.items()} == dict.fromkeys(OPS, "mismatch")

    def wrong_ranks(op: str) -> set[int]:
        return {int(k) for k, v in rows[op]["ranks"].items() if v.get("mismatches")}

    assert wrong_ranks("all_reduce") == {0, 1}
    assert wrong_ranks("all_gather") == {0, 1}
    assert wrong_ranks("reduce_scatter") == {0, 1}
    assert wrong_ranks("all_to_all") == {0, 1}
    # Rooted at 0 instead of 1: rank 1 receives rank 0's data, rank 0 keeps its own.
    assert wrong_ranks("broadcast") == {0, 1}
    assert rows["broadcast"]["ranks"][1]["mismatches"] == 1031


def test_the_correct_implementation_passes_through_the_impl_hook_too(tmp_path: Path) -> None:
    out = run_check(tmp_path, impl="adaptcheck.collectives.worker:TorchCollectives",
                    ops=["all_to_all", "broadcast"])
    assert out.status == Status.PASS, out.message


def test_a_hung_rank_is_an_error_within_the_deadline_and_no_rank_is_left(tmp_path: Path) -> None:
    start = time.monotonic()
    out = run_check(tmp_path, impl=f"{ME}:HangingAllToAll", ops=["all_reduce", "all_to_all"], elements=[7],
                    dtypes=["fp32"], timeout_s=10)
    took = time.monotonic() - start
    assert out.status == Status.ERROR, out.message
    assert "hung in all_to_all (fp32, 7 elements)" in out.message
    assert took < 10 + 8
    ranks = {r["rank"]: r for r in out.details["ranks"]}
    assert ranks[1]["killed"] == "timeout" and ranks[1]["exit"] == "killed by SIGKILL"
    assert "test_collectives.py" in ranks[1]["stuck_at"] and ranks[1]["stuck_at"].endswith("in all_to_all")
    assert rows_by(out)[("all_reduce", "fp32", 7)]["status"] == "ok"  # what finished before the hang is kept
    assert_no_rank_left(out)


@pytest.mark.parametrize(("impl", "reason", "last"), [
    ("ExitingAllGather", "rank 1 exited with code 7 in all_gather (fp32, 7 elements)", None),
    ("SegfaultingAllGather", "rank 1 killed by SIGSEGV in all_gather (fp32, 7 elements)",
     "Fatal Python error: Segmentation fault"),
])
def test_a_crashed_rank_is_an_error_with_the_reason(tmp_path: Path, impl: str, reason: str, last: str | None) -> None:
    start = time.monotonic()
    out = run_check(tmp_path, impl=f"{ME}:{impl}", ops=["all_gather", "broadcast"], elements=[7], dtypes=["fp32"],
                    timeout_s=60, crash_grace_s=3)
    assert time.monotonic() - start < 30  # the peer's death ends the run, not the 60 s deadline
    assert out.status == Status.ERROR, out.message
    assert out.message.startswith(reason), out.message
    if last:
        assert f"last line: {last}" in out.message
    assert rows_by(out)[("all_gather", "fp32", 7)]["status"] == "incomplete"
    assert_no_rank_left(out)


def test_unsupported_op_is_reported_on_cpu_and_failed_when_asked(tmp_path: Path) -> None:
    ops = ["all_reduce", "reduce_scatter"]
    out = run_check(tmp_path / "a", impl=f"{ME}:NoReduceScatter", ops=ops, elements=[5], dtypes=["fp32"])
    assert out.status == Status.PASS, out.message
    assert "not supported by gloo (reported, not failed): reduce_scatter/fp32" in out.message
    row = rows_by(out)[("reduce_scatter", "fp32", 5)]
    assert row["status"] == "unsupported" and "does not support" in row["ranks"][0]["error"]
    strict = run_check(tmp_path / "b", impl=f"{ME}:NoReduceScatter", ops=ops, elements=[5], dtypes=["fp32"],
                       on_unsupported="fail")
    assert strict.status == Status.FAIL and "not supported by gloo: reduce_scatter/fp32" in strict.message


def test_an_op_that_raises_fails_the_check(tmp_path: Path) -> None:
    out = run_check(tmp_path, impl=f"{ME}:BrokenBroadcast", ops=["broadcast"], elements=[5], dtypes=["fp32"])
    assert out.status == Status.FAIL
    assert "broadcast (fp32, 5 elements) raised on rank 0: RuntimeError: NCCL error" in out.message


def test_accelerator_path_one_process_per_device(tmp_path: Path) -> None:
    out = run_check(tmp_path, TwoDeviceCpu(), device_count=2, ops=["all_gather", "reduce_scatter"], elements=[3])
    assert out.status == Status.PASS, out.message
    assert out.metrics["world_size"] == 2 and out.details["on_unsupported"] == "fail"
    assert [r["device"] for r in out.details["ranks"]] == ["cpu", "cpu"]


def test_an_unloadable_impl_is_an_error_before_any_rank_starts(tmp_path: Path) -> None:
    out = run_check(tmp_path, impl="no_such_module_x:Thing")
    assert out.status == Status.ERROR and "cannot load no_such_module_x:Thing" in out.message
    assert not list(tmp_path.glob("collectives-*"))


def test_ranks_die_with_a_sigkilled_launcher(tmp_path: Path) -> None:
    """The ladder runner SIGKILLs a check that overruns its limit: the ranks must go with it."""
    script = (
        "import sys; from pathlib import Path\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        f"from {ME} import run_check\n"
        f"run_check(Path({str(tmp_path)!r}), impl='{ME}:HangingAllToAll', ops=['all_to_all'], elements=[3],"
        " dtypes=['fp32'], timeout_s=300)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        pids: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(pids) < 2:
            time.sleep(0.2)
            pids = []
            for f in tmp_path.glob("collectives-*/rank*.jsonl"):
                for line in f.read_text().splitlines():
                    rec = json.loads(line) if line.strip().endswith("}") else {}
                    if rec.get("event") == "begin":
                        pids.append(int(json.loads(f.read_text().splitlines()[0])["pid"]))
                        break
        assert len(pids) == 2, "the ranks never reached all_to_all"
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    survivors = [p for p in pids if _alive(p)]
    for pid in survivors:  # a failing run must not leave its hung ranks behind either
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "ranks outlived their SIGKILLed launcher"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and "collectives.worker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


# --- the CLI end to end -------------------------------------------------------------------

@pytest.mark.slow
def test_cli_runs_the_collectives_check_as_step_4(tmp_path: Path, write_ladder: Callable[..., Path]) -> None:
    ladder = write_ladder([{"id": "framework.collectives", "step": 4, "kind": "framework.collectives",
                            "params": {"elements": [1031], "dtypes": ["fp32", "int32"]}}])
    out_dir = tmp_path / "run"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(out_dir)], cwd=REPO)
    assert done.returncode == 0, done.stderr
    data = json.loads((out_dir / "results.json").read_text())
    (check,) = [c for c in data["checks"] if c["id"] == "framework.collectives"]
    assert check["step"] == 4 and check["status"] == "pass", check["message"]
    assert check["metrics"]["world_size"] == 2 and check["metrics"]["library"] == "gloo"
    assert len(check["details"]["table"]) == 5 * 2
    assert Path(check["details"]["logs_dir"]).parent == out_dir
