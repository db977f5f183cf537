"""Does adaptcheck's timing harness add anything? Same GEMM, two timers, one verdict.

For each GEMM shape and dtype, the same ``torch.matmul(a, b, out=c)`` on the same tensors is
timed by

* adaptcheck: :func:`adaptcheck.perf.timing.time_callable` (what ``perf.gemm`` reports), and
* a careful standalone measurement: ``torch.utils.benchmark.Timer`` with the statement
  itself (no lambda, no adaptcheck code), ``num_threads`` set to the threads torch uses
  (``Timer`` defaults to ONE thread: leaving it would compare different things), and
  ``blocked_autorange`` — blocks of calls sized by torch, median of the per-call times; on
  accelerators ``Timer`` synchronizes the device around each block.

The machine's load drifts (other processes, clocks, thermal state), so the two are measured
in interleaved rounds — A then B, then B then A, … — each round giving one median per
side. Each side's figure is the median of its rounds' medians (a round that a burst of load
elsewhere hit is outvoted), and the difference judged is between the two figures. The
median over rounds of the paired ratio A/B − 1 is printed beside it as a diagnostic (the
two halves of a round ran back to back). The script prints both figures, every round, and
the differences per shape, and exits 1 when a figure's difference exceeds ``--tolerance``
(default 3 %). On a shared machine, more rounds help.

    python benchmarks/harness_vs_torch_benchmark.py
    python benchmarks/harness_vs_torch_benchmark.py --shapes 2048x4096x4096:bf16 --rounds 9
    python benchmarks/harness_vs_torch_benchmark.py --device cuda --shapes 8192x8192x8192:bf16
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import TextIO

import torch
import torch.utils.benchmark as tbench

from adaptcheck.backends.base import Backend
from adaptcheck.backends.registry import select_backend
from adaptcheck.base.dtypes import is_fnuz, torch_dtype
from adaptcheck.perf.micro import gemm_flops
from adaptcheck.perf.timing import time_callable, timer_name

DEFAULT_SHAPES = "1024x4096x4096:bf16,512x2048x2048:fp32"


@dataclass
class Comparison:
    shape: str
    adaptcheck_s: float
    torch_s: float
    rounds_a: list[float]
    rounds_b: list[float]

    @property
    def rel_diff(self) -> float:
        """adaptcheck's figure / torch's figure − 1 (the judged difference)."""
        return self.adaptcheck_s / self.torch_s - 1.0

    @property
    def paired_diff(self) -> float:
        """Median over rounds of adaptcheck / torch − 1 (diagnostic)."""
        return statistics.median(a / b for a, b in zip(self.rounds_a, self.rounds_b, strict=False)) - 1.0


def parse_shapes(text: str) -> list[tuple[int, int, int, str]]:
    out = []
    for item in text.split(","):
        dims, _, dtype = item.strip().partition(":")
        m, n, k = (int(x) for x in dims.split("x"))
        out.append((m, n, k, dtype or "bf16"))
    return out


def compare(backend: Backend, index: int, m: int, n: int, k: int, dtype: str, rounds: int,
            budget_s: float) -> Comparison:
    device = backend.torch_device(index)
    td = torch_dtype(dtype, fnuz=is_fnuz(backend.fp8_flavour))
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn((m, k), generator=gen).to(device=device, dtype=td)
    b = torch.randn((k, n), generator=gen).to(device=device, dtype=td)
    c = torch.empty((m, n), device=device, dtype=td)
    timer = tbench.Timer(stmt="torch.matmul(a, b, out=c)", globals={"torch": torch, "a": a, "b": b, "c": c},
                         num_threads=torch.get_num_threads(), label="gemm", sub_label=f"{m}x{n}x{k} {dtype}")

    def ours() -> float:
        return time_callable(lambda: torch.matmul(a, b, out=c), backend, index, warmup=2, min_reps=5,
                             max_reps=1000, budget_s=budget_s).median

    def theirs() -> float:
        return float(timer.blocked_autorange(min_run_time=budget_s).median)

    theirs()  # both sides run after the same warm-up of kernels and caches
    ra: list[float] = []
    rb: list[float] = []
    for r in range(rounds):
        if r % 2 == 0:
            ra.append(ours())
            rb.append(theirs())
        else:
            rb.append(theirs())
            ra.append(ours())
    return Comparison(f"{m}x{n}x{k} {dtype}", statistics.median(ra), statistics.median(rb), ra, rb)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxNxK:dtype[,…] (dtype: fp32, bf16, fp16)")
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds per shape (odd: a clean median)")
    p.add_argument("--budget", type=float, default=0.5, help="seconds each side measures per round")
    p.add_argument("--tolerance", type=float, default=0.03, help="largest allowed |relative difference|")
    p.add_argument("--device", default=None, help="backend name (default: as 'adaptcheck run' selects)")
    p.add_argument("--device-index", type=int, default=0)
    args = p.parse_args(argv)
    backend, _ = select_backend(args.device)
    idx = args.device_index
    print(f"device: {backend.device_name(idx)} ({backend.name}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; adaptcheck timer: {timer_name(backend)}; "
          f"{args.rounds} interleaved rounds of {args.budget:g} s per side", file=out)
    print(f"{'shape':<22} {'adaptcheck':>12} {'torch.utils.benchmark':>22} {'diff':>8} {'paired':>8}   "
          "rounds (ms, adaptcheck/torch)", file=out)
    worst = 0.0
    for m, n, k, dtype in parse_shapes(args.shapes):
        cmp = compare(backend, idx, m, n, k, dtype, args.rounds, args.budget)
        worst = max(worst, abs(cmp.rel_diff))
        tf = gemm_flops(m, n, k) / 1e12
        rounds = " ".join(f"{a * 1e3:.2f}/{b * 1e3:.2f}" for a, b in zip(cmp.rounds_a, cmp.rounds_b, strict=False))
        print(f"{cmp.shape:<22} {cmp.adaptcheck_s * 1e3:9.3f} ms {cmp.torch_s * 1e3:19.3f} ms "
              f"{100 * cmp.rel_diff:+7.2f}% {100 * cmp.paired_diff:+7.2f}%   {rounds}", file=out)
        print(f"{'':<22} {tf / cmp.adaptcheck_s:8.3f} TF/s {tf / cmp.torch_s:18.3f} TF/s", file=out)
    verdict = "OK" if worst <= args.tolerance else "FAIL"
    print(f"{verdict}: largest |difference| {100 * worst:.2f}% (tolerance {100 * args.tolerance:g}%)", file=out)
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
