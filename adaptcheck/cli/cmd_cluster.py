"""``adaptcheck cluster``: checks that span several machines — ``cluster collectives``, one rank of
a multi-node job run under torchrun on every node (rank 0 prints the tables and writes
``--out/collectives-multinode.json``; the others print only a failure's reason). Usage and exit
codes: docs/cluster.md ("Collectives across nodes with torchrun").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from adaptcheck.base.errors import UsageError
from adaptcheck.base.paths import default_reports_dir
from adaptcheck.cli.output import STATUS_STYLE, Format, Output
from adaptcheck.cluster.models import REPORT_NAME, MultinodeCollectives
from adaptcheck.cluster.rank import (
    ClusterCollectivesOptions,
    run_cluster_collectives,
)

app = typer.Typer(name="cluster", help="Checks across several machines (launch under torchrun; see docs/cluster.md).",
                  no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})

CASE_STYLE = {"ok": "green", "mismatch": "red", "raised": "red", "incomplete": "bold red", "unsupported": "yellow",
              "skipped": "dim"}


def _csv(text: str | None, option: str) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{option} needs at least one value, comma-separated")
    return items


def _numbers(text: str | None, option: str, kind: type[int | float]) -> list[Any] | None:
    items = _csv(text, option)
    try:
        return None if items is None else [kind(i) for i in items]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated {kind.__name__}s") from None


def _render(out: Output, report: MultinodeCollectives) -> None:
    out.table(f"{report.world_size} ranks on {report.nnodes} nodes ({report.dist_backend}, master {report.master})",
              ["node", "host", "ranks", "devices"],
              [[n.node, n.hostname, ", ".join(map(str, n.ranks)), ", ".join(n.devices)] for n in report.nodes])
    rows = []
    for c in report.cases:
        evidence = "; ".join(
            f"rank {r}: " + (ev.error or f"{ev.mismatches} wrong, first [{ev.first_index}] = {ev.got} (expected "
                                         f"{ev.expected})") for r, ev in c.ranks.items())
        if c.missing_ranks:
            evidence = (evidence + "; " if evidence else "") + f"no result from ranks {c.missing_ranks}"
        rows.append([c.op, c.dtype, c.elements, c.status, f"{c.time_s * 1e3:.2f}" if c.time_s is not None else "",
                     evidence])
    if rows:
        out.table("exact collectives", ["op", "dtype", "elements/rank", "status", "ms", "evidence"], rows,
                  styles={3: CASE_STYLE})
    if report.bench:
        out.table("bandwidth (nccl-tests definitions; t = slowest rank's median)",
                  ["op", "dtype", "size", "algbw GB/s", "busbw GB/s", "slowest rank", "note"],
                  [[b.op, b.dtype, f"{b.bytes / (1 << 20):g} MiB",
                    f"{b.algbw_gbps:.3f}" if b.algbw_gbps is not None else "",
                    f"{b.busbw_gbps:.3f}" if b.busbw_gbps is not None else "",
                    "" if b.slowest_rank is None else str(b.slowest_rank), b.error or ""] for b in report.bench])
    if report.slowest_rank is not None:
        s = report.slowest_rank
        out.info(f"slowest rank: {s.rank} on {s.node} ({s.hostname}), {s.ratio:.2f}× the fastest ({s.basis})")
    if not report.exit_code:  # a failure's reason is the error line every rank prints
        out.info(f"{report.status}: {report.message}", style=STATUS_STYLE.get(report.status))


def collectives(
    out_dir: Path | None = typer.Option(None, "--out", "-o", help="Folder for collectives-multinode.json (rank 0's node; default: reports/cluster-collectives)."),
    device: str | None = typer.Option(None, "--device", "-d", help="Backend (see 'adaptcheck backends'); default: the one available accelerator, else cpu."),
    ops: str | None = typer.Option(None, "--ops", help="Collectives to check, comma-separated (default: all_reduce,all_gather,reduce_scatter,all_to_all,broadcast)."),
    dtypes: str | None = typer.Option(None, "--dtypes", help="Dtypes to check exactly (default: fp32,bf16,int32)."),
    elements: str | None = typer.Option(None, "--elements", help="Per-rank chunk sizes in elements (default: 1,1031,1048583)."),
    on_unsupported: str | None = typer.Option(None, "--on-unsupported", help="fail or report an op the library lacks (default: fail on accelerators, report on cpu)."),
    bench: bool = typer.Option(False, "--bench", help="Also time algbw/busbw (nccl-tests definitions)."),
    bench_ops: str | None = typer.Option(None, "--bench-ops", help="Collectives to time (default: all_reduce,all_gather,reduce_scatter,all_to_all)."),
    bench_dtypes: str | None = typer.Option(None, "--bench-dtypes", help="Dtypes to time (default: bf16)."),
    bench_sizes: str | None = typer.Option(None, "--bench-sizes-mib", help="Full-tensor sizes in MiB (default: 1,256 on accelerators, 1,32 on cpu)."),
    bench_budget: float = typer.Option(0.5, "--bench-budget-s", help="Timed seconds per bench case."),
    timeout: float = typer.Option(120, "--timeout", help="Seconds one collective may take before a rank gives up on its peers (exit 7)."),
    join_timeout: float = typer.Option(300, "--join-timeout", help="Seconds to wait for every rank to join (exit 6)."),
    impl: str | None = typer.Option(None, "--impl", help="'module:object' replacing torch.distributed (tests, vendor overrides)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (human, stderr) or json/yaml (the report on stdout, rank 0)."),
) -> None:
    """Exact collectives (and optionally busbw) across nodes: one rank, launched on every node by torchrun."""
    raw: dict[str, object] = {  # the command line, validated into the options below
        "device": device, "out": out_dir or default_reports_dir() / "cluster-collectives",
        "ops": _csv(ops, "--ops"), "dtypes": _csv(dtypes, "--dtypes"), "elements": _numbers(elements, "--elements", int),
        "on_unsupported": on_unsupported, "bench": bench, "bench_ops": _csv(bench_ops, "--bench-ops"),
        "bench_dtypes": _csv(bench_dtypes, "--bench-dtypes"),
        "bench_sizes_mib": _numbers(bench_sizes, "--bench-sizes-mib", float), "bench_budget_s": bench_budget,
        "timeout_s": timeout, "join_timeout_s": join_timeout, "impl": impl}
    try:
        options = ClusterCollectivesOptions.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None
    report = run_cluster_collectives(options)
    leader = os.environ.get("RANK") == "0"  # the library checked RANK is set
    out = Output(fmt, quiet=not leader)
    _render(out, report)
    if leader:
        out.info(f"report: {options.out / REPORT_NAME}")
        out.data(report.model_dump(mode="json"))
    if report.exit_code:
        out.error(report.message)
        raise typer.Exit(report.exit_code)


app.command("collectives")(collectives)
