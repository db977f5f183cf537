"""Where the load generator's own run-to-run variance comes from, and what the heap freeze removes.

Drives one real vLLM server (started here on 127.0.0.1, or ``--url``) with adaptcheck's load
generator in alternating rounds: one run with the heap freeze of
:mod:`adaptcheck.perf.gcguard` off, one with it on (order alternating, so drift of the
machine hits both alike). This process imports torch and transformers and keeps every run's
records, like the serving check's worker, so its heap is the size the worker's is. For every
run it records, beside the figures (median TTFT, median TPOT, output tok/s):

- the garbage collector's pauses during the run (``gc.callbacks``): count per generation,
  the full (generation-2) collections, their total and longest pause;
- the event loop's lag (mean, p99) and the client's CPU, from the run's ClientMonitor;
- the client queue time p99 (send − scheduled: a slot that could not send at once).

Then, per mode, the run-to-run dispersion of each figure: sd of ln(x) (≈ CV) and
(max − min) / median. Timings vary with the machine; on a shared 2-core machine read the
GC columns (which do not depend on the load) before the dispersion (which does).

    python benchmarks/client_noise.py                           # 20 M-parameter Llama, 8 rounds
    python benchmarks/client_noise.py --model tiny-llama --rounds 12
    python benchmarks/client_noise.py --url http://127.0.0.1:8000/v1 --served-name M --tokenizer PATH
"""

from __future__ import annotations

import argparse
import gc
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare_vllm_bench's bigger model

from adaptcheck.perf.arrival import Arrival
from adaptcheck.perf.loadgen import LoadGenerator, RunConfig, RunResult
from adaptcheck.perf.workload import PromptFactory, Shape, Workload

FIGURES = (("median TTFT ms", "ttft"), ("median TPOT ms", "tpot"), ("output tok/s", "tps"))


class GcPauses:
    """Every collection between :meth:`start` and :meth:`stop`: (generation, seconds)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t = 0.0
        self._on = False

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if not self._on:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t))

    def start(self) -> None:
        self.pauses.clear()
        self._on = True
        if self._cb not in gc.callbacks:
            gc.callbacks.append(self._cb)

    def stop(self) -> dict[str, float]:
        self._on = False
        full = [s for g, s in self.pauses if g == 2]
        return {"collections": len(self.pauses), "full": len(full), "full_ms": 1e3 * sum(full),
                "max_ms": 1e3 * max((s for _, s in self.pauses), default=0.0),
                "total_ms": 1e3 * sum(s for _, s in self.pauses)}


def measured(value: float | None, what: str) -> float:
    """A figure the run must have produced (every request failed or none completed: stop)."""
    if value is None:
        raise SystemExit(f"the run has no {what}")
    return value


def one_run(gen: LoadGenerator, args: argparse.Namespace, run: int, freeze: bool, kept: list[RunResult],
            pauses: GcPauses) -> dict[str, float]:
    gen.freeze_gc = freeze
    cfg = RunConfig(arrival=Arrival.CONCURRENCY, level=args.concurrency, num_requests=args.num_prompts,
                    warmup_requests=args.warmups, request_timeout_s=600, arrival_seed=run, sample_server=False)
    pauses.start()
    result = gen.run(cfg, level_index=0, run=run)
    gcs = pauses.stop()
    kept.append(result)  # like the worker: every run's records stay alive until the check ends
    s = result.run_summary()
    if s.failed:
        raise SystemExit(f"{s.failed} requests failed: {s.errors}")
    assert result.client is not None
    return {"ttft": measured(s.ttft_ms.median if s.ttft_ms else None, "median TTFT"),
            "tpot": measured(s.tpot_ms.median if s.tpot_ms else None, "median TPOT"),
            "tps": measured(s.output_throughput, "output throughput"),
            "lag_mean": result.client.lag_mean_ms(), "lag_p99": result.client.lag_p99_ms(),
            "cpu": result.client.cpu_percent,
            "queue_p99": measured(s.queue_ms.p99 if s.queue_ms else None, "queue p99"), **gcs}


def dispersion(values: list[float]) -> tuple[float, float]:
    """(sd of ln x, (max − min) / median)."""
    logs = [math.log(v) for v in values]
    sd = statistics.stdev(logs) if len(logs) > 1 else 0.0
    return sd, (max(values) - min(values)) / statistics.median(values)


def report(rows: dict[bool, list[dict[str, float]]]) -> None:
    print(f"\n{'mode':<12}{'runs':>5}{'GC/run':>8}{'full GCs':>10}{'full ms':>9}{'max pause':>11}"
          f"{'lag mean':>10}{'lag p99':>9}{'cpu %':>7}{'queue p99':>11}")
    for freeze, runs in rows.items():
        def med(key: str, rs: list[dict[str, float]] = runs) -> float:
            return float(statistics.median(r[key] for r in rs))
        print(f"{'freeze on' if freeze else 'freeze off':<12}{len(runs):>5}{med('collections'):>8.0f}"
              f"{sum(r['full'] for r in runs):>10}{sum(r['full_ms'] for r in runs):>9.0f}"
              f"{max(r['max_ms'] for r in runs):>9.1f}ms{med('lag_mean'):>8.2f}ms{med('lag_p99'):>7.2f}ms"
              f"{med('cpu'):>7.1f}{med('queue_p99'):>9.2f}ms")
    print(f"\n{'figure':<16}{'mode':<12}{'median':>9}{'sd ln (≈CV)':>13}{'(max-min)/med':>15}")
    for label, key in FIGURES:
        for freeze, runs in rows.items():
            values = [r[key] for r in runs]
            sd, spread = dispersion(values)
            print(f"{label:<16}{'freeze on' if freeze else 'freeze off':<12}{statistics.median(values):>9.2f}"
                  f"{sd:>13.1%}{spread:>15.1%}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an already running vLLM server (http://HOST:PORT/v1); default: start one here")
    p.add_argument("--served-name", default="tiny-llama", help="model name the server answers to (with --url)")
    p.add_argument("--tokenizer", help="tokenizer folder (with --url; default: the model started here)")
    p.add_argument("--model", default="bigger", choices=["tiny-llama", "bigger"])
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--warmups", type=int, default=4)
    p.add_argument("--rounds", type=int, default=8, help="rounds of one run per mode (order alternating)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    import torch  # noqa: F401 - the worker's heap has it
    from transformers import AutoTokenizer

    from adaptcheck.frameworks.server import ManagedServer, ServerSpec
    from adaptcheck.frameworks.synthetic import ensure_model

    work = Path(tempfile.mkdtemp(prefix="client-noise-"))
    server: ManagedServer | None = None
    try:
        if args.url:
            url, served, tok_path = args.url, args.served_name, args.tokenizer
            if not tok_path:
                raise SystemExit("--url needs --tokenizer (the served model's tokenizer folder)")
        else:
            from compare_vllm_bench import bigger_model

            model = ensure_model("tiny-llama")
            if args.model == "bigger":
                model = bigger_model(model, model.parent.parent / "benchmark-models")
            served, tok_path = args.model, str(model)
            server = ManagedServer(ServerSpec("vllm", model, dtype=args.dtype, enforce_eager=True, max_model_len=2048,
                                              served_model_name=served, enable_prefix_caching=False), work)
            t = time.perf_counter()
            server.start()
            url = server.base_url
            print(f"vllm serve ({args.model}, {args.dtype}) ready in {time.perf_counter() - t:.0f} s at {url}")
        tokenizer = AutoTokenizer.from_pretrained(tok_path)
        workload = Workload([Shape(args.input_len, args.output_len)], PromptFactory(tokenizer), seed=12345)
        gen = LoadGenerator(url, workload, model=served, tokenizer=tokenizer)
        print(f"heap: {len(gc.get_objects())} tracked objects; workload {args.num_prompts} prompts x "
              f"{args.input_len} in / {args.output_len} out, concurrency {args.concurrency}, {args.rounds} rounds")
        rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        kept: list[RunResult] = []
        pauses = GcPauses()
        run = 0
        for r in range(args.rounds):
            for freeze in ((False, True) if r % 2 == 0 else (True, False)):
                got = one_run(gen, args, run, freeze, kept, pauses)
                run += 1
                rows[freeze].append(got)
                print(f"  round {r + 1} freeze {'on ' if freeze else 'off'} ttft={got['ttft']:.2f} "
                      f"tpot={got['tpot']:.2f} tok/s={got['tps']:.1f} GCs={got['collections']} "
                      f"full={got['full']} ({got['full_ms']:.0f} ms) lag p99={got['lag_p99']:.2f} ms", flush=True)
        report(rows)
        return 0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
